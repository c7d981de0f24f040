"""What turning ULFM on costs a run that loses nothing (issue 46, item 6's 2 % goal).

    .venv/bin/python bench/ulfm.py

The venv's Open MPI 5.0.8 carries ULFM ("FT MPI support: yes"). A plain `mpirun` turns it
on from three MCA parameters, in the environment or in the venv's own parameter files
(found with `prte_info --all`; issue 46's note): PRTE's `state_base_recoverable` and
`state_base_notify_errors` (the job outlives a dead rank, and its survivors are told)
and Open MPI's `mpi_ft_enable` (the MPI library detects failures and returns
MPI_ERR_PROC_FAILED instead of aborting). Without `notify_errors` the survivors are never
told and hang. This bench times the same test with and without them, alternated: ResNet-50
(ic, the real model) at 64 x 64 px, M = 1, P = 2 on 2 ranks (Horovod's all-reduce over
MPI, where ULFM's checks sit), B 32, synthetic data. Medians of the alternated runs, and
the ratio within each adjacent pair (less sensitive to the machine's drift).
"""
import common

RUNS, B, SIDE, SAMPLES, EPOCHS, GOAL = 3, 32, 64, 256, 2, 0.98
ULFM = {"PRTE_MCA_state_base_recoverable": "1", "PRTE_MCA_state_base_notify_errors": "1",
        "OMPI_MCA_mpi_ft_enable": "1"}
# off in the environment: it outranks the venv's parameter files, where make venv turns ULFM on
# (scripts/ulfm.sh); `abort`, since `drop` needs ULFM
OFF = {**{k: "0" for k in ULFM}, "HPCAI500_ON_FAULT": "abort"}


def main() -> None:
    print(f"machine: {common.machine()}")
    dat = common.make_dat("ulfm", l7="ic", l8=f"synthetic:{SAMPLES}:{SIDE}", l9=1, l10=1, l11=2, l13=1, l14=B,
                          l15=EPOCHS, l30=0, l31=0)
    common.run_harness(dat)     # writes the synthetic set's cache once, outside the comparison
    rows, flops = [], {"off": [], "on": []}
    for i in range(RUNS):
        for what, env in (("off", OFF), ("on", ULFM)):
            (t,), load = common.quietest(lambda: common.run_harness(dat, env=env))
            flops[what].append(t["flops"])
            rows.append([i + 1, f"ULFM {what}", t["samples_trained"], f"{t['train_seconds']:.2f}",
                         f"{t['flops'] / 1e12:.4f}", f"{load:.2f}"])
    print(f"\nper run (ic = ResNet-50 at {SIDE} px, M=1, P=2, B={B}, {SAMPLES} synthetic samples, {EPOCHS} epochs;"
          f" other load = cores used by other processes during the run):")
    print(common.table(["round", "what", "samples", "train s", "Tflops", "other load"], rows))
    off, on = common.median(flops["off"]), common.median(flops["on"])
    ratio = on / off
    print(f"\nmedian Tflops: off {off / 1e12:.4f}, on {on / 1e12:.4f}; on/off = {ratio:.3f}"
          f" (goal >= {GOAL}): {'MET' if ratio >= GOAL else 'NOT MET'}")
    paired = [a / b for a, b in zip(flops["on"], flops["off"])]
    print(f"per round on/off: {', '.join(f'{x:.3f}' for x in paired)}; median {common.median(paired):.3f}")


if __name__ == "__main__":
    main()
