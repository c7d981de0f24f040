#!/usr/bin/env bash
# Turn ULFM (Open MPI's fault tolerance) on for every plain `mpirun` of the Open MPI
# installed in a prefix: a rank that dies then raises MPI_ERR_PROC_FAILED in its partners
# instead of PRTE killing the job (harness/elastic.py; docs/running.md, "When a rank dies").
# Usage: scripts/ulfm.sh PREFIX/etc. Idempotent: a parameter already set is rewritten.
#   openmpi-mca-params.conf: mpi_ft_enable = 1           (the ranks: ULFM's error handling)
#   prte-mca-params.conf:    state_base_recoverable = 1  (mpirun: keep the job when a rank dies)
#                            state_base_notify_errors = 1 (and tell the survivors; without it they hang)
# These are what `mpirun --with-ft ulfm` sets, found with `prte_info --all`. ULFM's heartbeat
# detector (mpi_ft_detector) is not set here: every MPI program of the prefix reads these files,
# and Open MPI 5.0.8's detector hangs MPI_Finalize; the harness arms it in its own ranks
# (harness/elastic.py, detector_params).
set -euo pipefail
etc=${1:?usage: scripts/ulfm.sh PREFIX/etc}
mkdir -p "$etc"
set_param() {   # FILE NAME VALUE
    touch "$1"
    sed -i "/^[[:space:]]*$2[[:space:]]*=/d" "$1"
    echo "$2 = $3" >> "$1"
}
set_param "$etc/openmpi-mca-params.conf" mpi_ft_enable 1
set_param "$etc/prte-mca-params.conf" state_base_recoverable 1
set_param "$etc/prte-mca-params.conf" state_base_notify_errors 1
