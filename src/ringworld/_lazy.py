"""Modules imported on first use, so ``ringworld.init()`` does not pay for numpy up front."""

from __future__ import annotations

import importlib
from typing import Any


class LazyModule:
    """Stands in for module ``name`` as global ``alias`` of ``namespace`` until first used.

    The first attribute access imports the module and rebinds the global to it, so later
    accesses cost nothing extra.
    """

    def __init__(self, name: str, namespace: dict[str, Any], alias: str) -> None:
        self._name = name
        self._namespace = namespace
        self._alias = alias

    def __getattr__(self, attr: str) -> Any:
        module = importlib.import_module(self._name)
        self._namespace[self._alias] = module
        return getattr(module, attr)
