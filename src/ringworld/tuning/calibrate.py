"""Calibrate the simulator on this machine and compare its predictions with real runs.

:func:`calibrate` measures the constants of :class:`~ringworld.tuning.cost.Constants` with the
tuner's two-rank job (:mod:`ringworld.tuning.measure`) and :func:`save` writes them in the
tuner's file format (``{"constants": {"shm": {...}}, ...}``), so one file serves both
``RINGWORLD_TUNING_FILE`` and ``--constants`` here. :func:`local_topology` is this machine
(:mod:`ringworld.topology.discover`) with its cores carrying those constants: ``overhead`` =
``step``, ``message``, ``engine`` = ``bandwidth`` (bytes a rank sends plus receives per second),
``reduce_rate``, ``copy_rate``.

:func:`compare` runs the real collectives (:mod:`ringworld.topology.measure_rank` under
``ringworld run``, each algorithm forced) and simulates the same registry schedules on the
local topology: predicted / measured per (collective, algorithm, size).

:func:`fit` goes one step further: the microbenchmarks behind :func:`calibrate` time one thing
at a time, while a collective overlaps copies, reductions and messages on cores that share one
memory system, and its buffers may stay in the cache; predictions from them alone were off by
up to 3x here. ``fit`` adjusts the five constants, the rate of direct peer reads (the
shared-memory algorithm's large paths), a cache model and the memory bus that ranks streaming at
once share (multiplicatively, by coordinate descent on the mean squared log ratio) until the
simulated schedules match a set of measured collective calls; ``ringworld calibrate --fit``
measures that set, fits, and saves the result for the simulator and the tuner alike.
"""

from __future__ import annotations

import datetime
import json
import math
import platform
import statistics
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ringworld.errors import ConfigError
from ringworld.topology.discover import discover
from ringworld.topology.model import Params, Topology
from ringworld.topology.sim import Network
from ringworld.tuning import constants as tuning_constants
from ringworld.tuning.cost import Constants
from ringworld.tuning.estimate import (
    bus_rate,
    cache_factor,
    core_params,
    schedule_time,
    shares_cores,
    shm_time,
    sped_up,
)

FORMAT = "ringworld-calibration"
SEGMENT_BYTES = 1 << 20  # the communicator's pipelining segment (Selector default)


def calibrate(transport: str = "shm", timeout: float = 300.0) -> Constants:
    """Measure this machine's constants over ``transport`` with a two-rank job.

    Raises:
        RuntimeError: the measurement job failed. Cost: about ten seconds.
    """
    from ringworld.tuning.cli import measure

    try:
        return measure(transport, timeout)
    except subprocess.TimeoutExpired as exc:
        raise RuntimeError(f"the {transport} measurement timed out after {timeout} s") from exc


def save(path: str | Path, table: dict[str, Constants]) -> None:
    """Write measured constants per transport (the tuner's file format plus provenance).

    Raises:
        OSError: the file cannot be written.
    """
    doc = {"format": FORMAT, "version": 1,
           "constants": {k: {f: v for f, v in c._asdict().items() if v != float("inf")}
                         for k, c in table.items()},
           "measured": datetime.datetime.now(datetime.UTC).isoformat(),
           "host": platform.node(), "python": platform.python_version()}
    Path(path).write_text(json.dumps(doc, indent=2) + "\n")


def params(path: str | Path | None, transport: str = "shm") -> Params:
    """The simulator's per-rank constants from a calibration file (built-in defaults when
    ``path`` is None).

    Raises:
        ConfigError: the file is unreadable or has no such transport.
    """
    table = tuning_constants.load(None if path is None else str(path))
    c = table.get(transport)
    if c is None:
        raise ConfigError(f"{path}: no constants for transport {transport!r}")
    return core_params(c)


def local_topology(path: str | Path | None = None, nranks: int | None = None,
                   transport: str = "shm", sysfs: str | Path = "/sys",
                   constants: Constants | None = None) -> Topology:
    """This machine with CPU ranks (one per core, round-robin beyond) carrying calibrated
    constants (``constants`` if given, else those of the file ``path``). Raises ConfigError
    for a bad file."""
    found = discover(sysfs, nvidia_smi=lambda: None).topology
    p = params(path, transport) if constants is None else core_params(constants)
    topo = found.with_params("core", p)
    return topo.with_ranks(nranks or topo.size)


# collectives whose measured size is the whole buffer of p blocks (the simulated call's n is one
# block): allgather's output, reduce_scatter_block's and alltoall's input
WHOLE = frozenset({"allgather", "reduce_scatter_block", "alltoall"})


