"""Jobs across hosts: Linux network namespaces joined by veth pairs and a bridge stand in for
machines, the launcher's remote shell is ``ip netns exec``. Ranks on one "host" use shared
memory, across hosts TCP; a slowed link (tc tbf) makes the hierarchical allreduce win.

Needs root and ``ip``/``tc`` (CI runs as root); skips with the reason otherwise. Every namespace,
link and bridge made here is removed afterwards, also on failure."""

from __future__ import annotations

import ast
import contextlib
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ringworld.launch.hosts import Host, parse_hostfile, parse_hosts, place

pytestmark = pytest.mark.timeout(180)
SUBNET = "10.231"


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check,
                          timeout=20)


class Net:
    """A bridge in this namespace and ``n`` namespaces plugged into it."""

    def __init__(self, n: int) -> None:
        tag = f"{os.getpid() % 10000}"
        self.bridge = f"rwb{tag}"
        self.launcher_ip = f"{SUBNET}.0.1"
        self.hosts = [f"rwh{tag}x{i}" for i in range(n)]
        self.veths = [f"rwv{tag}x{i}" for i in range(n)]
        self.ips = [f"{SUBNET}.0.{10 + i}" for i in range(n)]

    def up(self) -> None:
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.launcher_ip}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for ns, veth, addr in zip(self.hosts, self.veths, self.ips, strict=True):
            _ip("netns", "add", ns)
            _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
            _ip("link", "set", veth, "master", self.bridge, "up")
            _ip("netns", "exec", ns, "ip", "addr", "add", f"{addr}/24", "dev", "eth0")
            _ip("netns", "exec", ns, "ip", "link", "set", "eth0", "up")
            _ip("netns", "exec", ns, "ip", "link", "set", "lo", "up")

    def down(self) -> None:
        for ns, veth in zip(self.hosts, self.veths, strict=True):
            _ip("netns", "del", ns, check=False)
            _ip("link", "del", veth, check=False)
        _ip("link", "del", self.bridge, check=False)

    def slow(self, rate: str) -> None:
        """Limit every host's link, both ways, to ``rate`` (a tc rate such as 100mbit)."""
        tbf = ["root", "tbf", "rate", rate, "burst", "64kb", "latency", "100ms"]
        for ns, veth in zip(self.hosts, self.veths, strict=True):
            subprocess.run(["tc", "qdisc", "add", "dev", veth, *tbf], check=True, timeout=20)
            _ip("netns", "exec", ns, "tc", "qdisc", "add", "dev", "eth0", *tbf)


@contextlib.contextmanager
def network(n: int) -> Iterator[Net]:
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root (CI runs as root)")
    if shutil.which("ip") is None or shutil.which("tc") is None:
        pytest.skip("needs the ip and tc commands (iproute2)")
    net = Net(n)
    net.down()  # leftovers of a killed earlier run with the same pid
    try:
        try:
            net.up()
        except subprocess.CalledProcessError as exc:
            pytest.skip(f"cannot create network namespaces here: {exc.stderr.strip()}")
        yield net
    finally:
        net.down()


def _launch(tmp_path: Path, net: Net, hosts: str, body: str, *extra: str,
            ) -> subprocess.CompletedProcess[str]:
    prog = tmp_path / "prog.py"
    prog.write_text(textwrap.dedent(body))
    return subprocess.run(
        [sys.executable, "-m", "ringworld", "run", "-n", str(sum(
            int(h.split(":")[1]) for h in hosts.split(","))), "--hosts", hosts,
         "--rsh", "ip netns exec", *extra, sys.executable, str(prog)],
        capture_output=True, text=True, timeout=150, check=False, stdin=subprocess.DEVNULL,
        cwd=tmp_path)


CHECK = """
import os
import numpy as np
import ringworld

comm = ringworld.init()
p, r = comm.size, comm.rank
n = 100_003
a = np.arange(n, dtype=np.float64) * (r + 1)
out = np.empty(n)
for algo in (None, "ring", "hierarchical"):
    comm.allreduce(a, out, algorithm=algo)
    assert (out == np.arange(n, dtype=np.float64) * (p * (p + 1) // 2)).all(), algo
b = np.arange(1000.0) if r == 1 else np.empty(1000)
comm.bcast(b, root=1)
assert (b == np.arange(1000.0)).all()
g = np.empty(3 * p)
comm.allgather(np.full(3, float(r)), g)
assert (g == np.repeat(np.arange(float(p)), 3)).all()
t = np.empty(p, dtype=np.int64)
comm.alltoall(np.arange(p, dtype=np.int64) + 10 * r, t)
assert (t == np.arange(p) * 10 + r).all()
assert comm.allreduce_obj(os.environ["RINGWORLD_HOST"], ringworld.SUM)
kinds = ["self" if w == r else type(comm._engine.route[w]).__name__ for w in range(p)]
secret_seen = any(k.startswith("RINGWORLD_SECRET") and k != "RINGWORLD_SECRET_FD"
                  for k in os.environ)
argv = open("/proc/self/cmdline", "rb").read().replace(b"\\0", b" ").decode()
print(f"rank {r} on {os.environ['RINGWORLD_HOST']}: {kinds} secret_env={secret_seen} "
      f"argv={argv!r}", flush=True)
"""


