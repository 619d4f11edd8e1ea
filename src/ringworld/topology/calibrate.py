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
memory system, so predictions from them alone were off by up to 3x here. ``fit`` adjusts the
five constants (multiplicatively, by coordinate descent on the mean squared log ratio) until
the simulated schedules match a set of measured collective calls; ``ringworld calibrate --fit``
measures that set, fits, and saves the result for the simulator and the tuner alike.
"""

from __future__ import annotations

import datetime
import json
import math
import platform
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ringworld.algorithms import registry
from ringworld.algorithms.schedule import Spec
from ringworld.errors import ConfigError
from ringworld.topology.discover import discover
from ringworld.topology.model import Params, Topology
from ringworld.topology.program import Programs
from ringworld.topology.sim import Network, simulate
from ringworld.tuning import constants as tuning_constants
from ringworld.tuning.cost import Constants

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
    return _params(c)


def local_topology(path: str | Path | None = None, nranks: int | None = None,
                   transport: str = "shm", sysfs: str | Path = "/sys",
                   constants: Constants | None = None) -> Topology:
    """This machine with CPU ranks (one per core, round-robin beyond) carrying calibrated
    constants (``constants`` if given, else those of the file ``path``). Raises ConfigError
    for a bad file."""
    found = discover(sysfs, nvidia_smi=lambda: None).topology
    p = params(path, transport) if constants is None else _params(constants)
    topo = found.with_params("core", p)
    return topo.with_ranks(nranks or topo.size)


def _params(c: Constants) -> Params:
    return Params(c.step, c.message, c.bandwidth, c.reduce_rate, c.copy_rate)


def predict(topo: Topology, collective: str, algorithm: str, nbytes: int,
            nranks: int) -> float:
    """Simulated seconds of the registry schedule the communicator would run.

    Raises:
        ValueError: unknown collective or algorithm.
    """
    p = nranks
    seg = SEGMENT_BYTES // 4
    if collective == "allgather":
        blk = max(1, nbytes // (4 * p))

        def spec(r: int) -> Spec:
            return Spec(p, r, blk)
    else:
        n = max(1, nbytes // 4)

        def spec(r: int) -> Spec:
            return Spec(p, r, n, 0, segment=seg)
    progs = Programs.explicit(lambda r: registry.build(collective, algorithm, spec(r)), p, 4)
    return simulate(Network(topo, p), progs).time


def measure_collectives(nranks: int, sizes: Sequence[int], collectives: Sequence[str],
                        transport: str = "shm", timeout: float = 600.0) -> list[dict[str, float]]:
    """Run the real collectives on ``nranks`` ranks; rows of collective, algorithm, bytes,
    seconds.

    Raises:
        RuntimeError: the job failed or printed no result.
    """
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
    measured: float

    @property
    def ratio(self) -> float:
        """predicted / measured (1.0 is a perfect prediction)."""
        return self.predicted / self.measured if self.measured > 0 else float("inf")


def compare(nranks: int, sizes: Sequence[int], collectives: Sequence[str],
            constants_path: str | Path | None = None, transport: str = "shm",
            timeout: float = 600.0, constants: Constants | None = None) -> list[Comparison]:
    """Measure the collectives for real and simulate them on the calibrated local topology
    (with ``constants``, else those of ``constants_path``, else the built-in defaults).

    Raises:
        RuntimeError: the measurement job failed; ConfigError: bad constants file.
    Cost: one job of about (algorithms x sizes x 0.3 s) plus a fraction of a second of
    simulation per row.
    """
    topo = local_topology(constants_path, nranks, transport, constants=constants)
    out = []
    for row in measure_collectives(nranks, sizes, collectives, transport, timeout):
        coll, algo, nb = str(row["collective"]), str(row["algorithm"]), int(row["bytes"])
        out.append(Comparison(coll, algo, nb, nranks, predict(topo, coll, algo, nb, nranks),
                              float(row["seconds"])))
    return out


FIELDS = ("step", "message", "bandwidth", "reduce_rate", "copy_rate")  # what fit adjusts


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
    t = topo.with_params("core", _params(c))
    return [math.log(predict(t, str(r["collective"]), str(r["algorithm"]), int(r["bytes"]),
                             nranks) / float(r["seconds"])) for r in rows]


def _score(errs: Sequence[float]) -> float:
    return math.sqrt(sum(e * e for e in errs) / max(1, len(errs)))


def fit(rows: Sequence[dict[str, float]], start: Constants, nranks: int,
        sysfs: str | Path = "/sys", rounds: int = 8) -> Fit:
    """Constants under which the simulator reproduces the measured ``rows`` (as returned by
    :func:`measure_collectives`) best, starting from ``start``.

    Coordinate descent in log space: each round tries scaling each constant by a few factors
    (shrinking from 2x to about 1.1x over the rounds) and keeps any change that lowers the
    root mean square of log(predicted / measured). ``sync`` is kept.

    Raises:
        ValueError: no rows, or a row with a non-positive time.
    Cost: rounds x 5 constants x 4 factors simulations of every row (a few ms each).
    """
    if not rows:
        raise ValueError("fit needs at least one measured row")
    if any(float(r["seconds"]) <= 0 for r in rows):
        raise ValueError("fit: every measured time must be positive")
    topo = discover(sysfs, nvidia_smi=lambda: None).topology.with_ranks(nranks)
    best = start
    errs = _errors(topo, rows, best, nranks)
    before = _score(errs), max(abs(math.exp(e) - 1) for e in errs)
    score = before[0]
    for k in range(rounds):
        step = 2.0 ** (1.0 / (1 + k))
        for name in FIELDS:
            for factor in (step, 1 / step, math.sqrt(step), 1 / math.sqrt(step)):
                trial = best._replace(**{name: getattr(best, name) * factor})
                e = _errors(topo, rows, trial, nranks)
                if _score(e) < score - 1e-9:
                    best, errs, score = trial, e, _score(e)
    return Fit(best, before[0], score, before[1], max(abs(math.exp(e) - 1) for e in errs))
