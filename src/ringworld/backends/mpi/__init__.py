"""The MPI backend: the native Ringworld API over mpi4py and the MPI library installed.

``ringworld.init(backend="mpi")`` (or ``RINGWORLD_BACKEND=mpi``) under ``mpiexec``/``srun``
returns an :class:`MpiComm` for ``MPI.COMM_WORLD``: the same methods, arguments, results and
errors as the native communicator (point to point with ``_obj`` forms, probe, sendrecv, every
collective with its ``i`` form and object form, dup/split/create/free), each implemented with
mpi4py calls, so a program scales onto a cluster's tuned MPI (InfiniBand, ...) unchanged.

* Buffers move as bytes (any contiguous dtype); reductions use MPI's predefined ops where MPI
  defines them for the dtype, and ``MPI.Op.Create`` over the ringworld op's numpy code
  otherwise (user ops, MAXLOC/MINLOC pairs, float16); non-commutative ops keep rank order.
* Timeouts: with ``timeout=`` (or a default timeout) waits poll MPI until the deadline; a
  receive that times out is withdrawn, a collective stays in flight (the communicator is then
  unusable, as in MPI). Without one, calls block inside MPI.
* Differences: a large ``send`` may wait for the receiver to post (MPI's protocol); object
  collectives are mpi4py's blocking pickle calls; ``algorithm=`` is ignored
  (``last_algorithm == "mpi"``); ``revoke``/``agree``/``shrink`` and shared-memory windows are
  not provided. ``ringworld.MPI`` always runs on the native backend (use mpi4py itself).

mpi4py is optional: ``import ringworld`` (and this package) never imports it; only
:func:`init_world` does. Errors from MPI are raised as :class:`~ringworld.CommError` from the
``MPI.Exception``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ringworld.errors import ConfigError

if TYPE_CHECKING:
    from ringworld.backends.mpi._comm import MpiComm

__all__ = ["init_world"]


def init_world(timeout: float | None = None, *, expect_size: int = 1) -> MpiComm:
    """The world communicator over ``MPI.COMM_WORLD`` (initialising MPI if needed).

    ``timeout`` is the default timeout of blocking calls; ``expect_size`` > 1 (the job size
    ``ringworld run`` announced) must equal MPI's world size.

    Raises:
        ConfigError: mpi4py or its MPI library is missing, ``mpi4py`` is Ringworld's own
            stand-in (``ringworld run --mpi4py``), or MPI's world size is not ``expect_size``.
    Cost: ``MPI_Init`` on first use (loads the MPI library).
    """
    try:
        from mpi4py import MPI
    except ImportError as exc:
        raise ConfigError(
            "backend='mpi' needs mpi4py and an MPI library: `pip install mpi4py mpich` (or "
            "mpi4py built against your cluster's MPI), then start the program with mpiexec or "
            f"srun ({exc})") from exc
    except RuntimeError as exc:  # mpi4py present, libmpi not loadable
        raise ConfigError(f"backend='mpi': mpi4py cannot load an MPI library: {exc}") from exc
    vendor = getattr(MPI, "get_vendor", lambda: ("", ()))()[0]
    if vendor == "Ringworld":
        raise ConfigError("backend='mpi' found Ringworld's stand-in mpi4py (ringworld run "
                          "--mpi4py); use the real mpi4py under mpiexec, or the native backend")
    from ringworld.backends.mpi._comm import MpiComm
    from ringworld.backends.mpi._requests import Poller

    world = MPI.COMM_WORLD
    if expect_size > 1 and world.Get_size() != expect_size:
        raise ConfigError(
            f"backend='mpi': MPI's world has {world.Get_size()} process(es) but this job has "
            f"{expect_size} ranks (ringworld run starts no MPI job: start it with mpiexec)")
    return MpiComm(world, Poller(world.Get_rank(), timeout), "world", predefined=True)
