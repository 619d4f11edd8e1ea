"""Stand-ins for other packages, put on the ranks' path by ``ringworld run --mpi4py``.

:data:`PATH` holds an ``mpi4py`` package whose ``MPI`` is :mod:`ringworld.MPI`; the launcher
prepends it to ``PYTHONPATH`` only when asked, so nothing is shadowed otherwise.
"""

from __future__ import annotations

import os
from typing import Final

#: The directory to put on ``sys.path`` (it contains the ``mpi4py`` stand-in package).
PATH: Final[str] = os.path.dirname(os.path.abspath(__file__))
