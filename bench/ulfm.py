"""What turning ULFM on costs a run that loses nothing (issue 46, item 6's 2 % goal), and
what its heartbeat detector adds (issue 70).

    .venv/bin/python bench/ulfm.py [--compare off ulfm detector] [--runs 3] [--epochs 2]

The venv's Open MPI 5.0.8 carries ULFM ("FT MPI support: yes"). A plain `mpirun` turns it
on from three MCA parameters, in the environment or in the venv's own parameter files
(found with `prte_info --all`; issue 46's note): PRTE's `state_base_recoverable` and
`state_base_notify_errors` (the job outlives a dead rank, and its survivors are told)
and Open MPI's `mpi_ft_enable` (the MPI library detects failures and returns
MPI_ERR_PROC_FAILED instead of aborting). Without `notify_errors` the survivors are never
told and hang. ULFM's heartbeat detector, which finds a silent rank, is armed by the
harness in its own ranks (HPCAI500_FT_DETECTOR=30: a heartbeat every 3 s, sent
as each rank's pulse thread drives MPI's progress twice a period; harness/elastic.py). This
bench times the same test under each setting compared, alternated: ResNet-50 (ic, the real
model) at 64 x 64 px, M = 1, P = 2 on 2 ranks (Horovod's all-reduce over MPI, where ULFM's
checks sit), B 32, synthetic data. ULFM's settings are in the environment, which outranks
the venv's files (make venv turns ULFM on there). Medians of the alternated runs, and the
ratio of each setting to the first within each round (less sensitive to the machine's drift).
"""
import argparse

import common

B, SIDE, SAMPLES, GOAL = 32, 64, 256, 0.98
ULFM = {"PRTE_MCA_state_base_recoverable": "1", "PRTE_MCA_state_base_notify_errors": "1",
        "OMPI_MCA_mpi_ft_enable": "1"}
SETTINGS = {
    # `abort`, since `drop` needs ULFM; the detector needs ULFM too (the harness arms it only then)
    "off": {**{k: "0" for k in ULFM}, "HPCAI500_ON_FAULT": "abort"},
    "ulfm": {**ULFM, "HPCAI500_FT_DETECTOR": "0"},
    "detector": {**ULFM, "HPCAI500_FT_DETECTOR": "30"},
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--compare", nargs="+", choices=list(SETTINGS), default=list(SETTINGS),
                    help="the settings alternated; ratios are to the first (default: all three)")
    ap.add_argument("--runs", type=int, default=3, help="alternated rounds (default 3)")
    ap.add_argument("--epochs", type=int, default=2, help="epochs a run trains (default 2)")
    args = ap.parse_args()
    print(f"machine: {common.machine()}")
    dat = common.make_dat("ulfm", l7="ic", l8=f"synthetic:{SAMPLES}:{SIDE}", l9=1, l10=1, l11=2, l13=1, l14=B,
                          l15=args.epochs, l30=0, l31=0)
    common.run_harness(dat)     # writes the synthetic set's cache once, outside the comparison
    rows, flops = [], {what: [] for what in args.compare}
    for i in range(args.runs):
        for what in (args.compare if i % 2 == 0 else args.compare[::-1]):   # each order as often: no drift favoured
            (t,), load = common.quietest(lambda: common.run_harness(dat, env=SETTINGS[what]))
            flops[what].append(t["flops"])
            rows.append([i + 1, what, t["samples_trained"], f"{t['train_seconds']:.2f}", f"{t['flops'] / 1e12:.4f}",
                         f"{load:.2f}"])
    print(f"\nper run (ic = ResNet-50 at {SIDE} px, M=1, P=2, B={B}, {SAMPLES} synthetic samples, {args.epochs} epochs;"
          f" other load = cores used by other processes during the run):")
    print(common.table(["round", "what", "samples", "train s", "Tflops", "other load"], rows))
    base = args.compare[0]
    print("\nmedian Tflops: " + ", ".join(f"{w} {common.median(flops[w]) / 1e12:.4f}" for w in args.compare))
    for what in args.compare[1:]:
        ratio = common.median(flops[what]) / common.median(flops[base])
        paired = [a / b for a, b in zip(flops[what], flops[base])]
        print(f"{what}/{base} = {ratio:.3f} by medians (goal >= {GOAL}): {'MET' if ratio >= GOAL else 'NOT MET'};"
              f" per round {', '.join(f'{x:.3f}' for x in paired)}, median {common.median(paired):.3f}")


if __name__ == "__main__":
    main()
