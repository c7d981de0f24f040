#!/usr/bin/env python3
"""HPC AI500 V3.0, bagging-based scalable HPC AI benchmark.

    mpirun -np 64 python hpcai500.py HPCAI500.dat
    python hpcai500.py --check HPCAI500.dat
"""
import os

if __name__ == "__main__":
    # Before MPI starts: where PyPI Open MPI's PMIx finds its files, and the security
    # mode it has, when srun (not mpirun) started this rank; see harness/launcher.py.
    from harness import launcher
    launcher.prepare()
    from harness import signals
    signals.block()  # before MPI, numpy's BLAS and TensorFlow start threads: see harness/signals.py
    # Before any framework is imported: what each needs set (its facts' ENVIRONMENT), where
    # the user has not set it (plain Python: the registry imports no framework; numpy, whose
    # BLAS threads must inherit the blocked signals, so after signals.block)
    from harness import frameworks
    for name, value in frameworks.environment().items():
        os.environ.setdefault(name, value)
    from harness.driver import end, main
    end(main())
