#!/usr/bin/env python3
"""HPC AI500 V3.0, bagging-based scalable HPC AI benchmark.

    mpirun -np 64 python hpcai500.py HPCAI500.dat
    python hpcai500.py --check HPCAI500.dat
"""
import os
import sys

# Before TensorFlow is imported anywhere: the Keras 2 API (tf-keras) is the one Horovod's
# DistributedGradientTape and broadcast_variables work with; quiet TF's C++ start-up log.
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

if __name__ == "__main__":
    # Before MPI starts: where PyPI Open MPI's PMIx finds its files, and the security
    # mode it has, when srun (not mpirun) started this rank; see harness/launcher.py.
    from harness import launcher
    launcher.prepare()
    from harness import signals
    signals.block()  # before MPI and TensorFlow start threads: see harness/signals.py
    from harness.driver import main
    sys.exit(main())
