"""Planes that carry a job's calls outside Ringworld's own transports, chosen at start-up.

:mod:`ringworld.backends.mpi` runs the native API over mpi4py (``RINGWORLD_BACKEND=mpi``). The
device planes (NCCL for GPU memory, UCX for RDMA fabrics) will live here beside it, chosen by
the same tuning as the host transports.
"""
