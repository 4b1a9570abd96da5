"""Handlers: plain functions that turn events into a converged cluster.

Each shipped handler lives in its own sub-package with its own module-level ``registry``.
:func:`load` composes a fresh :class:`Registry` for the router from those it is asked for and
the user's modules named in ``EVENTOP_HANDLERS``.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

from eventop.handlers.events import Event, ObjectRef
from eventop.handlers.registry import Outcome, Registry, default, on

BUILTIN = ("eventop.handlers.copy_rules", "eventop.handlers.databases",
           "eventop.handlers.exchange_rates", "eventop.handlers.mirrors")


class HandlerLoadError(ValueError):
    """A handler module named in the configuration can not be loaded; the message says why
    and what is accepted."""


def load(extra: str | None = None, builtin: str | None = None) -> Registry:
    """A fresh registry of the built-in handlers and the user's (``EVENTOP_HANDLERS``).

    ``EVENTOP_BUILTIN_HANDLERS`` (or ``builtin``) picks which built-in handlers run:
    unset means all, otherwise a comma-separated list such as ``mirrors,copy_rules``;
    ``none`` runs only the user's. A cluster that wants one operator need not grant the
    RBAC of the others, and tests can run the router with only their own handlers.

    ``EVENTOP_HANDLERS`` (or ``extra``) is comma-separated; each entry is a dotted module path
    (``mypkg.handlers``, importable by the router) or a path to a ``.py`` file (imported
    under its file name, its directory put on ``sys.path`` so that its own imports of
    sibling modules work, as when running a script).
    """
    chosen = os.environ.get("EVENTOP_BUILTIN_HANDLERS") if builtin is None else builtin
    registry = Registry()
    for name in list(BUILTIN) if chosen is None else _builtin_names(chosen):
        registry.include(importlib.import_module(name).registry)
    extra = os.environ.get("EVENTOP_HANDLERS", "") if extra is None else extra
    for entry in (e.strip() for e in extra.split(",")):
        if entry:
            module = import_handler_module(entry)
            own = getattr(module, "registry", None)
            mine = Registry()
            if isinstance(own, Registry) and own is not default:
                mine.include(own)
            mine.include(default, module_prefix=module.__name__)
            _check_registered(entry, module, mine)
            registry.include(mine)
    return registry


def _check_registered(entry: str, module: ModuleType, found: Registry) -> None:
    """Refuse a handler module that registers nothing, or defines a controller it does not
    register: either would start a router that is ready and never runs it."""
    from eventop.engine.controller import Controller

    registered = {id(c) for c in found.controllers}
    stray = sorted(name for name, value in vars(module).items()
                   if isinstance(value, Controller) and id(value) not in registered)
    if stray:
        raise HandlerLoadError(
            f"EVENTOP_HANDLERS: {entry!r} defines the controller(s) {', '.join(stray)} but does "
            "not register them: give the module a `registry = Registry()` and pass "
            "Controller(..., registry=registry), or call registry.add(...)")
    if not found:
        raise HandlerLoadError(
            f"EVENTOP_HANDLERS: {entry!r} registers no handler: decorate a function with "
            "@on(...), or define a Controller(..., registry=registry) beside a module-level "
            "`registry = Registry()` (README, Writing your own handler)")


def import_handler_module(entry: str) -> ModuleType:
    """Import one ``EVENTOP_HANDLERS`` entry: a dotted module path or a ``.py`` file."""
    if entry.endswith(".py") or os.sep in entry or "/" in entry:
        return _import_file(Path(entry))
    try:
        return importlib.import_module(entry)
    except ModuleNotFoundError as exc:
        if exc.name and entry.startswith(exc.name):
            raise HandlerLoadError(
                f"EVENTOP_HANDLERS: no module named {entry!r}; give a module the router can "
                "import (pip install your package) or the path of a .py file") from None
        raise HandlerLoadError(f"EVENTOP_HANDLERS: importing {entry!r} failed: {exc}") from exc
    except Exception as exc:
        raise HandlerLoadError(f"EVENTOP_HANDLERS: importing {entry!r} failed: "
                               f"{type(exc).__name__}: {exc}") from exc


def _import_file(path: Path) -> ModuleType:
    path = path.expanduser().resolve()
    if not path.exists():
        raise HandlerLoadError(f"EVENTOP_HANDLERS: there is no file {str(path)!r}; give the "
                               "path of a Python file or a dotted module name")
    if not path.is_file() or path.suffix != ".py":
        raise HandlerLoadError(f"EVENTOP_HANDLERS: {str(path)!r} is not a .py file; give the "
                               "path of a Python file or a dotted module name")
    name = path.stem
    loaded = sys.modules.get(name)
    if loaded is not None:
        if Path(getattr(loaded, "__file__", "") or "").resolve() == path:
            return loaded
        raise HandlerLoadError(f"EVENTOP_HANDLERS: {path} would be imported as module {name!r}, "
                               f"which is already {getattr(loaded, '__file__', 'built in')}; "
                               "rename the file")
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[name]
        raise HandlerLoadError(f"EVENTOP_HANDLERS: importing {path} failed: "
                               f"{type(exc).__name__}: {exc}") from exc
    return module


def _builtin_names(chosen: str) -> list[str]:
    wanted = [n.strip() for n in chosen.split(",") if n.strip()]
    if wanted in ([], ["none"]):
        return []
    prefix = "eventop.handlers."
    names = [prefix + n.removeprefix(prefix).removeprefix("handlers.") for n in wanted]
    unknown = [n.removeprefix(prefix) for n in names if n not in BUILTIN]
    if unknown:
        raise HandlerLoadError(f"EVENTOP_BUILTIN_HANDLERS: unknown built-in handler(s) "
                               f"{', '.join(unknown)}; choose from "
                               f"{', '.join(b.removeprefix(prefix) for b in BUILTIN)} or 'none'")
    return names


__all__ = ["BUILTIN", "Event", "HandlerLoadError", "ObjectRef", "Outcome", "Registry",
           "import_handler_module", "load", "on"]