@pytest.mark.parametrize("layout", ["2x2", "3x1+2"])
def test_collectives_across_hosts_with_per_peer_transports(tmp_path: Path, layout: str) -> None:
    with network(3 if layout == "3x1+2" else 2) as net:
        if layout == "2x2":
            hosts = f"{net.hosts[0]}:2,{net.hosts[1]}:2"
        else:
            hosts = f"{net.hosts[0]}:1,{net.hosts[1]}:2,{net.hosts[2]}:2"
        r = _launch(tmp_path, net, hosts, CHECK, "--bind", net.launcher_ip, "--iface", "eth0")
        assert r.returncode == 0, r.stdout + r.stderr
        place_of = {}
        for m in re.finditer(r"rank (\d) on (\S+): (\[.*?\]) secret_env=(\w+) argv='(.*)'",
                             r.stdout):
            place_of[int(m.group(1))] = (m.group(2), ast.literal_eval(m.group(3)))
            assert m.group(4) == "False"
            assert not re.search(r"[0-9a-f]{64}", m.group(5)), "the secret is never in argv"
        assert len(place_of) == (4 if layout == "2x2" else 5), r.stdout
        for rank, (host, kinds) in place_of.items():
            for peer, kind in enumerate(kinds):
                if peer == rank:
                    continue
                same = place_of[peer][0] == host
                assert kind == ("ShmTransport" if same else "TcpTransport"), (rank, peer, kinds)


SPEED = """
import time
import numpy as np
import ringworld

comm = ringworld.init()
n = (1 << 20) // 8
a = np.ones(n)
out = np.empty(n)
times = {}
for algo in (None, "ring", "rabenseifner", "hierarchical"):
    comm.allreduce(a, out, algorithm=algo)
    chosen = comm.last_algorithm
    assert (out == comm.size).all()
    comm.barrier()
    start = time.perf_counter()
    for _ in range(3):
        comm.allreduce(a, out, algorithm=algo)
    comm.barrier()
    times[algo or "auto"] = (time.perf_counter() - start) / 3
    if algo is None:
        times["chosen"] = chosen
if comm.rank == 0:
    print(times, flush=True)
"""


def test_hierarchical_allreduce_is_chosen_and_faster_on_a_slow_link(tmp_path: Path) -> None:
    with network(2) as net:
        net.slow("100mbit")
        hosts = f"{net.hosts[0]}:2,{net.hosts[1]}:2"
        r = _launch(tmp_path, net, hosts, SPEED, "--bind", net.launcher_ip)
        assert r.returncode == 0, r.stdout + r.stderr
        times = ast.literal_eval(r.stdout.strip().splitlines()[-1])
        assert times["chosen"] == "hierarchical", times
        assert times["hierarchical"] < min(times["ring"], times["rabenseifner"]), times


def test_remote_hosts_need_a_reachable_launcher_address(tmp_path: Path) -> None:
    prog = tmp_path / "p.py"
    prog.write_text("print('hi')\n")
    r = subprocess.run([sys.executable, "-m", "ringworld", "run", "-n", "2", "--hosts",
                        "elsewhere-1:1,elsewhere-2:1", str(prog)], capture_output=True,
                       text=True, timeout=30, check=False, stdin=subprocess.DEVNULL)
    assert r.returncode == 2
    assert "--bind ADDR or --iface NAME" in r.stderr


def test_host_lists_and_files(tmp_path: Path) -> None:
    assert parse_hosts("a:2, b:3,c") == [Host("a", 2), Host("b", 3), Host("c", 1)]
    assert place(parse_hosts("a:2,b:3"), 4) == ["a", "a", "b", "b"]
    with pytest.raises(ValueError, match="exceeds the 5 slots"):
        place(parse_hosts("a:2,b:3"), 6)
    with pytest.raises(ValueError, match="twice"):
        parse_hosts("a:1,a:2")
    with pytest.raises(ValueError, match="positive integer"):
        parse_hosts("a:0")
    f = tmp_path / "hosts"
    f.write_text("# cluster\nnode1 slots=4\nnode2:2  # two\n\nnode3\n")
    assert parse_hostfile(str(f)) == [Host("node1", 4), Host("node2", 2), Host("node3", 1)]
    f.write_text("node1 cpus=4\n")
    with pytest.raises(ValueError, match=r"hosts:1: unknown field"):
        parse_hostfile(str(f))


