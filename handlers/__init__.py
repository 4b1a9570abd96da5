"""Handlers: plain functions that turn events into a converged cluster.

Each shipped handler lives in its own sub-package and registers itself with :func:`on`
when imported. :func:`load` imports them all, plus any extra modules named in
``EVENTOP_HANDLERS`` (comma-separated), which is how users add their own.
"""

from __future__ import annotations

import importlib
import os

from handlers.events import Event, ObjectRef
from handlers.registry import Outcome, Registry, on, registry

BUILTIN = ("handlers.copy_rules", "handlers.exchange_rates", "handlers.mirrors")


def load(extra: str | None = None) -> Registry:
    """Import the built-in handlers and the user's (``EVENTOP_HANDLERS``); return the registry."""
    names = list(BUILTIN)
    extra = os.environ.get("EVENTOP_HANDLERS", "") if extra is None else extra
    names += [n.strip() for n in extra.split(",") if n.strip()]
    for name in names:
        importlib.import_module(name)
    return registry


__all__ = ["BUILTIN", "Event", "ObjectRef", "Outcome", "Registry", "load", "on", "registry"]
