#!/usr/bin/env python3
"""A simulated cluster on one machine: N nodes, each with its own host name, node-local
disk, network and processes, launched through Open MPI's real ssh path.

    sudo python3 scripts/cluster/cluster.py up --nodes 2 [--rate 1gbit]
    sudo python3 scripts/cluster/cluster.py exec n1 -- mpirun --hostfile /run/hpcai500-cluster/hostfile \\
             --prtemca plm_ssh_agent /run/hpcai500-cluster/agent -np 4 python hpcai500.py HPCAI500.dat
    sudo python3 scripts/cluster/cluster.py shape n2 100mbit      # or `none`
    sudo python3 scripts/cluster/cluster.py down
    sudo python3 scripts/cluster/cluster.py up --nodes 2 --slurm   # and Slurm, a slurmd a node (slurm.py)

Node i (`n1` .. `nN`) is one process tree in its own namespaces:
* UTS: its host name, so Open MPI sees N hosts;
* mount: its own tmpfs at /local/scratch (node-local disk: one node cannot see another's
  staged copy) and at /dev/shm (shared memory stays inside the node), and its own
  /etc/hosts naming every node; the rest of the file system (/work, /tmp) is shared, as a
  cluster's shared file system is;
* network: a veth into the cluster's switch, address 10.<net>.0.i/24; `shape` limits the
  link into and out of the node with tc's token bucket (tbf), to model 10 Gb/s or 1 Gb/s
  Ethernet, and `link` takes it down or up;
* PID: the node's processes die with it (`kill` a node's init: its daemon and every
  rank on it are gone at once, as when a node crashes).
The nodes share this machine's cores and memory: figures measured on them measure the
protocol and the network, not the nodes (the harness sees that the nodes share one
kernel and says so in its report).

`agent` in the state folder is Open MPI's `plm_ssh_agent`: `agent [options] HOST
COMMAND...` runs COMMAND on HOST with a login's clean environment, as ssh would.
mpirun runs on this machine, as on a cluster's login node (10.<net>.0.254 on the
switch), so every node's daemon is started through the agent and connects back to it.
The switch is a bridge in a network namespace of its own, held by one process: the
nodes' links and this machine's link into it live and die with it.

Nothing is left behind: `down` kills the nodes and the switch, and their namespaces
take the processes, mounts, links and bridge with them. A cluster started with
`tie=True` (the tests) dies with the process that started it even when that process is
killed: PR_SET_PDEATHSIG on the switch and on each node's `unshare`, whose
`--kill-child` takes the node's init with it. Only the state folder's small files
(/run/hpcai500-<name>) can outlive a killed caller; the next `up` or `down` removes them.
Needs root (network, mount, UTS and PID namespaces); `available()` says why not.
The module is importable (tests/conftest.py) and a command line.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
import zlib
from dataclasses import dataclass

SCRATCH = "/local/scratch"      # the node-local disk, the same path on every node
STATE_ROOT = "/run"             # state folders: /run/hpcai500-<name>
# The login environment the agent gives a remote command, as sshd would: nothing of
# the caller's (mpirun must pass what its daemons need, as on a real cluster).
LOGIN_ENV = {"HOME": "/root", "USER": "root", "LOGNAME": "root", "SHELL": "/bin/sh",
             "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
PR_SET_PDEATHSIG = 1
HEAD = 254                      # this machine's address on the switch: 10.<net>.0.254, where mpirun runs

# The node's init, pid 1 of its PID namespace: it sets up the node (host name, mounts,
# loopback), says "ready", then reaps orphans until killed.
_INIT = r"""
import os, signal, socket, subprocess, sys
name, hosts, scratch = sys.argv[1:4]
socket.sethostname(name)
os.makedirs(scratch, exist_ok=True)
for target, how in ((scratch, ["-t", "tmpfs", "-o", "size=50%", "tmpfs"]), ("/dev/shm", ["-t", "tmpfs", "tmpfs"]),
                    ("/etc/hosts", ["--bind", hosts])):
    subprocess.run(["mount", *how, target], check=True)
