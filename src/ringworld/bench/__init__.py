"""Benchmarks: ``ringworld bench ...``.

``pingpong``       point-to-point latency, bandwidth, object round trips and start-up time,
                   optionally side by side with MPICH (mpi4py) and a plain Python socket stream.

Rank-side programs (``pingpong_rank.py``, ``barrier_rank.py``) import only the standard library
and numpy at import time, so the same files run under ``ringworld run`` and under MPICH's
``mpiexec`` in a virtual environment without Ringworld.
"""
