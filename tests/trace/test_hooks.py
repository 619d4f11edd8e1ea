"""The hook points tracing uses: every communication call is marked observable where it is
defined, and observing replaces exactly those methods, then puts the originals back."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ringworld.collective.communicator  # noqa: F401 (registers the observable classes)
from ringworld.algorithms import registry
from ringworld.collective.communicator import Communicator
from ringworld.comm import hooks


def _names() -> dict[str, hooks.Mark]:
    return {name: mark for _, name, mark in hooks.marked()}


def test_every_collective_and_point_to_point_call_is_observable() -> None:
    marked = _names()
    collectives = {k[0] if isinstance(k, tuple) else k for k in registry.REGISTRY}
    for c in collectives:
        assert marked.get(c) == hooks.Mark("collective", False), c
        assert marked.get("i" + c) == hooks.Mark("collective", True), "i" + c
    for p in ("send", "recv", "ssend", "sendrecv", "probe", "send_obj", "recv_obj",
              "ssend_obj", "sendrecv_obj"):
        assert marked.get(p) == hooks.Mark("p2p", False), p
    for p in ("isend", "irecv", "issend", "isend_obj", "irecv_obj", "issend_obj"):
        assert marked.get(p) == hooks.Mark("p2p", True), p
    assert marked["wait_for"].category == "wait"
    assert "iprobe" not in marked  # polled in loops: it would flood a trace
    assert {"dup", "split", "create"} <= {n for n, m in marked.items()
                                           if m.category == "management"}
    # every object call of the communicator (collective or point-to-point) is marked too
    objs = {n for n in dir(Communicator) if n.endswith("_obj") and not n.startswith("_")}
    assert len(objs) > 10 and objs <= set(marked), objs - set(marked)


def test_observe_wraps_the_marked_methods_and_unobserve_restores_them() -> None:
    before = Communicator.allreduce
    seen: list[str] = []

    def wrap(mark: hooks.Mark, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            seen.append(name)
            return fn(*args, **kwargs)
        return call

    try:
        hooks.observe(wrap)
        assert Communicator.allreduce is not before
        hooks.observe(wrap)  # a second tool's wrappers replace the first's, not stack on them
        Communicator.allreduce(None, None, None)  # type: ignore[arg-type]
    except Exception:  # the call's own failure (no buffers) does not matter here
        pass
    finally:
        hooks.unobserve()
    assert seen == ["allreduce"]
    assert Communicator.allreduce is before
