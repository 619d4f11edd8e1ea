"""torch stays optional: ``import ringworld`` (and starting a world) never imports it, and
``ringworld.torch`` without torch fails with an ImportError that says what to install. These
run without torch too."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=60, check=False, stdin=subprocess.DEVNULL)


def test_ringworld_never_imports_torch() -> None:
    proc = _python("""
        import sys
        import numpy as np
        import ringworld
        from ringworld import MPI
        comm = ringworld.init()
        comm.allreduce(np.ones(3), np.empty(3))
        MPI.COMM_WORLD.Barrier()
        assert "torch" not in sys.modules, sorted(m for m in sys.modules if "torch" in m)
        print("ok")
    """)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


def test_missing_torch_is_a_clear_import_error() -> None:
    proc = _python("""
        import sys
        sys.modules["torch"] = None  # as if torch were not installed
        try:
            import ringworld.torch
        except ImportError as exc:
            print(exc)
        else:
            print("imported")
    """)
    assert proc.returncode == 0, proc.stderr
    assert "ringworld.torch needs PyTorch" in proc.stdout
    assert "pip install 'ringworld[torch]'" in proc.stdout
