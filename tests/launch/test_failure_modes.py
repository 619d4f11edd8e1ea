"""A rank that dies or leaves while the others wait for it (in a collective, or in a receive from
it): every survivor raises PeerFailure naming it within 2 s, over shared memory and TCP.

kill -9 in a collective is tested in test_launch_recovery.py, SIGSTOP and call timeouts in
tests/comm/test_monitor.py; these are the other ways to go. The jobs are those of
scripts/failure_times.py (which prints the times as a table): rank 1 of 4 fails 0.5 s after a
barrier, under ``ringworld run --enable-recovery`` so the launcher leaves the survivors running,
and every survivor prints when it raised what, naming whom.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

pytestmark = pytest.mark.timeout(150)
REPO = Path(__file__).resolve().parents[2]
DETECT_WITHIN = 2.0


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("failure_times",
                                                  REPO / "scripts" / "failure_times.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("failure_times", module)
    spec.loader.exec_module(module)
    return module


ft = _load()

#: What the launcher says about rank 1 (--enable-recovery: "lost rank 1 ...: HOW"); None: it
#: left with status 0, which is not a failure of the job.
HOW = {"kill9": "killed by SIGKILL", "exit": "exited with code 3", "abort": "killed by SIGABRT",
       "sigterm": "killed by SIGTERM", "leave": None, "vanish": None}

CASES = [
    pytest.param(mode, where, transport,
                 id=f"{mode}-{where}-{transport}")
    for mode in ("exit", "abort", "sigterm", "leave", "vanish", "kill9")
    for where in ("collective", "receive")
    for transport in ("shm", "tcp")
    if not (mode == "kill9" and where == "collective")  # test_launch_recovery.py has it
]


@pytest.mark.parametrize(("mode", "where", "transport"), CASES)
def test_every_survivor_raises_peer_failure_within_2_s(mode: str, where: str,
                                                       transport: str) -> None:
    o = ft.run_case(mode, where, transport, ranks=4, timeout=100)
    assert sorted(o.raised) == [0, 2, 3], o.describe()
    assert set(o.raised.values()) == {"PeerFailure"}, o.describe()
    assert set(o.named.values()) == {1}, o.describe()  # the rank that failed, no other
    assert all(re.match(r"peer rank 1 failed", t) for t in o.texts.values()), o.describe()
    assert o.worst < DETECT_WITHIN, o.describe()
    assert o.returncode == 0, o.describe()  # the survivors finished
    how = HOW[mode]
    if how is None:
        assert "lost rank" not in o.stderr, o.describe()
    else:
        assert re.search(rf"lost rank 1 \(pid \d+\): {how}", o.stderr), o.describe()


def test_the_table_of_the_script_lists_every_case() -> None:
    pf = "PeerFailure"
    rows = [ft.Outcome("exit", "receive", "tcp", 4, 0, seconds={0: 0.01, 2: 0.02, 3: 0.5},
                       raised={0: pf, 2: pf, 3: pf}, named={0: 1, 2: 1, 3: 1}),
            ft.Outcome("stop", "collective", "shm", 4, 5, seconds={0: 2.1},
                       raised={0: pf}, named={0: 1}),
            ft.Outcome("leave", "collective", "tcp", 4, 0, seconds={0: 0.0, 2: 2.02, 3: 0.0},
                       raised={0: pf, 2: pf, 3: pf}, named={0: 1, 2: 0, 3: 1})]
    text = ft.table(rows)
    assert "| exit | receive | tcp | PeerFailure | 1 | 0.01 0.02 0.50 | 0.50 | 2 | yes |" in text
    # a survivor that raised nothing, one too late that blamed another rank
    assert "| stop | collective | shm | PeerFailure | 1 | 2.10 | inf | 4 | NO |" in text
    assert ("| leave | collective | tcp | PeerFailure | 0, 1 | 0.00 0.00 2.02 | 2.02 | 2 | NO |"
            in text)
    with pytest.raises(ValueError, match="unknown case"):
        ft.run_case("explode", "receive", "tcp")
