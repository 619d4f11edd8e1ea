"""Start-up probe: initialise, call barrier once, exit.

Run as ``python barrier_rank.py ringworld`` under ``ringworld run`` or as
``python barrier_rank.py mpi4py`` under ``mpiexec``; the caller times the whole command.
Imports nothing but the chosen library, so the wall clock is the library's own start-up.
"""

from __future__ import annotations

import sys


def main(argv: list[str]) -> int:
    """Run the probe for the backend named in ``argv[0]``."""
    backend = argv[0] if argv else "ringworld"
    if backend == "ringworld":
        import ringworld

        ringworld.init().barrier()
        ringworld.finalize()
    elif backend == "mpi4py":
        from mpi4py import MPI

        MPI.COMM_WORLD.Barrier()
    else:
        print(f"barrier_rank: unknown backend {backend!r}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
