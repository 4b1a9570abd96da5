"""Which handlers exist, and which of them want an event.

Two kinds of handlers live in a :class:`Registry`:

* **controllers** (:class:`eventop.engine.Controller`): a pure function from a parent object
  and cached reads to what should exist; the engine does the reads, merges repeated work and
  writes only differences (see ``docs/ENGINE.md``). The preferred form.
* **event functions**, registered with :meth:`Registry.on`: a plain ``(event, kube) -> str |
  None`` run once per matching event, for work that is not "make objects exist" (calling
  out, counting, notifying)::

      from eventop import on

      @on("dev.knative.apiserver.resource.*", api_version="v1", kind="ConfigMap")
      def annotate(event, kube):
          ...
          return "annotated"    # optional, goes to the event's log line

A registry is an ordinary object: nothing registers anywhere by being imported except into
the registry named. The built-in handler packages each declare their own module-level
``registry``; :func:`eventop.handlers.load` composes a fresh one for the router from those and
the user's modules. :data:`default` (what :func:`on` without ``registry=`` uses, as kopf's
decorators do) is where a user's module registers unless it brings its own.

A function handler has no Flask in it and can be called directly in a test. Handlers are
independent: one failing does not stop the others (the event is then answered 5xx and
redelivered; handlers are idempotent, so rerunning the ones that succeeded is harmless).
Each function handler writes with its own field manager (see :func:`field_manager_for`), so
two handlers never take each other's fields.
"""

from __future__ import annotations

import fnmatch
import functools
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from eventop.engine.kinds import Kind, merge_kinds
from eventop.handlers.events import Event
from eventop.kube.resources import is_custom

if TYPE_CHECKING:
    from eventop.engine.controller import Controller
    from eventop.kube import Kube

log = logging.getLogger("eventop.handlers")

HandlerFn = Callable[[Event, "Kube"], "str | None"]
BUILTIN_PREFIX = "eventop.handlers."


def field_manager_for(module: str, name: str | None = None) -> str:
    """The field manager a handler writes with: ``eventop-<name>``.

    ``name`` is what the handler declares; without it, its module: ``eventop-copy-rules``
    for ``eventop.handlers.copy_rules``, ``eventop-mypkg.labels`` for a user's
    ``mypkg.labels``. Server-side apply tracks fields per manager, so two handlers with
    different managers that set the same field with different values conflict (reported)
    instead of silently taking it from each other in a write loop.
    """
    base = name or module.removeprefix(BUILTIN_PREFIX).replace("_", "-")
    return f"eventop-{base}"[:128]


@dataclass(frozen=True)
class Pattern:
    """One ``@on``: shell-style type patterns and, optionally, the object's kind (and a label
    selector narrowing what the watcher watches of that kind for it)."""

    types: tuple[str, ...]
    api_version: str | None
    kind: str | None
    selector: str | None = None

    def wants(self, event: Event) -> bool:
        if self._matches_type(event.type) is None:
            return False
        if self.api_version is None and self.kind is None:
            return True
        ref = event.ref
        if ref is None:
            return False
        return ((self.api_version is None or ref.api_version == self.api_version)
                and (self.kind is None or ref.kind == self.kind))

    @functools.cached_property
    def _matches_type(self) -> Callable[[str], re.Match[str] | None]:
        """``fnmatch.fnmatchcase`` against any of ``types``, compiled once: asked for every
        event the router receives."""
        return re.compile("|".join(f"(?:{fnmatch.translate(t)})" for t in self.types)).match


@dataclass
class Registration:
    """One event function with every pattern it was registered for: it runs once per event
    even when several of its patterns match."""

    fn: HandlerFn
    patterns: list[Pattern] = field(default_factory=list)
    field_manager: str = ""

    @functools.cached_property
    def name(self) -> str:
        return f"{self.fn.__module__}.{self.fn.__qualname__}"

    @property
    def module(self) -> str:
        return str(self.fn.__module__)

    def wants(self, event: Event) -> bool:
        return any(p.wants(event) for p in self.patterns)

    def kinds(self) -> set[tuple[str, str]]:
        return {(p.api_version, p.kind) for p in self.patterns if p.api_version and p.kind}


@dataclass
class Outcome:
    handler: str
    ok: bool
    duration: float
    detail: str = ""
    error: BaseException | None = None
    #: A controller's run (or an event it had no run for) that changed nothing: the
    #: router logs the event at debug when every outcome is quiet. An event function's
    #: outcome is never quiet (what it wrote is not known).
    quiet: bool = False


