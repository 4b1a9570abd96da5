"""Register handler functions for events, and dispatch an event to every handler that wants it.

A handler is a plain function ``(event, kube) -> str | None``::

    from eventop.handlers import on

    @on("dev.knative.apiserver.resource.*", api_version="eventop.dev/v1", kind="CopyRule")
    def reconcile_rule(event, kube):
        ...
        return "synced 3 copies"    # optional, goes to the log line

It has no Flask in it and can be called directly in a test. Handlers are independent: the
dispatcher runs each one that matches, and one failing does not stop the others (the event
is then answered 5xx and redelivered; handlers are idempotent, so rerunning the ones that
succeeded is harmless).
"""

from __future__ import annotations

import fnmatch
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from eventop.handlers.events import Event

log = logging.getLogger("eventop.handlers")

HandlerFn = Callable[[Event, Any], "str | None"]


@dataclass(frozen=True)
class Registration:
    fn: HandlerFn
    types: tuple[str, ...]
    api_version: str | None
    kind: str | None

    @property
    def name(self) -> str:
        return f"{self.fn.__module__}.{self.fn.__qualname__}"

    def wants(self, event: Event) -> bool:
        if not any(fnmatch.fnmatchcase(event.type, pattern) for pattern in self.types):
            return False
        if self.api_version is None and self.kind is None:
            return True
        ref = event.ref
        if ref is None:
            return False
        return ((self.api_version is None or ref.api_version == self.api_version)
                and (self.kind is None or ref.kind == self.kind))


@dataclass
class Outcome:
    handler: str
    ok: bool
    duration: float
    detail: str = ""
    error: BaseException | None = None


class Registry:
    def __init__(self) -> None:
        self._regs: list[Registration] = []

    def on(self, *types: str, api_version: str | None = None,
           kind: str | None = None) -> Callable[[HandlerFn], HandlerFn]:
        """Decorator: call the function for events whose type matches one of ``types``
        (shell-style patterns) and, if given, whose object has this apiVersion and kind."""
        if not types:
            raise TypeError("on() needs at least one event type (patterns like 'a.b.*' work)")

        def register(fn: HandlerFn) -> HandlerFn:
            self._regs.append(Registration(fn, tuple(types), api_version, kind))
            return fn
        return register

    @property
    def registrations(self) -> tuple[Registration, ...]:
        return tuple(self._regs)

    def custom_kinds(self) -> set[tuple[str, str]]:
        """The (apiVersion, kind) of custom resources the handlers listen to: the CRDs that
        must be installed before events for them can exist."""
        kinds = set()
        for reg in self._regs:
            if reg.api_version and reg.kind:
                group = reg.api_version.rpartition("/")[0]
                if "." in group and not group.endswith(".k8s.io"):
                    kinds.add((reg.api_version, reg.kind))
        return kinds

    def matching(self, event: Event) -> list[Registration]:
        return [r for r in self._regs if r.wants(event)]

    def dispatch(self, event: Event, kube: Any) -> list[Outcome]:
        """Run every matching handler; exceptions are captured in the outcomes, not raised."""
        outcomes = []
        for reg in self.matching(event):
            start = time.perf_counter()
            try:
                detail = reg.fn(event, kube)
                outcomes.append(Outcome(reg.name, True, time.perf_counter() - start,
                                        str(detail or "")))
            except Exception as exc:  # one handler's failure must not hide the others
                outcomes.append(Outcome(reg.name, False, time.perf_counter() - start,
                                        f"{type(exc).__name__}: {exc}", exc))
        return outcomes


registry = Registry()
on = registry.on
