"""The simulator runs the real schedules: same data as check.run and a real job, at scale."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from ringworld.algorithms import check as simulate
from ringworld.algorithms import registry
from ringworld.algorithms.schedule import RECV, SEND, Schedule, Spec, Xfer, schedule, step
from ringworld.comm.ops import SUM
from ringworld.topology import planner, plans, presets, search
from ringworld.topology.program import Programs
from ringworld.topology.sim import Network, SimulationError, run_events, run_lockstep
from ringworld.topology.sim import simulate as sim

pytestmark = pytest.mark.timeout(300)


def data(p: int, n: int) -> list[np.ndarray[Any, Any]]:
    return [((np.arange(n) * 7 + (r + 1) * 131) % 101).astype(np.float64) for r in range(p)]


def run_data(builder: Any, p: int, send: list[np.ndarray[Any, Any]], out_len: int,
             in_place: bool = False) -> tuple[list[np.ndarray[Any, Any]], Counter[Any]]:
    moved: Counter[Any] = Counter()
    scheds = [builder(r) for r in range(p)]
    outs = [send[r].copy() if in_place else np.full(out_len, np.nan) for r in range(p)]
    bufs = [[outs[r] if in_place else send[r], outs[r]] for r in range(p)]
    simulate.run(scheds, bufs, SUM, lambda a, b, nb, _: moved.update([(a, b, nb)]))
    return outs, moved


def timed(net: Network, builder: Any, p: int, itemsize: int = 8) -> Counter[Any]:
    res = run_events(net, Programs.explicit(builder, p, itemsize), record=True)
    assert res.transfers is not None
    return Counter((a, b, nb) for a, b, nb, _, _ in res.transfers)


@pytest.mark.parametrize("spec,n", [("cluster:2:4", 37), ("cluster:3:2", 64),
                                    ("cluster:2:1", 5)])
def test_hierarchical_allreduce_delivers_the_sum(spec: str, n: int) -> None:
    net = Network(presets.resolve(spec))
    groups = planner._host_groups(net)
    assert groups is not None
    p = net.p
    send = data(p, n)
    for inter in ("ring", "rabenseifner", "recursive_doubling"):
        b = plans.hierarchical_allreduce(groups, n, inter)
        outs, moved = run_data(b, p, send, n)
        for o in outs:
            np.testing.assert_array_equal(o, sum(send))
        assert timed(net, b, p) == moved  # the timing run moves exactly these messages


def test_multi_ring_allreduce_on_dgx1v_delivers_the_sum() -> None:
    net = Network(presets.resolve("dgx1v"))
    rings = search.find_rings(net)
    n = 1001
    b = plans.multi_ring_allreduce([o for o, _ in rings], [w for _, w in rings], n)
    send = data(8, n)
    outs, moved = run_data(b, 8, send, n)
    for o in outs:
        np.testing.assert_array_equal(o, sum(send))
    assert timed(net, b, 8) == moved


def test_topology_broadcasts_and_gathers_deliver_the_root_data() -> None:
    p, n, root = 4, 50, 0
    payload = data(1, n)[0]
    for name, rounds in planner.SEED_PLANS.items():
        for seg in (0, 7):
            b = plans.rounds_bcast(rounds, p, n, seg)
            bufs = [payload.copy() if r == root else np.full(n, np.nan) for r in range(p)]
            simulate.run([b(r) for r in range(p)], [[np.empty(0), x] for x in bufs])
            for x in bufs:
                np.testing.assert_array_equal(x, payload, err_msg=name)
    net = Network(presets.cluster(3, 2))
    hb = plans.hierarchical_bcast(planner._host_groups(net) or [], 3, n, 8, "ring", "binomial")
    bufs = [payload.copy() if r == 3 else np.full(n, np.nan) for r in range(6)]
    simulate.run([hb(r) for r in range(6)], [[np.empty(0), x] for x in bufs])
    for x in bufs:
        np.testing.assert_array_equal(x, payload)
    order = [0, 2, 3, 1]
    blk = 3
    displs = tuple(order[u] * blk for u in range(4))
    ag = plans.on_order(lambda v: registry.build("allgather", "ring", Spec(
        4, v, blk, counts=(blk,) * 4, displs=displs)), order)
    send = [np.arange(blk, dtype=np.float64) + 10 * r for r in range(4)]
    outs = [np.full(4 * blk, np.nan) for _ in range(4)]
    simulate.run([ag(r) for r in range(4)], [[send[r], outs[r]] for r in range(4)])
    for o in outs:
        np.testing.assert_array_equal(o, np.concatenate(send))


def _real_hier(comm: Any, n: int) -> list[float]:
    from ringworld.algorithms.executor import CollectiveRequest

    b = plans.hierarchical_allreduce([[0, 1], [2, 3]], n, "ring")
    send = data(comm.size, n)[comm.rank]
    out = np.full(n, np.nan)
    CollectiveRequest(comm._chan, b(comm.rank), [send, out], SUM, "hier",
                      inline=True).run_inline(30)
    return out.tolist()


def test_simulated_run_delivers_the_same_data_as_a_real_run() -> None:
    from ringworld.testing.processes import run_processes

    n = 103
    real = run_processes(4, _real_hier, n, timeout=60)
    b = plans.hierarchical_allreduce([[0, 1], [2, 3]], n, "ring")
    simulated, _ = run_data(b, 4, data(4, n), n)
    for r in range(4):
        assert real[r] == simulated[r].tolist()
        np.testing.assert_array_equal(simulated[r], sum(data(4, n)))


def test_events_and_lockstep_agree_on_a_ring() -> None:
    net = Network(presets.cluster(16, 4))
    n = 64 * 4096
    progs = Programs.rotational(lambda r: registry.build("allreduce", "ring", Spec(64, r, n)),
                                64, 4)
    assert progs is not None and progs.aligned
    ev = run_events(net, Programs.explicit(
        lambda r: registry.build("allreduce", "ring", Spec(64, r, n)), 64, 4))
    ls = run_lockstep(net, progs)
    assert ls.time == pytest.approx(ev.time, rel=0.05)
    assert ls.messages == ev.messages and ls.nbytes == ev.nbytes


def test_messages_above_the_eager_limit_pay_the_rendezvous() -> None:
    """A message of more than the sender's ``eager`` bytes arrives ``rendezvous`` later, in
    both executors; one of exactly ``eager`` bytes does not."""
    p, rdv = 64, 40e-6
    base = presets.cluster(16, 4)
    gpu = next(d for d in base.devices if d.kind == "gpu").params()
    assert gpu.rendezvous == 0.0  # the built-in constants carry none
    slow = Network(base.with_params("gpu", replace(gpu, rendezvous=rdv, eager=4096)))
    plain = Network(base)
    for per_block, extra in ((1024, 0.0), (1025, 2 * (p - 1) * rdv)):  # float32: 4096, 4100 B
        n = p * per_block

        def ring(r: int, n: int = n) -> Schedule:
            return registry.build("allreduce", "ring", Spec(p, r, n))

        rot = Programs.rotational(ring, p, 4)
        assert rot is not None
        exp = Programs.explicit(ring, p, 4)
        assert run_lockstep(slow, rot).time - run_lockstep(plain, rot).time == pytest.approx(
            extra, abs=1e-9)
        assert run_events(slow, exp).time - run_events(plain, exp).time == pytest.approx(
            extra, rel=0.02, abs=1e-9)


def test_rotation_is_refused_for_trees_and_uneven_blocks() -> None:
    def bino(r: int) -> Schedule:
        return registry.build("bcast", "binomial", Spec(70, r, 10))

    assert Programs.rotational(bino, 70, 4) is None
    assert Programs.rotational(lambda r: registry.build("allreduce", "ring",
                                                        Spec(70, r, 71)), 70, 4) is None


def test_contention_and_errors() -> None:
    net = Network(presets.seed_pcie_4gpu())
    nb = 1 << 20

    def two_cross(r: int) -> Schedule:  # 0->2 and 1->3 at once: both cross pcie0->cpu0
        if r in (0, 1):
            return schedule([step(sends=[Xfer(r + 2, RECV, 0, nb)])])
        return schedule([step(recvs=[Xfer(r - 2, RECV, 0, nb)])])

    def one_cross(r: int) -> Schedule:
        if r == 0:
            return schedule([step(sends=[Xfer(2, RECV, 0, nb)])])
        return schedule([step(recvs=[Xfer(0, RECV, 0, nb)])] if r == 2 else [])

    shared = run_events(net, Programs.explicit(two_cross, 4, 1)).time
    alone = run_events(net, Programs.explicit(one_cross, 4, 1)).time
    # the second message waits for its share of the link: one more message time
    assert shared - alone == pytest.approx(nb / presets.PCIE3_X16, rel=0.01)

    def deadlock(r: int) -> Schedule:
        return schedule([step(recvs=[Xfer(1 - r, RECV, 0, 4)]),
                         step(sends=[Xfer(1 - r, SEND, 0, 4)])])

    with pytest.raises(SimulationError, match="deadlock"):
        run_events(Network(presets.seed_pcie_4gpu(), 2), Programs.explicit(deadlock, 2, 4))

    def mismatch(r: int) -> Schedule:
        return schedule([step(sends=[Xfer(1, SEND, 0, 4)])] if r == 0 else
                        [step(recvs=[Xfer(0, RECV, 0, 5)])])

    with pytest.raises(SimulationError, match="expects"):
        run_events(Network(presets.seed_pcie_4gpu(), 2), Programs.explicit(mismatch, 2, 4))


def test_4096_rank_ring_allreduce_and_tree_bcast_are_fast() -> None:
    net = Network(presets.resolve("cluster:512:8"))
    assert net.p == 4096
    n = 64 << 20  # 256 MiB of float32
    t0 = time.perf_counter()
    progs = Programs.of(lambda r: registry.build("allreduce", "ring", Spec(4096, r, n)),
                        4096, 4)
    ring = sim(net, progs)
    ring_s = time.perf_counter() - t0
    assert ring.executor == "lockstep" and ring.messages == 4096 * 2 * 4095
    nic = 100e9 / 8
    assert ring.time > 2 * 4095 / 4096 * 4 * n / nic  # no faster than the NICs allow
    t0 = time.perf_counter()
    tree = sim(net, Programs.of(lambda r: registry.build("bcast", "binomial",
                                                          Spec(4096, r, n, 0)), 4096, 4))
    tree_s = time.perf_counter() - t0
    assert tree.messages == 4095 and tree.time > 12 * 4 * n / nic
    assert ring_s < 60 and tree_s < 60, (ring_s, tree_s)
