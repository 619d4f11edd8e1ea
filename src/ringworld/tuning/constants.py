"""Default cost-model constants, per transport, with where they come from.

Measured on the project's reference machine (2-core AMD EPYC VM, Python 3.11, numpy 2.4) on
2026-11-29 with ``ringworld tune`` (np=2; see :mod:`ringworld.tuning.measure` for exactly what
each figure times): ``step`` is one 8-byte recursive-doubling allreduce (a dependent message
step including the executor's Python overhead), ``message`` each extra message in a step,
``bandwidth`` bytes sent plus received per second in a 16 MiB exchange, ``reduce_rate`` and
``copy_rate`` numpy ``add(out=)`` and ``copyto`` on 32 MiB, ``sync`` one shared-memory flag
barrier. ``ringworld tune --save`` writes re-measured values to a JSON file used when
``RINGWORLD_TUNING_FILE`` names it.
"""

from __future__ import annotations

import json

from ringworld.errors import ConfigError
from ringworld.tuning.cost import Constants

DEFAULTS: dict[str, Constants] = {
    # `ringworld tune`, 2026-11-29, reference machine idle (load < 1), median of 7 repeats
    "shm": Constants(step=51e-6, message=15e-6, bandwidth=4.3e9, reduce_rate=4.5e9,
                     copy_rate=4.4e9, sync=7.6e-6),
    "tcp": Constants(step=91e-6, message=33e-6, bandwidth=3.8e9, reduce_rate=4.5e9,
                     copy_rate=4.4e9),
    # a communicator of one rank: nothing moves, only local copies
    "self": Constants(step=2e-6, message=1e-6, bandwidth=1e12, reduce_rate=4.5e9,
                      copy_rate=4.4e9),
}


def load(path: str | None) -> dict[str, Constants]:
    """The defaults, overridden by the transports found in the JSON file ``path`` (if any).

    Raises:
        ConfigError: the file cannot be read or has the wrong shape.
    """
    table = dict(DEFAULTS)
    if path is None:
        return table
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        for kind, values in data["constants"].items():
            table[kind] = Constants(**{k: float(values[k]) for k in Constants._fields
                                       if k in values})
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"RINGWORLD_TUNING_FILE={path}: not a tuning file written by "
                          f"`ringworld tune --save` ({exc})") from exc
    return table
