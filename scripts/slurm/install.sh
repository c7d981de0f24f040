#!/bin/bash
# Debian's Slurm, MUNGE and PMIx, for trying scripts/slurm/hpcai500.sbatch without a real
# cluster: on this host (scripts/slurm/one-node.sh) or on the simulated cluster's nodes
# (scripts/cluster/cluster.py up --slurm). Installs only what is missing; root. .ci/run
# calls it so that CI runs the Slurm tests.
#
# Debian 12 ships Slurm 22.05 with its PMIx plugin (mpi_pmix_v4, which dlopens
# libpmix.so: hence libpmix-dev beside libpmix2) and MUNGE for authentication.
set -euo pipefail
PACKAGES=(slurm-wlm munge libpmix2 libpmix-dev)

[[ $(id -u) -eq 0 ]] || { echo "install.sh: run as root (apt-get)" >&2; exit 1; }
command -v apt-get >/dev/null || { echo "install.sh: no apt-get here: install Slurm, MUNGE and PMIx your way" >&2; exit 1; }
missing=()
for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
    echo "installing ${missing[*]}"
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}"
fi
