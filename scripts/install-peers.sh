#!/usr/bin/env bash
# Install the peer libraries for side-by-side benchmarks into a venv outside the repository.
#
#   scripts/install-peers.sh [--torch] [VENV]      (default VENV: /tmp/peers)
#   ringworld bench pingpong --against mpi4py --mpi-python VENV/bin/python
#   ringworld bench allreduce --against mpi4py --against gloo --mpi-python VENV/bin/python
#   (or: export RINGWORLD_MPI_PYTHON=VENV/bin/python; gloo also looks there)
#
# MPICH comes as a wheel (pip install mpich) with mpiexec in VENV/bin; mpi4py finds its libmpi.
# --torch (or RINGWORLD_PEERS_TORCH=1) also installs torch for the gloo peer: a CPU build,
# about 200 MB, so CI leaves it out. Version: RINGWORLD_PEERS_TORCH_VERSION (default 2.13.0).
set -euo pipefail
torch="${RINGWORLD_PEERS_TORCH:-0}"
if [ "${1:-}" = "--torch" ]; then
    torch=1
    shift
fi
venv="${1:-/tmp/peers}"
python="${PYTHON:-python3}"
if [ ! -x "$venv/bin/python" ]; then
    "$python" -m venv "$venv"
fi
"$venv/bin/pip" install --quiet numpy mpi4py mpich
if [ "$torch" = 1 ]; then
    # PyPI's Linux torch pulls CUDA wheels of several GB; where no CPU wheel is at hand
    # (pip's find-links), set RINGWORLD_PEERS_TORCH_INDEX=https://download.pytorch.org/whl/cpu
    index=()
    if [ -n "${RINGWORLD_PEERS_TORCH_INDEX:-}" ]; then
        index=(--extra-index-url "$RINGWORLD_PEERS_TORCH_INDEX")
    fi
    "$venv/bin/pip" install --quiet "torch==${RINGWORLD_PEERS_TORCH_VERSION:-2.13.0}" "${index[@]}"
fi
"$venv/bin/python" - <<'PY'
import importlib.util
from mpi4py import MPI
import numpy
print(MPI.Get_library_version().splitlines()[0].strip(), "| numpy", numpy.__version__)
if importlib.util.find_spec("torch"):
    import torch.distributed
    print("torch", torch.__version__, "| gloo:", torch.distributed.is_gloo_available())
PY
echo "peers ready: --mpi-python $venv/bin/python   (mpiexec: $venv/bin/mpiexec)"
