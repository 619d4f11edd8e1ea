"""Guard for the MPI-layer tests: the pytest process itself must never start communication.

``run_processes`` forks ranks from this process; a world initialised here would be inherited by
every forked rank instead of the job's own. Tests that need a world use ``run_processes`` or a
subprocess.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import ringworld


@pytest.fixture(autouse=True)
def _no_world_in_the_test_process() -> Iterator[None]:
    assert not ringworld.initialized(), "a world was started in the pytest process"
    yield
    assert not ringworld.initialized(), "this test started a world in the pytest process"
