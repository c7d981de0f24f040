"""`mpirun -np N python -m kernels.<kernel> ...`: the command-line path shared by the kernels.

Every rank pins its device, waits at a barrier (all kernels start together: ranks on one
node share its memory bus, power and cooling, and a roofline must see them loaded as in
training), runs the kernel, and sends its figures to rank 0, which prints one line per
rank and the aggregate. A rank's exception is gathered too, so no rank hangs in the
gather; rank 0 names the failed ranks and every failed rank exits 1.
"""
from __future__ import annotations

import argparse
import socket
import statistics
import sys

from kernels.device import PRECISIONS


def _rank() -> int:
    from mpi4py import MPI
    return MPI.COMM_WORLD.rank


class Parser(argparse.ArgumentParser):
    """argparse whose usage, help and errors are printed once (by rank 0), not once per
    rank; every rank exits (2 on an error), since every rank parses the same arguments."""

    def print_usage(self, file=None):
        if _rank() == 0:
            super().print_usage(file)

    def print_help(self, file=None):
        if _rank() == 0:
            super().print_help(file)

    def error(self, message):
        self.print_usage(sys.stderr)
        if _rank() == 0:
            print(f"{self.prog}: error: {message}", file=sys.stderr, flush=True)
        sys.exit(2)


def positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def parser(kernel: str, description: str, precision: bool = True) -> Parser:
    p = Parser(prog=f"python -m kernels.{kernel}", description=description)
    if precision:
        p.add_argument("--precision", choices=PRECISIONS, default="fp32",
                       help="fp32, fp16 or bf16 (default fp32)")
    p.add_argument("--repeats", type=positive, default=5, help="timed samples, median reported (default 5)")
    return p


def main(p: Parser, argv, kernel, title: str, size, unit: str, scale: float, key: str) -> int:
    """Parse, pin, run `kernel(args) -> dict` on every rank, print from rank 0.
    `size(result)` labels the problem size; `result[key] / scale` is the rate in `unit`."""
    args = p.parse_args(argv)          # before MPI work and TensorFlow: bad input exits fast
    from mpi4py import MPI
    from kernels import device
    world = MPI.COMM_WORLD
    node = world.Split_type(MPI.COMM_TYPE_SHARED, key=world.rank)
    result, error = None, None
    try:
        device.pin(node.rank, node.size)
    except Exception as e:             # noqa: BLE001 -- reported by rank 0, then exit 1
        error = f"{type(e).__name__}: {e}"
    world.Barrier()
    if error is None:
        try:
            result = kernel(args)
        except Exception as e:         # noqa: BLE001
            error = f"{type(e).__name__}: {e}"
    rows = world.gather((world.rank, socket.gethostname(), result, error), root=0)
    if world.rank == 0:
        report(rows, title(args) if callable(title) else title, size, unit, scale, key)
        return 1 if any(r[3] for r in rows) else 0
    return 1 if error else 0


def report(rows, title: str, size, unit: str, scale: float, key: str) -> None:
    """One line per rank (rank, host, device, size, median seconds, rate), then the aggregate."""
    print(title)
    table = [("rank", "host", "device", "size", "seconds", unit)]
    table += [(str(rank), host, r["device"], size(r), f"{r['seconds']:.4e}", f"{r[key] / scale:.4f}")
              for rank, host, r, error in rows if not error]
    width = [max(len(row[i]) for row in table) for i in range(6)]
    for row in table:                          # text columns left-aligned, numbers right-aligned
        print("  ".join(c.ljust(w) if i in (1, 2, 3) else c.rjust(w) for i, (c, w) in enumerate(zip(row, width))))
    for rank, host, _, error in rows:
        if error:
            print(f"{rank:>{width[0]}}  {host}  FAILED  {error}")
    rates = [r[key] / scale for _, _, r, error in rows if not error]
    line = f"aggregate  {len(rates)} rank(s)"
    if rates:
        line += (f"  sum {sum(rates):.4f} {unit}  per rank min {min(rates):.4f}"
                 f"  median {statistics.median(rates):.4f}  max {max(rates):.4f}")
    failed = [str(rank) for rank, _, _, error in rows if error]
    if failed:
        line += f"  FAILED rank(s): {', '.join(failed)}"
    print(line, flush=True)