subprocess.run(["mount", "-t", "proc", "proc", "/proc"], check=True)
subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
def reap(*_):
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass
signal.signal(signal.SIGCHLD, reap)     # orphans of the node are re-parented to its init
signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
print("ready", flush=True)
sys.stdout.close()
while True:
    signal.pause()
    reap()
"""


# The switch's holder: sleeps in its network namespace until killed.
_SWITCH = r"""
import signal, sys
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
print("ready", flush=True)
while True:
    signal.pause()
"""


# transfer_seconds' two ends, on port 5001 of the nodes.
_RECEIVER = r"""
import socket, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("0.0.0.0", 5001)); s.listen()
print("listening", flush=True)
c, _ = s.accept(); n, t0 = 0, None
while (b := c.recv(1 << 16)):
    t0 = t0 or time.monotonic(); n += len(b)
print(n, time.monotonic() - t0, flush=True)
"""
_SENDER = r"""
import socket, sys
c = socket.create_connection((sys.argv[1], 5001)); c.sendall(b"x" * int(sys.argv[2])); c.close()
"""


class ClusterError(RuntimeError):
    pass


@dataclass(frozen=True)
class Node:
    name: str       # host name, n1 .. nN
    pid: int        # its init, pid 1 inside the node (as seen from this machine)
    address: str    # on the switch
    veth: str       # the switch's end of the node's link (where the inbound shaping sits)


def available() -> str | None:
    """None if a cluster can be made here, else why not (for a test's skip)."""
    if os.geteuid() != 0:
        return "the simulated cluster needs root (network, mount, UTS and PID namespaces)"
    for tool in ("unshare", "nsenter", "ip", "tc", "mount"):
        if shutil.which(tool) is None:
            return f"the simulated cluster needs `{tool}` on PATH"
    probe = subprocess.run(["unshare", "--uts", "--mount", "--net", "--pid", "--fork", "true"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        return f"namespaces cannot be made here: {probe.stderr.strip()}"
    return None


class Cluster:
    """N simulated nodes named n1..nN. `name` keeps two clusters apart (state folder,
    bridge, address range)."""

    def __init__(self, name: str = "cluster", net: int = 250):
        self.name, self.net = name, net
        self.state = os.path.join(STATE_ROOT, f"hpcai500-{name}")
        self.tag = f"h{zlib.crc32(name.encode()) & 0xffffff:06x}"   # in link names: IFNAMSIZ allows 15 characters
        self.switch = 0                 # pid of the process holding the switch's network namespace
        self.nodes: list[Node] = []
        self.daemons: list[int] = []    # pids of the cluster's processes on this machine (Slurm's controller, MUNGE)
        self._procs: list[subprocess.Popen] = []

    # -- files in the state folder -------------------------------------------------
    @property
    def hostfile(self) -> str:
        return os.path.join(self.state, "hostfile")

    @property
    def agent(self) -> str:
        return os.path.join(self.state, "agent")

    def _save(self) -> None:
        with open(os.path.join(self.state, "nodes.json"), "w") as f:
            json.dump({"switch": self.switch, "nodes": [n.__dict__ for n in self.nodes], "daemons": self.daemons,
                       "net": self.net}, f)

    def _load(self) -> tuple[int, list[Node], list[int], int]:
        """(switch, nodes, daemons, net) as `up` saved them; nothing up: (0, [], [], this net)."""
        path = os.path.join(self.state, "nodes.json")
        if not os.path.exists(path):
            return 0, [], [], self.net
        with open(path) as f:
            saved = json.load(f)
        return saved["switch"], [Node(**n) for n in saved["nodes"]], saved.get("daemons", []), saved.get("net", self.net)

    @classmethod
    def attach(cls, name: str = "cluster") -> "Cluster":
        """The cluster `up` left running (command line)."""
        c = cls(name)
        # its addresses' net is the one `up --net` chose, not the default
        c.switch, c.nodes, c.daemons, c.net = c._load()
        if not c.switch:
            raise ClusterError(f"no cluster {name!r} is up (no {c.state}/nodes.json); start one with `up`")
        return c

    # -- life --------------------------------------------------------------------
    def up(self, n: int, slots: int = 2, rate: str | None = None, tie: bool = False) -> "Cluster":
        """Start n nodes of `slots` slots each (the hostfile's); shape every link to
        `rate` (tc syntax, e.g. 10gbit) if given. tie: the nodes die with this process."""
        if not 1 <= n <= 250:
            raise ClusterError(f"nodes: found {n}, expected 1 to 250")
        self.down()            # a stale cluster of the same name (a killed test run)
        os.makedirs(self.state)
        hosts = os.path.join(self.state, "hosts")
        names = [f"n{i}" for i in range(1, n + 1)]
        with open(hosts, "w") as f:
            f.write("127.0.0.1 localhost\n")
            f.writelines(f"{self._address(i)} {h}\n" for i, h in enumerate(names, 1))
        with open(self.hostfile, "w") as f:
            f.writelines(f"{h} slots={slots}\n" for h in names)
        with open(self.agent, "w") as f:
            f.write(f"#!/bin/sh\n# Open MPI's plm_ssh_agent for the simulated cluster {self.name!r}\n"
                    f"exec {shlex.quote(sys.executable)} {shlex.quote(os.path.abspath(__file__))} "
                    f"--name {shlex.quote(self.name)} ssh \"$@\"\n")
        os.chmod(self.agent, 0o755)
        try:
            self._start_switch(tie)
            for i, host in enumerate(names, 1):
                self.nodes.append(self._start(i, host, hosts, tie))
                self._save()
            if rate:
                for node in self.nodes:
                    self.shape(node.name, rate)
        except BaseException:
            self.down()
            raise
        return self

    def _start_switch(self, tie: bool) -> None:
        """The bridge in its own network namespace, held by a sleeping process, and this
        machine's link into it (the head's address, where mpirun's daemons call back)."""
        self.switch = self._spawn("the switch", ["unshare", "--net", sys.executable, "-c", _SWITCH], tie,
                                  subprocess.DEVNULL).pid
        self._save()
        sw = self._in_switch()
        run([*sw, "ip", "link", "add", "br0", "type", "bridge"])
        run([*sw, "ip", "link", "set", "br0", "up"])
        head = f"{self.tag}h"
        _ip("link", "add", head, "type", "veth", "peer", "name", f"{head}s")
        self._plug(f"{head}s")
        _ip("addr", "add", f"{self.head_address}/24", "dev", head)
        _ip("link", "set", head, "up")

    def _in_switch(self) -> list[str]:
        return _net(self.switch)

    def _spawn(self, what: str, argv: list[str], tie: bool, log) -> subprocess.Popen:
        """Start a namespace's holder (the switch, a node's init) and wait for its "ready".
        tie: it dies with this process (PR_SET_PDEATHSIG), else in a session of its own."""
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log, text=True,
                                preexec_fn=_pdeathsig if tie else os.setsid)
        self._procs.append(proc)
        if proc.stdout.readline().strip() != "ready":
            said = ""
            if hasattr(log, "seek"):
                log.seek(0)
                said = ": " + log.read().strip()[-2000:]
            raise ClusterError(f"{what} did not start (exit {proc.poll()}){said}")
        return proc

    def _plug(self, end: str) -> None:
        """Move a veth end from this machine into the switch and attach it to the bridge."""
        _ip("link", "set", end, "netns", str(self.switch))
        run([*self._in_switch(), "ip", "link", "set", end, "master", "br0", "up"])

    def _address(self, i: int) -> str:
        return f"10.{self.net}.0.{i}"

    @property
    def head_address(self) -> str:
        """This machine's address on the switch (the login node's): what the nodes reach."""
        return self._address(HEAD)

    def daemon(self, what: str, argv: list[str], tie: bool, env: dict | None = None) -> None:
        """Start a process of the cluster's on this machine (a daemon in the foreground:
        Slurm's controller, MUNGE); `down` kills it, and so does the caller's death where
        tie. Its output goes to <what>.log in the state folder."""
        with open(os.path.join(self.state, f"{what}.log"), "a") as log:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    env=dict(os.environ, **(env or {})), preexec_fn=_pdeathsig if tie else os.setsid)
        self._procs.append(proc)
        self.daemons.append(proc.pid)
        self._save()

    def _start(self, i: int, host: str, hosts: str, tie: bool) -> Node:
        # the init's and unshare's messages (a failed start; unshare's complaint when it is
        # killed) go to the node's log in the state folder, not to the caller's terminal
        with open(os.path.join(self.state, f"{host}.log"), "w+") as log:
            proc = self._spawn(f"node {host}", [
                "unshare", "--uts", "--mount", "--net", "--pid", "--fork", "--kill-child", "--propagation", "private",
                sys.executable, "-c", _INIT, host, hosts, SCRATCH], tie, log)
        pid = _child(proc.pid)
        veth = f"{self.tag}n{i}"
        _ip("link", "add", veth, "type", "veth", "peer", "name", f"{veth}p")
        _ip("link", "set", f"{veth}p", "netns", str(pid))
        self._plug(veth)
        inside = [*_net(pid), "ip"]
        run([*inside, "link", "set", f"{veth}p", "name", "eth0"])
        run([*inside, "addr", "add", f"{self._address(i)}/24", "dev", "eth0"])
        run([*inside, "link", "set", "eth0", "up"])
        return Node(host, pid, self._address(i), veth)

    def down(self) -> None:
        """Kill every node and the switch (processes, mounts, links and the bridge go with
        their namespaces) and remove the state folder. Safe to call twice, or with nothing up."""
        switch, old, daemons, _ = self._load()
        for pid in {*self.daemons, *daemons}:
            _kill(pid)
        for node in {n.pid: n for n in [*self.nodes, *old]}.values():
            _kill(node.pid)
        for pid in {self.switch, switch} - {0}:
            _kill(pid)
        for proc in self._procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
        # the kernel tears a dead namespace's links down asynchronously: do not wait for it
        if os.path.exists(f"/sys/class/net/{self.tag}h"):
            run(["ip", "link", "del", f"{self.tag}h"], check=False)
        self.nodes, self._procs, self.daemons, self.switch = [], [], [], 0
        shutil.rmtree(self.state, ignore_errors=True)

    # -- use ---------------------------------------------------------------------
    def node(self, name: str) -> Node:
        for n in self.nodes:
            if n.name == name:
                return n
        raise ClusterError(f"node: found {name!r}, expected one of {', '.join(n.name for n in self.nodes)}")

    def enter(self, name: str, wd: str | None = None) -> list[str]:
        """The command prefix that runs a program on node `name`, in all its namespaces,
        in folder `wd` (default: the caller's, as from a shell on the login node)."""
        return ["nsenter", "-t", str(self.node(name).pid), "-u", "-m", "-n", "-p", f"--wd={wd or os.getcwd()}", "--"]

    def mpirun_args(self, hosts: str | None = None, env=()) -> list[str]:
        """mpirun's options for this cluster: the hostfile and the ssh agent; with `hosts`
        (`n1:2,n2:2`), --host and -np for a rank a slot; and -x for each HPCAI500_* name
        in `env` (the nodes' ranks start with a login's environment, as over ssh)."""
        args = ["--hostfile", self.hostfile, "--prtemca", "plm_ssh_agent", self.agent]
        if hosts:
            ranks = sum(int(h.split(":")[1]) if ":" in h else 1 for h in hosts.split(","))
            args += ["--host", hosts, "-np", str(ranks)]
        return args + [a for k in env if k.startswith("HPCAI500_") for a in ("-x", k)]

    def shape(self, name: str, rate: str | None) -> None:
        """Limit node `name`'s link both ways to `rate` (tc syntax: 10gbit, 1gbit, 100mbit),
        or lift the limit (None or 'none'). A token bucket: the burst is 1 ms at the rate
        (at least 64 KB, so a jumbo segment passes) and packets wait at most 50 ms."""
        node = self.node(name)
        for prefix, dev in ((self._in_switch(), node.veth), (_net(node.pid), "eth0")):
            run([*prefix, "tc", "qdisc", "del", "dev", dev, "root"], check=False)
            if rate and rate != "none":
                burst = max(64 * 1024, _bits(rate) // 8 // 1000)
                run([*prefix, "tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", rate,
                      "burst", str(burst), "latency", "50ms"])

    def link(self, name: str, up: bool) -> None:
        """Take node `name`'s link down (as a pulled cable or a dead switch port) or up."""
        run([*self._in_switch(), "ip", "link", "set", self.node(name).veth, "up" if up else "down"])

    def transfer_seconds(self, src: str, dst: str, nbytes: int) -> float:
        """Seconds `nbytes` take over TCP from node `src` to node `dst`, timed at the
        receiver from the first byte to the end: what the links (and their shaping) allow."""
        server = subprocess.Popen([*self.enter(dst), sys.executable, "-c", _RECEIVER], stdout=subprocess.PIPE,
                                  text=True)
        try:
            if server.stdout.readline().strip() != "listening":
                raise ClusterError(f"no receiver on {dst}")
            run([*self.enter(src), sys.executable, "-c", _SENDER, dst, str(nbytes)])
            got, seconds = server.stdout.readline().split()
        finally:
            server.kill()
            server.wait()
        if int(got) != nbytes:
            raise ClusterError(f"{dst} received {got} bytes of {nbytes}")
        return float(seconds)

    def kill(self, name: str) -> None:
        """Node `name` dies: its init is killed, and with it every process on the node."""
        _kill(self.node(name).pid)

    def freeze(self, name: str) -> None:
        """Node `name` freezes whole (a kernel that hangs, a board that stops): every process
        on it SIGSTOPped, its Open MPI daemon too, alive and silent; its kernel (this
        machine's) still answers TCP, as a hung node's network card may. `down` ends it."""
        ns = os.readlink(f"/proc/{self.node(name).pid}/ns/pid")
        for entry in os.listdir("/proc"):
            try:
                if entry.isdigit() and os.readlink(f"/proc/{entry}/ns/pid") == ns:
                    os.kill(int(entry), signal.SIGSTOP)
            except OSError:
                pass   # ended meanwhile, or a process whose namespaces are not ours to read (not the node's)


def _bits(rate: str) -> int:
    units = {"kbit": 10**3, "mbit": 10**6, "gbit": 10**9, "bit": 1}
    for unit, scale in units.items():
        if rate.endswith(unit):
            return int(float(rate[:-len(unit)]) * scale)
    raise ClusterError(f"rate: found {rate!r}, expected a number with kbit, mbit or gbit (e.g. 10gbit)")


def _net(pid: int) -> list[str]:
    """The command prefix that runs a program in the network namespace of process `pid`."""
    return ["nsenter", "-t", str(pid), "-n"]


def _pdeathsig() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _child(pid: int) -> int:
    """The one child of `unshare` (its --fork): the node's init."""
    for _ in range(100):
        try:
            with open(f"/proc/{pid}/task/{pid}/children") as f:
                kids = f.read().split()
        except FileNotFoundError:
            kids = []
        if kids:
            return int(kids[0])
        time.sleep(0.01)
    raise ClusterError(f"unshare {pid} has no child")


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    for _ in range(200):   # the namespaces go once the init is reaped
        if not os.path.exists(f"/proc/{pid}"):
            return
        time.sleep(0.01)


def run(cmd: list[str], check: bool = True) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True)
    if check and done.returncode != 0:
        raise ClusterError(f"{' '.join(cmd)}: {done.stderr.strip()}")


def _ip(*args: str) -> None:
    run(["ip", *args])


def ssh(cluster: Cluster, argv: list[str]) -> int:
    """Open MPI's plm_ssh_agent: `[options] HOST COMMAND...`. Options (ssh's, such as
    -x) are ignored; COMMAND's words are joined and run by /bin/sh on HOST with a login's
    environment, as sshd runs them."""
    args = list(argv)
    while args and args[0].startswith("-"):
        args.pop(0)
    if len(args) < 2:
        print(f"cluster agent: found {' '.join(argv)!r}, expected [options] HOST COMMAND", file=sys.stderr)
        return 255
    host, command = args[0], " ".join(args[1:])
    try:
        prefix = cluster.enter(host, wd=LOGIN_ENV["HOME"])
    except ClusterError as e:
        print(f"ssh: {e}", file=sys.stderr)
        return 255
    return subprocess.run([*prefix, "/bin/sh", "-c", command], env=LOGIN_ENV).returncode


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="cluster.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--name", default="cluster", help="keeps several clusters apart (default: cluster)")
    sub = p.add_subparsers(dest="cmd", required=True)
    u = sub.add_parser("up", help="start the nodes")
    u.add_argument("--nodes", type=int, default=2)
    u.add_argument("--slots", type=int, default=2, help="slots per node in the hostfile")
    u.add_argument("--rate", help="shape every node's link, tc syntax (10gbit, 1gbit)")
    u.add_argument("--net", type=int, default=250, help="second byte of the nodes' 10.x.0.0/24 (default 250)")
    u.add_argument("--slurm", action="store_true", help="and Slurm on them (slurm.py: a slurmd per node)")
    sub.add_parser("down", help="stop the nodes, remove everything")
    sub.add_parser("status", help="the nodes and the files mpirun needs")
    e = sub.add_parser("exec", help="run a command on a node")
    e.add_argument("node")
    e.add_argument("command", nargs=argparse.REMAINDER)
    s = sub.add_parser("shape", help="limit a node's link (or 'none')")
    s.add_argument("node")
    s.add_argument("rate")
    sub.add_parser("ssh", help="(Open MPI's plm_ssh_agent)", add_help=False).add_argument("rest", nargs=argparse.REMAINDER)
    args, extra = p.parse_known_args(argv)
    try:
        if args.cmd == "ssh":
            return ssh(Cluster.attach(args.name), args.rest + extra)
        if extra:
            p.error(f"unrecognized arguments: {' '.join(extra)}")
        if args.cmd == "up":
            why = available()
            if why:
                raise ClusterError(why)
            c = Cluster(args.name, args.net).up(args.nodes, args.slots, args.rate)
            print(_status(c))
            if args.slurm:
                # slurm.py's own `up`, as a command: it imports this module, so importing it
                # back would make a cycle
                try:
                    q = subprocess.run([sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                                     "slurm.py"), "--name", args.name, "up"])
                except BaseException:
                    c.down()            # all or nothing
                    raise
                if q.returncode:
                    c.down()
                    return q.returncode
        elif args.cmd == "down":
            Cluster(args.name).down()
        elif args.cmd == "status":
            print(_status(Cluster.attach(args.name)))
        elif args.cmd == "exec":
            c = Cluster.attach(args.name)
            command = args.command[1:] if args.command[:1] == ["--"] else args.command
            return subprocess.run([*c.enter(args.node), *command]).returncode
        elif args.cmd == "shape":
            Cluster.attach(args.name).shape(args.node, args.rate)
    except ClusterError as e:
        print(f"cluster.py: {e}", file=sys.stderr)
        return 1
    return 0


def _status(c: Cluster) -> str:
    lines = [f"{n.name}: address {n.address}, init pid {n.pid}, link {n.veth}" for n in c.nodes]
    lines.append(f"mpirun options: {' '.join(c.mpirun_args())}")
    lines.append(f"run on the first node: python3 {os.path.relpath(__file__)} --name {c.name} exec n1 -- mpirun ...")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
