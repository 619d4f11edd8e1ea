"""Test harnesses: run a function on every rank of a real multi-process job.

:func:`run_processes` forks one process per rank (cheap, no interpreter start-up) and gives each
the job environment the launcher would; use it for failure semantics and real transports.
"""

from ringworld.testing.processes import RankFailed, run_processes

__all__ = ["RankFailed", "run_processes"]
