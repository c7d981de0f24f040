#!/usr/bin/env python3
"""Slurm on the simulated cluster (cluster.py): one `slurmd` per node, the controller
and MUNGE on this machine, as on a cluster's management node.

    sudo python3 scripts/cluster/cluster.py up --nodes 2 --slurm      # or `slurm.py up` on a cluster that is up
    export SLURM_CONF=/run/hpcai500-cluster/slurm/slurm.conf
    sbatch --nodes=2 --ntasks-per-node=2 --cpus-per-task=1 --gpus-per-node=0 \\
           --export=ALL,VENV=$PWD/.venv scripts/slurm/hpcai500.sbatch my.dat
    sudo python3 scripts/cluster/cluster.py down                      # Slurm goes with the cluster

Each node's `slurmd` runs inside the node (its host name, address, PID namespace), with
its own spool and log (`%n` in slurm.conf), and dies with the node. `slurmctld` listens
on this machine, at the switch address 10.<net>.0.254 that the nodes reach, on port
7000 + <net> (beside a Slurm of this host's own on 6817). The batch script runs on the
job's first node; its `srun --mpi=pmix` talks to the other nodes' slurmd over the
switch, as on a cluster. Every file is in the cluster's state folder: slurm.conf (the
client commands read it through SLURM_CONF), mpi.conf, the controller's state, the
logs, a MUNGE key made for this cluster.

Two departures from a real cluster, both forced by one machine:
* one MUNGE daemon (its socket in the state folder, named by slurm.conf's AuthInfo)
  serves every node, where a cluster runs one per node: a job credential checked by
  two nodes' slurmd is then one credential decoded twice, which munged logs as
  "Replayed credential" and Slurm accepts;
* the nodes share /tmp (it is this machine's), so PMIx's per-step folders go to the
  node-local /local/scratch (mpi.conf's PMIxCliTmpDirBase, and TmpFS): in /tmp two
  nodes' steps would collide on one path.

Nodes report this machine's cores as their own (slurmd sees them); task/affinity binds
each node's tasks to cores 0, 1, ... as Open MPI's daemons do, which the harness
widens (docs/running.md, "Several nodes").

Needs root and Debian's packages slurm-wlm, munge and libpmix2 (scripts/slurm/install.sh);
`available()` says what is missing.
"""
from __future__ import annotations

import argparse
import glob
import os
import shutil
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster as cl  # noqa: E402  (this folder's module, when run as a script)

TOOLS = ("slurmctld", "slurmd", "sbatch", "sinfo", "scancel", "scontrol", "srun", "munged", "mungekey")
PORT_BASE = 7000            # slurmctld's port: PORT_BASE + the cluster's net
# where Debian's (and a source build's) Slurm keeps its plugins; srun --mpi=list would need a slurm.conf
PLUGIN_DIRS = ("/usr/lib/x86_64-linux-gnu/slurm-wlm", "/usr/lib/aarch64-linux-gnu/slurm-wlm", "/usr/lib64/slurm",
               "/usr/local/lib/slurm")
UP_SECONDS = 60             # how long `up` waits for every node to be idle


def available() -> str | None:
    """None if Slurm can be brought up on a simulated cluster here, else why not."""
    why = cl.available()
    if why:
        return why
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        return (f"no Slurm here ({', '.join(missing)} not on PATH): "
                "sudo scripts/slurm/install.sh installs Debian's slurm-wlm, munge and libpmix2")
    if not any(glob.glob(os.path.join(d, "mpi_pmix*.so")) for d in PLUGIN_DIRS):
        return f"Slurm has no PMIx plugin (no mpi_pmix*.so in {' or '.join(PLUGIN_DIRS)}): install libpmix2"
    return None


def conf_text(name: str, controller: tuple[str, str], port: int, nodes: list[tuple[str, str]], cpus: int,
              state: str) -> str:
    """slurm.conf of the simulated cluster `name`: the controller (host name, address)
    listening on `port`, nodes (name, address) of `cpus` CPUs each, every file under
    `state`. Pure: the text only."""
    lines = [
        f"# the simulated cluster {name!r}, written by scripts/cluster/slurm.py",
        f"ClusterName={name}",
        f"SlurmctldHost={controller[0]}({controller[1]})",
        f"SlurmctldPort={port}",
        "SlurmUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={state}/munge.socket",
        "MpiDefault=none",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/affinity",
        "SwitchType=switch/none",
        "SchedulerType=sched/backfill",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "ReturnToService=2",
        # a node that dies is DOWN once it has missed its pings for this long (Slurm's default:
        # 300 s); a job that ran on it stays COMPLETING until then, its script done
        "SlurmdTimeout=30",
        "TmpFS=" + cl.SCRATCH,
        f"StateSaveLocation={state}/ctld",
        f"SlurmdSpoolDir={state}/spool-%n",
        f"SlurmctldPidFile={state}/slurmctld.pid",
        f"SlurmdPidFile={state}/slurmd-%n.pid",
        f"SlurmctldLogFile={state}/slurmctld.log",
        f"SlurmdLogFile={state}/slurmd-%n.log",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        *(f"NodeName={n} NodeAddr={a} CPUs={cpus} State=UNKNOWN" for n, a in nodes),
        f"PartitionName=sim Nodes={','.join(n for n, _ in nodes)} Default=YES MaxTime=INFINITE State=UP",
    ]
    return "\n".join(lines) + "\n"


