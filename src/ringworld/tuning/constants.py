"""Default cost-model constants, per transport, with where they come from.

Measured on the project's reference machine (2-core AMD EPYC VM, Python 3.11, numpy 2.4) on
2026-11-29 with ``ringworld tune`` (np=2): ``step`` from the 8-byte ping-pong half round trip
plus one collective step of Python overhead, ``message`` from a step with several messages,
``bandwidth`` from 16 MiB ping-pong (each byte is copied in by the sender and out by the
receiver, so a rank's transport time is bytes sent plus received over this rate), and
``reduce_rate``/``copy_rate`` from numpy ``np.add(a, b, out=a)`` and ``np.copyto`` on 32 MiB
arrays. ``ringworld tune --save`` writes re-measured values to a JSON file used when
``RINGWORLD_TUNING_FILE`` names it.
"""

from __future__ import annotations

import json
from pathlib import Path

from ringworld.errors import ConfigError
from ringworld.tuning.cost import Constants

DEFAULTS: dict[str, Constants] = {
    "shm": Constants(step=12e-6, message=3e-6, bandwidth=9.0e9, reduce_rate=4.5e9,
                     copy_rate=6.5e9, sync=4e-6),
    "tcp": Constants(step=40e-6, message=10e-6, bandwidth=3.0e9, reduce_rate=4.5e9,
                     copy_rate=6.5e9),
    "self": Constants(step=2e-6, message=1e-6, bandwidth=1e12, reduce_rate=4.5e9,
                      copy_rate=6.5e9),
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
        data = json.loads(Path(path).read_text())
        for kind, values in data["constants"].items():
            table[kind] = Constants(**{k: float(values[k]) for k in Constants._fields
                                       if k in values})
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"RINGWORLD_TUNING_FILE={path}: not a tuning file written by "
                          f"`ringworld tune --save` ({exc})") from exc
    return table
