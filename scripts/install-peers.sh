#!/usr/bin/env bash
# Install the peer libraries for side-by-side benchmarks into a venv outside the repository.
#
#   scripts/install-peers.sh [VENV]        (default VENV: /tmp/peers)
#   ringworld bench pingpong --against mpi4py --mpi-python VENV/bin/python
#   (or: export RINGWORLD_MPI_PYTHON=VENV/bin/python)
#
# MPICH comes as a wheel (pip install mpich) with mpiexec in VENV/bin; mpi4py finds its libmpi.
set -euo pipefail
venv="${1:-/tmp/peers}"
python="${PYTHON:-python3}"
if [ ! -x "$venv/bin/python" ]; then
    "$python" -m venv "$venv"
fi
"$venv/bin/pip" install --quiet numpy mpi4py mpich
"$venv/bin/python" - <<'PY'
from mpi4py import MPI
import numpy
print(MPI.Get_library_version().splitlines()[0].strip(), "| numpy", numpy.__version__)
PY
echo "peers ready: --mpi-python $venv/bin/python   (mpiexec: $venv/bin/mpiexec)"
