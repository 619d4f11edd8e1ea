"""The failure report ``ringworld run`` prints when a job fails: one root cause, stated plainly.

Example::

    ringworld: job a1b2c3d4 failed: rank 2 (pid 4242) exited with code 3
    ringworld: other ranks: 0, 1, 3 stopped by ringworld
    ringworld: last 2 stderr lines of rank 2:
      | Traceback (most recent call last):
      | ValueError: bad input

A rank that stopped responding is the cause, the ranks that failed on seeing it are not::

    ringworld: job a1b2c3d4 failed: rank 1 (pid 4243) stopped responding: no heartbeat for 3.0 s
    (liveness timeout 3 s; stopped, hung in native code, or cut off), found by rank 0; its
    process is stopped
    ringworld: other ranks: rank 2 stopped by ringworld; rank 0 exited with code 1 because of it
    (peer failure)
"""

from __future__ import annotations

from ringworld.launch._proc import signal_name
from ringworld.launch.procset import JobResult, RankExit


def _ranks(exits: list[RankExit]) -> str:
    word = "rank" if len(exits) == 1 else "ranks"
    return f"{word} {', '.join(str(e.rank) for e in exits)}"


def failure_report(result: JobResult, job_id: str, size: int, recovery: bool = False) -> str:
    """The text to print on stderr for a failed or interrupted job; empty if the job succeeded.

    With ``recovery`` (``--enable-recovery``) a failure is reported as a lost rank the others
    ran on without.
    """
    lines: list[str] = []
    root = result.root_cause
    if root is not None and recovery:
        lines.append(
            f"ringworld: job {job_id} lost rank {root.rank} (pid {root.pid}): {root.describe()};"
            " the other ranks ran on (--enable-recovery)"
        )
    elif root is not None:
        lines.append(
            f"ringworld: job {job_id} failed: rank {root.rank} (pid {root.pid}) {root.describe()}"
        )
    elif result.interrupted_by is not None:
        lines.append(
            f"ringworld: job {job_id} interrupted by {signal_name(result.interrupted_by)}; "
            "stopped all ranks"
        )
    else:
        return ""
    others = [e for e in result.exits if e is not root]
    groups: list[str] = []
    stopped = [e for e in others if e.stopped]
    finished = [e for e in others if not e.stopped and not e.failed]
    failed = [e for e in others if not e.stopped and e.failed]
    if root is not None:
        unresponsive = [e for e in stopped if e.unresponsive is not None]
        stopped = [e for e in stopped if e.unresponsive is None]
        if stopped:
            groups.append(f"{_ranks(stopped)} stopped by ringworld")
        groups.extend(f"rank {e.rank} stopped responding" for e in unresponsive)
        groups.extend(f"rank {e.rank} {e.describe()}" for e in failed if not e.secondary)
        consequences: dict[str, list[RankExit]] = {}
        for e in failed:
            if e.secondary:
                consequences.setdefault(e.describe(), []).append(e)
        groups.extend(f"{_ranks(group)} {how} because of it (peer failure)"
                      for how, group in consequences.items())
        if finished:
            groups.append(f"{_ranks(finished)} had finished")
        missing = size - len(result.exits)
        if missing > 0:
            groups.append(f"{missing} never started")
        if groups:
            lines.append(f"ringworld: other ranks: {'; '.join(groups)}")
        tail = result.stderr_tails.get(root.rank, ())
        if tail:
            lines.append(f"ringworld: last {len(tail)} stderr lines of rank {root.rank}:")
            lines.extend(f"  | {line}" for line in tail)
        else:
            lines.append(f"ringworld: rank {root.rank} wrote nothing to stderr")
    return "\n".join(lines) + "\n"


def job_exit_code(result: JobResult) -> int:
    """The launcher's exit status: the root cause's, else 128 + the interrupting signal, else 0.

    A failure seen before the interrupt wins; otherwise an interrupted job exits 128 + signum (130
    for Ctrl-C) even if every rank exited cleanly on receiving it. A root cause that stopped
    responding has no status of its own (the launcher killed it): the job exits with that of the
    lowest rank that failed on its own (because of it, typically), else 1.
    """
    root = result.root_cause
    if root is not None and root.unresponsive is not None:
        return next((e.exit_code for e in result.exits
                     if e.failed and not e.stopped and e.rank != root.rank), 1)
    if root is not None:
        return root.exit_code
    if result.interrupted_by is not None:
        return 128 + result.interrupted_by
    for e in result.exits:
        if e.failed:
            return e.exit_code
    return 0


def recovery_exit_code(result: JobResult) -> int:
    """The exit status of a job run with ``--enable-recovery``: whether the survivors finished.

    The lost ranks are the root cause, the ranks that stopped responding (the launcher killed
    them) and any rank killed by a signal the launcher did not send; the others are survivors.
    Returns the first failing survivor's status, else 128 + the interrupting signal, else 0 if any
    survivor finished, else the root cause's status (1 for one that stopped responding).
    """
    root = result.root_cause
    lost = {e.rank for e in result.exits
            if (root is not None and e.rank == root.rank) or e.unresponsive is not None
            or (e.returncode < 0 and not e.stopped)}
    survivors = [e for e in result.exits if e.rank not in lost]
    for e in survivors:
        if e.failed:
            return e.exit_code
    if result.interrupted_by is not None:
        return 128 + result.interrupted_by
    if survivors or root is None:
        return 0
    return 1 if root.unresponsive is not None else root.exit_code