class Slurm:
    """Slurm on a cluster that is up."""

    def __init__(self, cluster: cl.Cluster):
        self.cluster = cluster
        self.state = os.path.join(cluster.state, "slurm")
        self.conf = os.path.join(self.state, "slurm.conf")
        self.port = PORT_BASE + cluster.net

    @property
    def env(self) -> dict:
        """What the client commands (sbatch, sinfo, scancel) need: the cluster's slurm.conf."""
        return {"SLURM_CONF": self.conf}

    def up(self, tie: bool = False) -> "Slurm":
        """Write the configuration, start MUNGE and the controller on this machine and a
        slurmd on every node; return once every node is idle. tie: as Cluster.up's."""
        c = self.cluster
        if os.path.exists(self.state):
            raise cl.ClusterError(f"Slurm is already up on cluster {c.name!r} ({self.state} exists)")
        os.makedirs(os.path.join(self.state, "ctld"))
        with open(self.conf, "w") as f:
            f.write(conf_text(c.name, (socket.gethostname().split(".")[0], c.head_address), self.port,
                              [(n.name, n.address) for n in c.nodes], os.cpu_count() or 1, self.state))
        with open(os.path.join(self.state, "mpi.conf"), "w") as f:
            f.write(f"PMIxCliTmpDirBase={cl.SCRATCH}\n")     # node-local: /tmp is shared here
        key, sock = os.path.join(self.state, "munge.key"), os.path.join(self.state, "munge.socket")
        cl.run(["mungekey", "--create", f"--keyfile={key}"])
        c.daemon("munged", ["munged", "--foreground", "--force", f"--socket={sock}", f"--key-file={key}",
                            f"--pid-file={self.state}/munged.pid", f"--seed-file={self.state}/munged.seed",
                            f"--log-file={self.state}/munged.log"], tie)
        self._wait(lambda: os.path.exists(sock), "munged made no socket", "munged.log")
        c.daemon("slurmctld", ["slurmctld", "-D", "-f", self.conf], tie, env=self.env)
        for node in c.nodes:   # slurmd forks into the background, inside the node: it dies with it
            cl.run([*c.enter(node.name, wd="/"), "slurmd", "-f", self.conf])
        self._wait(self._all_idle, "not every node came up idle", "slurmctld.log")
        return self

    def _all_idle(self) -> bool:
        p = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], env=dict(os.environ, **self.env),
                           capture_output=True, text=True)
        states = dict(line.split() for line in p.stdout.splitlines() if line.strip())
        return p.returncode == 0 and len(states) == len(self.cluster.nodes) and \
            all(s.rstrip("*~#$@") == "idle" for s in states.values())

    def _wait(self, ready, what: str, log: str) -> None:
        """Until ready(); after UP_SECONDS a ClusterError with the end of the daemon's
        log (or that it wrote none: it did not start)."""
        deadline = time.monotonic() + UP_SECONDS
        while not ready():
            if time.monotonic() > deadline:
                path = os.path.join(self.state, log)
                try:
                    with open(path, errors="replace") as f:
                        said = f"{path}:\n{f.read()[-2000:]}"
                except OSError:
                    said = f"no {path}: the daemon did not start (its output: {self.cluster.state}/*.log)"
                raise cl.ClusterError(f"Slurm on cluster {self.cluster.name!r}: {what} within {UP_SECONDS} s; {said}")
            time.sleep(0.2)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="slurm.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--name", default="cluster", help="the cluster's name (cluster.py's --name)")
    p.add_argument("cmd", choices=["up"], help="start Slurm on the cluster that is up (cluster.py down stops it)")
    args = p.parse_args(argv)
    try:
        why = available()
        if why:
            raise cl.ClusterError(why)
        s = Slurm(cl.Cluster.attach(args.name)).up()
    except cl.ClusterError as e:
        print(f"slurm.py: {e}", file=sys.stderr)
        return 1
    print(f"Slurm is up: export SLURM_CONF={s.conf}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
