"""The device plane: GPU memory moved by NCCL, beside the host transports.

A buffer in CUDA memory (a torch CUDA tensor, a CuPy array, anything with
``__cuda_array_interface__`` or DLPack on a CUDA device) given to a communicator's call runs
here instead of on the host paths: :mod:`~ringworld.device.buffers` describes it,
:mod:`~ringworld.device.nccl` loads NVIDIA's binding (``nccl4py``) and library,
:mod:`~ringworld.device.cuda` is the little of the CUDA runtime the plane needs (devices, events),
and :mod:`~ringworld.device.plane` runs the calls on an NCCL communicator made lazily per
Ringworld communicator. Nothing here is imported by ``import ringworld``; the modules that need
the optional packages import them on first use and say how to install them when they are missing.
"""
