"""Side-by-side tables of ``bench pingpong`` results.

Ratios compare each Ringworld run with each peer: ``ringworld / peer`` for times (below 1 is
faster) and for bandwidths (above 1 is faster). The socket peer is compared with TCP only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ringworld.bench.runners import RunResult

Getter = Callable[[dict[str, Any]], float | None]


def fmt_size(nbytes: int) -> str:
    """``0 B``, ``64 B``, ``4 KiB``, ``64 MiB``."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift and nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift} {unit}"
    return f"{nbytes} B"


def _num(value: float | None) -> str:
    if value is None:
        return "-"
    if value >= 1000:
        return f"{value:.0f}"
    if value >= 100:
        return f"{value:.1f}"
    if value >= 1:
        return f"{value:.2f}"
    return f"{value:.3f}"


def _ratio(a: float | None, b: float | None) -> str:
    if a is None or b is None or b == 0:
        return "-"
    return f"{a / b:.2f}x"


def display_name(run: RunResult) -> str:
    """A short column name: ``rw-shm``, ``rw-tcp``, ``mpich``, ``openmpi``, ``socket``."""
    if run.backend == "ringworld":
        return f"rw{'MPI' if run.label.startswith('ringworldMPI') else ''}-{run.transport}"
    if run.backend == "mpi4py":
        lib = run.library.lower()
        if "mpich" in lib:
            return "mpich"
        if "open mpi" in lib:
            return "openmpi"
    return run.backend


def _ratio_name(mine: RunResult, peer: RunResult) -> str:
    """A ratio column's name: ``shm/mpich``, ``MPI-shm/mpich`` (through ringworld.MPI)."""
    return f"{display_name(mine).removeprefix('rw-').removeprefix('rw')}/{display_name(peer)}"


def ratio_pairs(runs: Sequence[RunResult]) -> list[tuple[RunResult, RunResult]]:
    """(ringworld run, peer run) pairs that get a ratio column."""
    mine = [r for r in runs if r.backend == "ringworld"]
    peers = [r for r in runs if r.backend != "ringworld"]
    return [
        (m, p) for p in peers for m in mine if not (p.backend == "socket" and m.transport != "tcp")
    ]


def render_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Columns right-aligned to their widest cell, the first left-aligned."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        first = cells[0].ljust(widths[0])
        rest = (c.rjust(w) for c, w in zip(cells[1:], widths[1:], strict=True))
        return "  ".join([first, *rest]).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths]), *map(line, rows)])


def _by_size(run: RunResult, kernel: str) -> dict[int, dict[str, Any]]:
    return {int(row["size"]): row for row in run.data.get(kernel) or []}


def _size_table(
    runs: Sequence[RunResult], kernel: str, get: Getter, title: str
) -> str | None:
    tables = {id(r): _by_size(r, kernel) for r in runs}
    sizes = sorted({s for t in tables.values() for s in t})
    if not sizes:
        return None
    pairs = ratio_pairs(runs)
    headers = ["size", *(display_name(r) for r in runs)]
    headers += [_ratio_name(m, p) for m, p in pairs]
    rows = []
    for size in sizes:

        def value(run: RunResult, size: int = size) -> float | None:
            row = tables[id(run)].get(size)
            return None if row is None else get(row)

        if all(value(r) is None for r in runs):
            continue
        cells = [fmt_size(size), *(_num(value(r)) for r in runs)]
        cells += [_ratio(value(m), value(p)) for m, p in pairs]
        rows.append(cells)
    if not rows:
        return None
    return f"{title}\n{render_table(headers, rows)}"


def _scalar_table(
    runs: Sequence[RunResult], get: Callable[[RunResult], float | None], title: str, what: str
) -> str | None:
    values = {id(r): get(r) for r in runs}
    if all(v is None for v in values.values()):
        return None
    pairs = ratio_pairs(runs)
    headers = ["", *(display_name(r) for r in runs)]
    headers += [_ratio_name(m, p) for m, p in pairs]
    cells = [what, *(_num(values[id(r)]) for r in runs)]
    cells += [_ratio(values[id(m)], values[id(p)]) for m, p in pairs]
    return f"{title}\n{render_table(headers, [cells])}"


def _object_us(run: RunResult) -> float | None:
    obj = run.data.get("object")
    return None if not obj else float(obj["half_rtt_us"])


def _startup_s(run: RunResult) -> float | None:
    if not run.startup or "median_s" not in run.startup:
        return None
    return float(run.startup["median_s"])


def _cpu_cores(row: dict[str, Any]) -> float | None:
    cores = row.get("cpu_cores")  # (absent from results written before it was measured)
    return None if cores is None or not row["size"] else float(cores)


def _nonzero(key: str) -> Getter:
    def get(row: dict[str, Any]) -> float | None:
        return float(row[key]) if row["size"] else None

    return get


def render(runs: Sequence[RunResult], np: int, startup_np: int) -> str:
    """Every table for the runs that produced data, then verification and failures."""
    header = ["runs:", *(f"  {display_name(r):8} {r.library}" for r in runs)]
    header.append(
        "ratios: ringworld / peer; for times below 1 is faster, for bandwidths above 1 is faster"
    )
    parts = ["\n".join(header)]
    have = [r for r in runs if r.data]
    sections = [
        _size_table(have, "latency", lambda row: float(row["half_rtt_us"]),
                    f"ping-pong half round trip, us (np={np}, median of repeats)"),
        _size_table(have, "latency", _nonzero("pingpong_GBps"),
                    "ping-pong bandwidth, GB/s (size / half round trip; 1 GB = 1e9 bytes)"),
        _size_table(have, "stream", _nonzero("GBps"),
                    "streaming bandwidth, GB/s (osu_bw style: a window of isends, then one ack)"),
        _size_table(have, "stream", _cpu_cores,
                    "CPU while streaming, cores (both ranks' CPU time / wall time; below 1 in "
                    "the ratio: leaner)"),
        _scalar_table(have, _object_us, "small object send_obj/recv_obj", "half RTT, us"),
        _scalar_table([r for r in runs if r.startup], _startup_s,
                      f"start-up: whole command, np={startup_np}, one barrier (median)",
                      "seconds"),
    ]
    parts += [s for s in sections if s]
    verify = ["verification:"]
    for r in runs:
        v = r.data.get("verify")
        if v is None:
            verify.append(f"  {display_name(r):8} no report")
        else:
            state = "ok" if r.errors == 0 else "WRONG"
            verify.append(
                f"  {display_name(r):8} {state}: {v['checks']} checks, {v['wrong_bytes']} wrong "
                f"bytes, {v['wrong_counts']} wrong counts, {v['wrong_objects']} wrong objects"
            )
    parts.append("\n".join(verify))
    failures = [r for r in runs if r.error or (r.startup and "error" in r.startup)]
    for r in failures:
        if r.error:
            parts.append(f"FAILED {display_name(r)}: {r.error}")
        if r.startup and "error" in r.startup:
            parts.append(f"FAILED {display_name(r)} start-up: {r.startup['error']}")
    return "\n\n".join(parts)
