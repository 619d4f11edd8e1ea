"""Calibration files, the calibrated local topology, and predicted vs measured runs."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from ringworld.errors import ConfigError
from ringworld.topology import calibrate
from ringworld.tuning import constants
from ringworld.tuning.cost import Constants

pytestmark = pytest.mark.timeout(300)


def test_saved_constants_drive_the_local_topology(tmp_path) -> None:
    c = Constants(step=40e-6, message=9e-6, bandwidth=2e9, reduce_rate=3e9, copy_rate=5e9)
    path = tmp_path / "cal.json"
    calibrate.save(path, {"shm": c})
    assert constants.load(str(path))["shm"] == c  # the tuner reads the same file
    prm = calibrate.params(path)
    assert (prm.overhead, prm.engine, prm.reduce_rate) == (40e-6, 2e9, 3e9)
    topo = calibrate.local_topology(path, 2)
    assert topo.size == 2
    assert topo.by_id[topo.ranks[0]].params() == prm
    slow = calibrate.predict(topo, "allreduce", "ring", 4 << 20, 2)
    fast_c = c._replace(bandwidth=8e9)
    calibrate.save(path, {"shm": fast_c})
    fast = calibrate.predict(calibrate.local_topology(path, 2), "allreduce", "ring", 4 << 20, 2)
    assert fast < slow
    # 2 ranks, 4 MiB: each rank sends and receives 2 MiB twice over its engine
    assert slow > 2 * (4 << 20) / 2e9
    with pytest.raises(ConfigError):
        calibrate.params(path, "tcp_nope")
    (tmp_path / "bad.json").write_text("[]")
    with pytest.raises(ConfigError):
        calibrate.params(tmp_path / "bad.json")


def test_compare_runs_the_real_collectives() -> None:
    rows = calibrate.compare(2, [256 << 10], ["allreduce", "bcast"])
    assert {(r.collective, r.algorithm) for r in rows} >= {("allreduce", "ring"),
                                                           ("bcast", "binomial")}
    for r in rows:
        assert r.measured > 0 and r.predicted > 0 and math.isfinite(r.ratio)


def test_calibrate_command_compare_with_a_constants_file(tmp_path) -> None:
    path = tmp_path / "cal.json"
    calibrate.save(path, {"shm": constants.DEFAULTS["shm"]})
    out = tmp_path / "rows.json"
    proc = subprocess.run([sys.executable, "-m", "ringworld", "calibrate", "--compare",
                           "--constants", str(path), "--sizes", "128KiB", "--collectives",
                           "allgather", "--json", str(out)],
                          capture_output=True, text=True, timeout=240, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "pred/meas" in proc.stdout
    rows = json.loads(out.read_text())
    assert {r["algorithm"] for r in rows} == {"ring", "recursive_doubling", "bruck"}