class Registry:
    """Event functions and controllers; compose several with :meth:`include`."""

    def __init__(self) -> None:
        self._regs: dict[HandlerFn, Registration] = {}
        self._controllers: dict[str, Controller] = {}

    # -- declaring ---------------------------------------------------------------------

    def on(self, *types: str, api_version: str | None = None, kind: str | None = None,
           field_manager: str | None = None,
           selector: str | None = None) -> Callable[[HandlerFn], HandlerFn]:
        """Decorator: call the function for events whose type matches one of ``types``
        (shell-style patterns) and, if given, whose object has this apiVersion and kind.

        ``field_manager`` overrides the one derived from the function's module. ``selector``
        (a label selector, ``app.kubernetes.io/managed-by=eventop``) says that only objects
        with those labels matter to the function: the watcher then watches only those."""
        if not types:
            raise TypeError("on() needs at least one event type (patterns like 'a.b.*' work)")
        pattern = Pattern(tuple(types), api_version, kind, selector)

        def register(fn: HandlerFn) -> HandlerFn:
            reg = self._regs.get(fn)
            if reg is None:
                reg = self._regs[fn] = Registration(
                    fn, [], field_manager or field_manager_for(str(fn.__module__)))
            elif field_manager:
                reg.field_manager = field_manager
            if pattern not in reg.patterns:
                reg.patterns.append(pattern)
            return fn
        return register

    def add(self, controller: Controller) -> Controller:
        """Register a controller (``Controller(..., registry=r)`` calls this)."""
        from eventop.engine.controller import share_children

        same = self._controllers.get(controller.name)
        if same is not None and same is not controller:
            raise ValueError(f"two controllers are named {controller.name!r} "
                             f"({same.module} and {controller.module}); names must be unique "
                             "because they are the field managers")
        self._controllers[controller.name] = controller
        share_children(self._controllers.values())
        return controller

    def include(self, other: Registry, *, module_prefix: str | None = None) -> Registry:
        """Add ``other``'s handlers (only those from modules under ``module_prefix``)."""
        for reg in other._regs.values():
            if module_prefix is None or _under(reg.module, module_prefix):
                mine = self._regs.setdefault(reg.fn, Registration(reg.fn, [],
                                                                  reg.field_manager))
                mine.patterns.extend(p for p in reg.patterns if p not in mine.patterns)
        for ctl in other._controllers.values():
            if module_prefix is None or _under(ctl.module, module_prefix):
                self.add(ctl)
        return self

    # -- reading -----------------------------------------------------------------------

    @property
    def registrations(self) -> tuple[Registration, ...]:
        return tuple(self._regs.values())

    @property
    def controllers(self) -> tuple[Controller, ...]:
        return tuple(self._controllers.values())

    def __bool__(self) -> bool:
        return bool(self._regs or self._controllers)

    def watched_kinds(self) -> list[Kind]:
        """Every kind whose changes some handler wants to hear about, with a label selector
        when every handler of that kind narrows it the same way: what the watcher (or the
        ApiServerSource) must watch. Sorted by apiVersion and kind."""
        declared = [Kind(p.api_version, p.kind, selector=p.selector)
                    for reg in self._regs.values() for p in reg.patterns
                    if p.api_version and p.kind]
        for ctl in self._controllers.values():
            declared += [Kind(k.api_version, k.kind, selector=k.selector, optional=k.optional)
                         for k in ctl.event_kinds()]
        return sorted(merge_kinds(declared).values(), key=lambda k: k.key)

    def needed_kinds(self, *, controllers: bool = True) -> dict[tuple[str, str], list[str]]:
        """Every (apiVersion, kind) a handler listens to or reads, with the handlers that
        need it: readiness names a missing CRD and who waits for it. (Controllers' optional
        kinds are left out: they may never be served.)"""
        needed: dict[tuple[str, str], list[str]] = {}
        for reg in self._regs.values():
            for key in sorted(reg.kinds()):
                needed.setdefault(key, []).append(reg.name)
        for ctl in self._controllers.values() if controllers else ():
            for k in ctl.kinds():
                if not k.optional:
                    needed.setdefault(k.key, []).append(ctl.name)
        return needed

    def custom_kinds(self) -> set[tuple[str, str]]:
        """The (apiVersion, kind) of custom resources the handlers need: the CRDs that must
        be installed before events for them can exist."""
        return {key for key in self.needed_kinds() if is_custom(key[0])}

    def matching(self, event: Event) -> list[Registration]:
        return [r for r in self._regs.values() if r.wants(event)]

    def dispatch(self, event: Event, kube: Kube) -> list[Outcome]:
        """Run every matching event function once, each with a ``kube`` writing under its
        own field manager; exceptions are captured in the outcomes, not raised."""
        return self.run(self.matching(event), event, kube)

    def run(self, matched: list[Registration], event: Event, kube: Kube) -> list[Outcome]:
        """:meth:`dispatch` of the registrations :meth:`matching` returned for ``event``."""
        outcomes = []
        for reg in matched:
            start = time.perf_counter()
            try:
                detail = reg.fn(event, _for_manager(kube, reg.field_manager))
                outcomes.append(Outcome(reg.name, True, time.perf_counter() - start,
                                        str(detail or "")))
            except Exception as exc:  # one handler's failure must not hide the others
                outcomes.append(Outcome(reg.name, False, time.perf_counter() - start,
                                        f"{type(exc).__name__}: {exc}", exc))
        return outcomes


def _under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def _for_manager(kube: Kube, manager: str) -> Kube:
    """``kube`` writing as ``manager`` (a test's stand-in without that ability as it is)."""
    for_manager = getattr(kube, "for_manager", None)
    return for_manager(manager) if callable(for_manager) else kube


#: Where :func:`on` registers when no registry is named: a user's handler module.
default = Registry()


def on(*types: str, api_version: str | None = None, kind: str | None = None,
       field_manager: str | None = None,
       registry: Registry | None = None) -> Callable[[HandlerFn], HandlerFn]:
    """:meth:`Registry.on` of ``registry`` (default: :data:`default`)."""
    return (registry or default).on(*types, api_version=api_version, kind=kind,
                                    field_manager=field_manager)