CUT = """
import os, sys, time
import numpy as np
import ringworld

comm = ringworld.init()
out = np.empty(4)
comm.allreduce(np.ones(4), out)
print(f"rank {comm.rank} ready", flush=True)
if comm.rank == 2:
    time.sleep(60)  # its link is cut meanwhile; the launcher stops it at the end
    sys.exit(0)
start = time.time()
try:
    comm.allreduce(np.ones(4), out, timeout=60)
except ringworld.PeerFailure as exc:
    print(f"rank {comm.rank}: rank {exc.rank} failed at {time.time()}: {exc}", flush=True)
    time.sleep(1)
"""


def test_a_cut_link_fails_the_survivors_within_the_liveness_timeout(tmp_path: Path) -> None:
    liveness = 3.0
    with network(3) as net:
        hosts = f"{net.hosts[0]}:1,{net.hosts[1]}:1,{net.hosts[2]}:1"
        prog = tmp_path / "prog.py"
        prog.write_text(textwrap.dedent(CUT))
        env = {**os.environ, "RINGWORLD_LIVENESS_TIMEOUT": str(liveness)}
        p = subprocess.Popen(
            [sys.executable, "-m", "ringworld", "run", "-n", "3", "--hosts", hosts, "--rsh",
             "ip netns exec", "--bind", net.launcher_ip, "--enable-recovery",
             sys.executable, str(prog)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
            stdin=subprocess.DEVNULL, cwd=tmp_path)
        try:
            assert p.stdout is not None
            ready = [p.stdout.readline() for _ in range(3)]
            assert all("ready" in line for line in ready), ready
            time.sleep(0.5)
            cut_at = time.time()
            _ip("netns", "exec", net.hosts[2], "ip", "link", "set", "eth0", "down")
            lines = [p.stdout.readline() for _ in range(2)]
        finally:
            p.kill()
            p.communicate(timeout=30)
        found = [re.match(r"rank (\d): rank (\d) failed at ([\d.]+): (.*)", line)
                 for line in lines]
        assert all(found), lines
        for m in found:
            assert m is not None and m.group(2) == "2" and "not responding" in m.group(4)
            assert float(m.group(3)) - cut_at < liveness + 2.0, lines


ELASTIC = """
import os, signal, sys
import numpy as np
import ringworld

comm = ringworld.init()
world = comm.rank
x = np.full(1 << 16, float(world + 1))
out = np.empty(1 << 16)
step, recovered = 0, False
while step < 30:
    if world == 2 and step == 10:
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        comm.allreduce(x, out)  # hierarchical across the two hosts
        step += 1
    except (ringworld.PeerFailure, ringworld.CommRevoked) as exc:
        assert not recovered, exc
        if sys.argv[1] == "revoke":
            comm.revoke()
        comm = comm.shrink()
        recovered = True
        print(f"rank {world}: recovered from rank {getattr(exc, 'rank', '-')}", flush=True)
want = sum(r + 1.0 for r in range(4) if r != 2)
assert (out == want).all(), out[:3]
print(f"rank {world}: done on {comm.size} ranks", flush=True)
"""


@pytest.mark.parametrize("mode", ["shrink", "revoke"])
def test_recovery_across_hosts_never_deadlocks(tmp_path: Path, mode: str) -> None:
    """Two hosts of two ranks, the hierarchical allreduce in a loop, kill -9 of rank 2 (on
    the second host): every survivor fails, shrinks and finishes. A leader that failed among
    the leaders left its host's other rank waiting for good in the host's broadcast."""
    with network(2) as net:
        prog = tmp_path / "prog.py"
        prog.write_text(textwrap.dedent(ELASTIC))
        r = subprocess.run(
            [sys.executable, "-m", "ringworld", "run", "-n", "4", "--hosts",
             f"{net.hosts[0]}:2,{net.hosts[1]}:2", "--rsh", "ip netns exec", "--bind",
             net.launcher_ip, "--enable-recovery", sys.executable, str(prog), mode],
            capture_output=True, text=True, timeout=90, check=False, stdin=subprocess.DEVNULL,
            cwd=tmp_path)
        assert r.returncode == 0, r.stdout + r.stderr
        for rank in (0, 1, 3):
            assert f"rank {rank}: recovered from rank" in r.stdout, r.stdout + r.stderr
            assert f"rank {rank}: done on 3 ranks" in r.stdout, r.stdout + r.stderr

