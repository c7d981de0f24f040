# bench/gpu_mpirun.sh, sourced by bench/gpu_check.sh: which mpirun starts the multi-rank steps.
# pick_mpirun PY: the mpirun beside the python (its venv's Open MPI, the MPI mpi4py was built
# against), else the first on PATH, else nothing. A site image's PATH mpirun of another MPI than
# mpi4py's starts N worlds of one rank each, so one_world checks the pick before any step uses it.
pick_mpirun() {
    local beside
    beside="$(dirname "$1")/mpirun"
    if [[ -x "$beside" ]]; then echo "$beside"; else command -v mpirun || true; fi
}
# one_world MPIRUN PY: exit 0 when MPIRUN starts PY as one world of 2 ranks (its rank 0 says so: two
# ranks printing at once interleave their lines).
one_world() {
    "$1" --oversubscribe -np 2 "$2" -c "from mpi4py import MPI; c = MPI.COMM_WORLD; \
assert c.size == 2, f'a world of {c.size}: this mpirun is not the MPI of mpi4py'; c.rank or print('one world of', c.size)"
}
