"""Handlers: plain functions that turn events into a converged cluster.

Each shipped handler lives in its own sub-package and registers itself with :func:`on`
when imported. :func:`load` imports them all, plus any extra modules named in
``EVENTOP_HANDLERS`` (comma-separated), which is how users add their own.
"""

from __future__ import annotations

import importlib
import os

from eventop.handlers.events import Event, ObjectRef
from eventop.handlers.registry import Outcome, Registry, on, registry

BUILTIN = ("eventop.handlers.copy_rules", "eventop.handlers.exchange_rates",
           "eventop.handlers.mirrors")


def load(extra: str | None = None, builtin: str | None = None) -> Registry:
    """Import the built-in handlers and the user's (``EVENTOP_HANDLERS``); return the registry.

    ``EVENTOP_BUILTIN_HANDLERS`` (or ``builtin``) picks which built-in handlers run:
    unset means all, otherwise a comma-separated list such as ``mirrors,copy_rules``;
    ``none`` runs only the user's. A cluster that wants one operator need not grant the
    RBAC of the others, and tests can run the router with only their own handlers.
    """
    chosen = os.environ.get("EVENTOP_BUILTIN_HANDLERS") if builtin is None else builtin
    names = list(BUILTIN) if chosen is None else _builtin_names(chosen)
    extra = os.environ.get("EVENTOP_HANDLERS", "") if extra is None else extra
    names += [n.strip() for n in extra.split(",") if n.strip()]
    for name in names:
        importlib.import_module(name)
    return registry


def _builtin_names(chosen: str) -> list[str]:
    wanted = [n.strip() for n in chosen.split(",") if n.strip()]
    if wanted in ([], ["none"]):
        return []
    prefix = "eventop.handlers."
    names = [prefix + n.removeprefix(prefix).removeprefix("handlers.") for n in wanted]
    unknown = [n.removeprefix(prefix) for n in names if n not in BUILTIN]
    if unknown:
        raise ValueError(f"EVENTOP_BUILTIN_HANDLERS: unknown built-in handler(s) "
                         f"{', '.join(unknown)}; choose from "
                         f"{', '.join(b.removeprefix(prefix) for b in BUILTIN)} or 'none'")
    return names


__all__ = ["BUILTIN", "Event", "ObjectRef", "Outcome", "Registry", "load", "on", "registry"]