def predict(topo: Topology, collective: str, algorithm: str, nbytes: int,
            nranks: int, speedup: float = 1.0, bus: float = 0.0) -> float:
    """Simulated seconds of the registry schedule the communicator would run for ``nbytes`` of
    float32 (for allgather the whole gathered buffer, for reduce_scatter_block and alltoall
    the whole send buffer, as the benchmark counts them), with the CPU ranks' byte rates
    multiplied by ``speedup`` (see :func:`cache_factor`), and the ranks sharing a memory bus
    of ``bus`` bytes/s (0: none; see :func:`~ringworld.tuning.estimate.schedule_time`).

    Raises:
        ValueError: unknown collective or algorithm.
    """
    p = nranks
    n = max(1, nbytes // (4 * p) if collective in WHOLE else nbytes // 4)
    return schedule_time(Network(sped_up(topo, speedup), p), collective, algorithm, n, 4,
                         SEGMENT_BYTES // 4, bus)


def predict_row(topo: Topology, c: Constants, collective: str, algorithm: str, nbytes: int,
                nranks: int) -> float:
    """Predicted seconds of one call as :mod:`ringworld.topology.measure_rank` times it: the
    shared-memory algorithm by its formula (it is not a message schedule), any other by
    simulating its schedule on ``topo`` (whose cores carry ``c``) with ``c``'s cache model
    and memory bus (:func:`~ringworld.tuning.estimate.bus_rate`). More ranks than ``topo``
    has cores share them (the simulator places them round-robin, the shared-memory formula
    takes its crowded paths).

    Raises:
        ValueError: unknown collective or algorithm.
    """
    if algorithm == "shm":
        n = nbytes / nranks if collective in WHOLE else nbytes
        return shm_time(c, collective, nranks, n, shares_cores(topo, nranks))
    return c.call + predict(topo, collective, algorithm, nbytes, nranks,
                            cache_factor(c, collective, nbytes, nranks),
                            bus_rate(c, collective, nbytes, nranks))


def measure_collectives(nranks: int, sizes: Sequence[int], collectives: Sequence[str],
                        transport: str = "shm", timeout: float = 600.0,
                        jobs: int = 1) -> list[dict[str, float]]:
    """Run the real collectives on ``nranks`` ranks in ``jobs`` jobs, one after another; rows
    of collective, algorithm, bytes, seconds (the median over the jobs) and spread (the
    slowest job's seconds over the fastest's).

    Raises:
        RuntimeError: a job failed or printed no result.
        ValueError: ``jobs`` < 1.
    Cost: ``jobs`` x (cells x about 0.3 s).
    """
    if jobs < 1:
        raise ValueError(f"jobs={jobs} must be at least 1")
    return _median_rows([_measure_job(nranks, sizes, collectives, transport, timeout)
                         for _ in range(jobs)])


def measure_held_out(nranks: int, fit_sizes: Sequence[int], check_sizes: Sequence[int],
                     collectives: Sequence[str], transport: str = "shm", timeout: float = 600.0,
                     jobs: int = 1) -> tuple[list[dict[str, float]], list[dict[str, float]]]:
    """Rows to fit constants to (at ``fit_sizes``) and held-out rows to check them against (at
    ``check_sizes``), as :func:`measure_collectives` gives, from ``jobs`` jobs of each kind run
    alternately (fit, check, fit, ...): a shared machine's load drifts over minutes, and
    alternating lets both sets see the same mix of it while no job serves both.

    Raises:
        RuntimeError: a job failed or printed no result.
        ValueError: ``jobs`` < 1.
    """
    if jobs < 1:
        raise ValueError(f"jobs={jobs} must be at least 1")
    fit_runs, check_runs = [], []
    for _ in range(jobs):
        fit_runs.append(_measure_job(nranks, fit_sizes, collectives, transport, timeout))
        check_runs.append(_measure_job(nranks, check_sizes, collectives, transport, timeout))
    return _median_rows(fit_runs), _median_rows(check_runs)


def _median_rows(runs: Sequence[Sequence[dict[str, float]]]) -> list[dict[str, float]]:
    """Each cell's median seconds over the runs, with the spread (slowest over fastest)."""
    rows = []
    for cells in zip(*runs, strict=True):
        times = [float(c["seconds"]) for c in cells]
        rows.append({**cells[0], "seconds": statistics.median(times),
                     "spread": max(times) / min(times) if min(times) > 0 else math.inf})
    return rows


def _measure_job(nranks: int, sizes: Sequence[int], collectives: Sequence[str],
                 transport: str, timeout: float) -> list[dict[str, float]]:
    argv = [sys.executable, "-m", "ringworld", "run", "-n", str(nranks), "--transport",
            transport, sys.executable, "-m", "ringworld.topology.measure_rank", "--sizes",
            ",".join(map(str, sizes)), "--collectives", ",".join(collectives)]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                              check=False)
    except subprocess.TimeoutExpired as exc:
        raise RuntimeError(f"the measurement job timed out after {timeout} s") from exc
    for line in proc.stdout.splitlines():
        if line.startswith("RINGWORLD_MEASURE "):
            rows: list[dict[str, float]] = json.loads(line.split(" ", 1)[1])
            return rows
    raise RuntimeError(f"the measurement job failed (exit {proc.returncode}):\n"
                       f"{proc.stdout[-2000:]}{proc.stderr[-2000:]}")


@dataclass(frozen=True, slots=True)
class Comparison:
    """Predicted and measured seconds of one collective call."""

    collective: str
    algorithm: str
    nbytes: int
    ranks: int
    predicted: float
    measured: float  # the median over the measurement jobs
    spread: float = 1.0  # the slowest job's time over the fastest's

    @property
    def ratio(self) -> float:
        """predicted / measured (1.0 is a perfect prediction)."""
        return self.predicted / self.measured if self.measured > 0 else float("inf")


def compare(nranks: int, sizes: Sequence[int], collectives: Sequence[str],
            constants_path: str | Path | None = None, transport: str = "shm",
            timeout: float = 600.0, constants: Constants | None = None,
            jobs: int = 1) -> list[Comparison]:
    """Measure the collectives for real (the median of ``jobs`` jobs) and simulate them on the
    calibrated local topology (with ``constants``, else those of ``constants_path``, else the
    built-in defaults).

    Raises:
        RuntimeError: the measurement job failed; ConfigError: bad constants file.
    Cost: ``jobs`` jobs of about (algorithms x sizes x 0.3 s) each, plus a fraction of a second of
    simulation per row.
    """
    if constants is None:
        c = tuning_constants.load(None if constants_path is None else str(constants_path)).get(
            transport)
        if c is None:
            raise ConfigError(f"{constants_path}: no constants for transport {transport!r}")
        constants = c
    return compare_rows(measure_collectives(nranks, sizes, collectives, transport, timeout,
                                            jobs), nranks, constants)


def compare_rows(rows: Sequence[dict[str, float]], nranks: int,
                 constants: Constants) -> list[Comparison]:
    """Predict each measured row (as :func:`measure_collectives` gives) on the local topology
    with ``constants`` (:func:`predict_row`). Cost: a fraction of a second of simulation per
    row."""
    topo = local_topology(nranks=nranks, constants=constants)
    out = []
    for row in rows:
        coll, algo, nb = str(row["collective"]), str(row["algorithm"]), int(row["bytes"])
        t = predict_row(topo, constants, coll, algo, nb, nranks)
        out.append(Comparison(coll, algo, nb, nranks, t, float(row["seconds"]),
                              float(row.get("spread", 1.0))))
    return out


# what fit adjusts: the rates and latencies, the cache model (see cache_factor) and the bus;
# where the ranks outnumber the cores also the flag barrier, which then costs them turns on the
# cores (the two-rank microbenchmark that measures it cannot see that)
FIELDS = ("step", "message", "bandwidth", "reduce_rate", "copy_rate", "read_rate",
          "rendezvous", "cache_bytes", "cache_speedup", "call", "bus_rate")
CROWDED_FIELDS = (*FIELDS, "sync")
RATES = ("bandwidth", "reduce_rate", "copy_rate", "read_rate")  # also moved in pairs


@dataclass(frozen=True, slots=True)
class Fit:
    """The outcome of :func:`fit`: the constants, and the error before and after."""

    constants: Constants
    rms_before: float  # root mean square of log(predicted / measured), before fitting
    rms_after: float
    worst_before: float  # largest |predicted / measured - 1|
    worst_after: float


def _errors(topo: Topology, rows: Sequence[dict[str, float]], c: Constants,
            nranks: int) -> list[float]:
    t = topo.with_params("core", core_params(c))
    out = []
    for r in rows:
        sim = predict_row(t, c, str(r["collective"]), str(r["algorithm"]), int(r["bytes"]),
                          nranks)
        out.append(math.log(sim / float(r["seconds"])))
    return out


def _score(errs: Sequence[float]) -> float:
    return math.sqrt(sum(e * e for e in errs) / max(1, len(errs)))


def fit(rows: Sequence[dict[str, float]], start: Constants, nranks: int,
        sysfs: str | Path = "/sys", rounds: int = 8) -> Fit:
    """Constants under which the simulator reproduces the measured ``rows`` (as returned by
    :func:`measure_collectives`) best, starting from ``start``.

    Coordinate descent in log space: each round tries scaling each constant by a few factors
    (shrinking from 2x to about 1.1x over the rounds), and each pair of rates (RATES) by one
    factor up and the other down, and keeps any change that lowers the root mean square of
    log(predicted / measured); where the ranks outnumber the cores also ``sync``. Without a
    cache model in ``start``, three starts are tried (a 2x speed-up up to a quarter or half of
    this machine's last-level cache, and none), and without a bus rate each of them twice (a
    bus that every rank copying at once fills, and one 8x wider); the best fit is kept.

    Raises:
        ValueError: no rows, or a row with a non-positive time.
    Cost: up to 6 starts x rounds x 60 simulations of every row (a few ms each): seconds for a
    few dozen rows.
    """
    if not rows:
        raise ValueError("fit needs at least one measured row")
    if any(float(r["seconds"]) <= 0 for r in rows):
        raise ValueError("fit: every measured time must be positive")
    topo = discover(sysfs, nvidia_smi=lambda: None).topology.with_ranks(nranks)
    errs = _errors(topo, rows, start, nranks)
    before = _score(errs), max(abs(math.exp(e) - 1) for e in errs)
    if start.read_rate <= 0:  # what 0 means (see Constants), as a value descent can scale
        start = start._replace(read_rate=start.reads)
    if start.rendezvous <= 0:  # a value to scale from (descent can take it down 6x and more)
        start = start._replace(rendezvous=start.step / 4)
    if start.call <= 0:  # fits put it at 1.5-2 steps: start near, or descent cannot reach it
        start = start._replace(call=start.step)
    starts = [start]
    if start.cache_bytes <= 0:  # coordinate descent cannot find the cache's step by itself
        llc = float(_cache_size(sysfs))
        starts = [start._replace(cache_bytes=llc / k, cache_speedup=2.0) for k in (4, 2)]
        starts.append(start._replace(cache_bytes=llc, cache_speedup=1.0))
    if start.bus_rate <= 0:  # bound where every rank copies at once, and never
        starts = [s._replace(bus_rate=k * nranks * start.copy_rate)
                  for s in starts for k in (2, 16)]
    best, score = start, math.inf
    for s0 in starts:
        c, sc = _descend(topo, rows, s0, nranks, rounds,
                         CROWDED_FIELDS if shares_cores(topo, nranks) else FIELDS)
        if sc < score:
            best, score = c, sc
    errs = _errors(topo, rows, best, nranks)
    return Fit(best, before[0], score, before[1], max(abs(math.exp(e) - 1) for e in errs))


def _descend(topo: Topology, rows: Sequence[dict[str, float]], start: Constants, nranks: int,
             rounds: int, fields: Sequence[str]) -> tuple[Constants, float]:
    best = start
    score = _score(_errors(topo, rows, best, nranks))
    for k in range(rounds):
        step = 2.0 ** (1.0 / (1 + k))
        for name in fields:
            for factor in (step, 1 / step, math.sqrt(step), 1 / math.sqrt(step)):
                trial = best._replace(**{name: getattr(best, name) * factor})
                sc = _score(_errors(topo, rows, trial, nranks))
                if sc < score - 1e-9:
                    best, score = trial, sc
        # rates that trade off (a call that reads and copies fits any read rate with the
        # matching copy rate) lie along valleys that moves of one constant at a time cannot
        # follow: move them in pairs too, one up and the other down
        for i, a in enumerate(RATES):
            for b in RATES[i + 1 :]:
                for factor in (step, 1 / step):
                    trial = best._replace(**{a: getattr(best, a) * factor,
                                             b: getattr(best, b) / factor})
                    sc = _score(_errors(topo, rows, trial, nranks))
                    if sc < score - 1e-9:
                        best, score = trial, sc
    return best, score


def _cache_size(sysfs: str | Path) -> int:
    """The largest CPU cache of cpu0 in bytes (sysfs), else 32 MiB."""
    best = 0
    for d in Path(sysfs, "devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            text = (d / "size").read_text().strip()
        except OSError:
            continue
        mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:].upper(), 1)
        digits = text[:-1] if text[-1:].isalpha() else text
        if digits.isdigit():
            best = max(best, int(digits) * mult)
    return best or 32 << 20
