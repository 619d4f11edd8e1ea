"""Benchmarks: ``ringworld bench ...``.

``pingpong``       point-to-point latency, bandwidth, object round trips and start-up time,
                   optionally side by side with MPICH (mpi4py) and a plain Python socket stream.
``allreduce``, ``bcast``, ``reduce``, ``allgather``, ``reduce_scatter``, ``alltoall``, ``gather``,
``scatter``, ``barrier``, ``scan``
                   nccl-tests-style size sweeps (``sweep.py``, ranks: ``sweep_rank.py``),
                   optionally side by side with MPICH (mpi4py) and torch.distributed's gloo
                   (ranks started by ``gloo_launch.py``).

Rank-side programs (``pingpong_rank.py``, ``barrier_rank.py``, ``sweep_rank.py``) and
``gloo_launch.py`` import only the standard library
and numpy at import time, so the same files run under ``ringworld run`` and under MPICH's
``mpiexec`` in a virtual environment without Ringworld.
"""
