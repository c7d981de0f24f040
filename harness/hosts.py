"""The hosts of a launch: a hostfile's, `n1:2,n2:2`'s or a Slurm allocation's, mpirun's
command line on them, and those left once some are lost. The relaunch (harness/relaunch.py)
runs mpirun with them; `--status` (harness/heartbeat.py) prints the command that resumes a
stopped run on the hosts left, for a site that runs mpirun itself.

Pure functions.
"""
from __future__ import annotations

import re
import shlex
from dataclasses import dataclass


@dataclass(frozen=True)
class Host:
    name: str
    slots: int      # ranks it runs

    @property
    def spec(self) -> str:
        """`name:slots`, as mpirun's --host and launches.json write it."""
        return f"{self.name}:{self.slots}"


def without(hosts: list[Host], lost) -> list[Host]:
    """`hosts` less those named in `lost`."""
    gone = set(lost)
    return [h for h in hosts if h.name not in gone]


def parse_hosts(text: str) -> list[Host]:
    """`n1:2,n2:2` (a host without `:N` runs one rank) or an Open MPI hostfile's text
    (`n1 slots=2`, comments and blank lines skipped); ValueError naming the bad entry."""
    hosts = []
    lines = text.splitlines() if "\n" in text or "slots=" in text else text.split(",")
    for raw in lines:
        entry = raw.split("#", 1)[0].strip()
        if not entry:
            continue
        name, _, count = (entry.partition(":") if ":" in entry else
                          (entry.split()[0], "", (re.search(r"slots\s*=\s*(\S+)", entry) or [None, "1"])[1]))
        if not name or not count.isdigit() or int(count) < 1:
            raise ValueError(f"found {entry!r}, expected a host and its ranks (n1:2, or n1 slots=2)")
        hosts.append(Host(name.split()[0], int(count)))
    if not hosts:
        raise ValueError("found no host, expected at least one")
    return hosts


def slurm_hosts(names: list[str], tasks_per_node: str) -> list[Host]:
    """The allocation's hosts (`scontrol show hostnames`' list) with SLURM_TASKS_PER_NODE's
    ranks each (`2(x3),1`: 2 on each of three nodes, then 1)."""
    counts = []
    for part in tasks_per_node.split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not m:
            raise ValueError(f"SLURM_TASKS_PER_NODE: found {tasks_per_node!r}, expected N or N(xK), comma-separated")
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    if len(counts) != len(names):
        raise ValueError(f"SLURM_TASKS_PER_NODE: found {len(counts)} node(s) in {tasks_per_node!r}, expected"
                         f" {len(names)} (SLURM_JOB_NODELIST)")
    return [Host(n, c) for n, c in zip(names, counts)]


def command(mpirun: str, options: list[str], hosts: list[Host], program: list[str], run_dir: str | None) -> list[str]:
    """mpirun's command line for one launch: the site's options, the hosts with their ranks,
    the program, and `--resume RUN` once the run folder exists."""
    return [mpirun, *options, "--host", ",".join(h.spec for h in hosts),
            "-np", str(sum(h.slots for h in hosts)), *program, *(["--resume", run_dir] if run_dir else [])]


def hosts_left(environment: dict, launched: list[dict]) -> tuple[list[Host], list[str]]:
    """(the hosts of a run's last invocation, each with its ranks, less those a launch lost;
    the lost ones) from results.json's `environment` (hosts, node_of_rank) and launches.json."""
    lost = sorted({h for x in launched for h in x["lost"]})
    of_rank = environment.get("node_of_rank") or []
    ran = [Host(h, of_rank.count(n)) for n, h in enumerate(environment.get("hosts") or [])]
    return without([h for h in ran if h.slots], lost), lost


def by_hand(hosts: list[Host], dat: str, run_dir: str) -> str:
    """The command that resumes a run on `hosts`, for a site that runs mpirun itself (its own
    options and the run's settings to be added as at the start)."""
    return shlex.join(command("mpirun", [], hosts, ["python", "hpcai500.py", dat], run_dir))
