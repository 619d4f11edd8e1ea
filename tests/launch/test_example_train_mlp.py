"""``examples/train_mlp.py``: data-parallel training reaches the single-process losses."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from launch_util import EXAMPLES, LAUNCHER

SMALL = ["--samples", "600", "--features", "24", "--hidden", "40", "--classes", "5",
         "--batch", "101", "--epochs", "4", "--lr", "0.2"]  # 101: uneven shares, short last batch


def _losses(argv: list[str]) -> tuple[list[float], float, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RINGWORLD_")}
    done = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=120,
                          env=env, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    epochs = [float(v) for v in re.findall(r"^epoch +\d+ +loss (\S+)$", done.stdout, re.M)]
    final = re.findall(r"^final loss (\S+)$", done.stdout, re.M)
    assert len(epochs) == 4 and len(final) == 1, done.stdout
    assert re.search(r"^wall time [\d.]+ s on \d rank\(s\)$", done.stdout, re.M), done.stdout
    return epochs, float(final[0]), done.stdout


def test_two_ranks_reach_the_single_process_losses() -> None:
    script = str(EXAMPLES / "train_mlp.py")
    single, single_final, _ = _losses([sys.executable, script, *SMALL])
    double, double_final, out = _losses([*LAUNCHER, "run", "-n", "2", sys.executable, script,
                                         *SMALL])
    assert out.startswith("2 rank(s)")  # only rank 0 prints
    assert single[-1] < 0.9 * single[0], f"the model did not learn: {single}"
    assert single_final == single[-1]
    assert abs(double_final - single_final) <= 1e-10 * single_final, (single_final,
                                                                      double_final)
    for a, b in zip(single, double, strict=True):
        assert abs(a - b) <= 1e-10 * a
