"""eventop: Kubernetes operators written as plain Python functions.

The installed distribution is one import package, ``eventop``, so that a handler author's own
modules (a ``handlers.py`` of their own is likely) never clash with eventop's. In the
repository its rooms stay at the top level, where their names tell the architecture
(``handlers/``, ``router/``, ``watcher/``, ``kube/``, ``localkube/``); ``pyproject.toml`` maps
each of them to ``eventop.<room>``.

This module is the public face. Names are resolved lazily (PEP 562): ``python -m
eventop.router`` must set up prometheus_client's multiprocess mode before anything imports
it, and importing ``eventop`` alone must stay free of side effects.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any

__version__ = "0.1.0"

# pyproject.toml's requires-python and the Makefile say the same; a test keeps them equal.
MIN_PYTHON = (3, 11)
if sys.version_info < MIN_PYTHON:
    raise ImportError(f"eventop needs Python {'.'.join(map(str, MIN_PYTHON))} or newer; "
                      f"{sys.executable} is Python {'.'.join(map(str, sys.version_info[:3]))}")

_EXPORTS = {
    "Child": "eventop.engine",
    "Controller": "eventop.engine",
    "Desired": "eventop.engine",
    "Kind": "eventop.engine",
    "Note": "eventop.engine",
    "SpecError": "eventop.engine",
    "on": "eventop.handlers",
    "Registry": "eventop.handlers",
    "Event": "eventop.handlers",
    "ObjectRef": "eventop.handlers",
    "Kube": "eventop.kube",
}

__all__ = sorted(_EXPORTS)


def lazy_exports(package: str, exports: dict[str, str],
                 namespace: dict[str, Any]) -> Callable[[str], Any]:
    """A module ``__getattr__`` (PEP 562) that imports each name of ``exports`` (name ->
    module) on first use and keeps it in ``namespace``, the package's globals."""
    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value
    return __getattr__


__getattr__ = lazy_exports("eventop", _EXPORTS, globals())
