"""A small harness for CopyRule tests: the outside world changes a LocalKube, and the events
the watcher would send (including the echoes of eventop's own writes) are submitted to the
reconcile engine running the CopyRule handler (its cache fed by a real list+watch of the
LocalKube) until nothing changes any more."""

from __future__ import annotations

import copy
from typing import Any

from eventop.engine.runtime import Engine
from eventop.handlers.copy_rules import desired
from eventop.handlers.events import Event
from eventop.handlers.registry import Outcome, Registry
from tests.support import engine as engine_support
from tests.support.engine import deliver

Obj = dict[str, Any]
Key = tuple[str, str | None, str]
WATCHED = (("v1", "Namespace"), ("v1", "ConfigMap"), ("v1", "Secret"),
           (desired.API_VERSION, desired.KIND))


def copy_rule_registry() -> Registry:
    """Only the CopyRule handlers (the other built-in handlers have their own tests)."""
    from eventop import handlers

    return handlers.load("", builtin="copy_rules")


def start_engine(kube: Any) -> Engine:
    """The CopyRule handler's engine (as the router runs it), ready: its caches synced."""
    return engine_support.start_engine(kube, copy_rule_registry())


class Harness:
    """``world_put``/``world_remove`` change the cluster; ``settle`` delivers the events."""

    def __init__(self, local_kube: Any, kube: Any, *, deliver_twice: bool = False) -> None:
        self.local_kube = local_kube
        self.kube = kube
        self.registry = copy_rule_registry()
        self.engine = start_engine(kube)
        self.deliver_twice = deliver_twice
        self.seen: dict[Key, Obj] = self.snapshot()
        self.history: list[Event] = []

    def close(self) -> None:
        self.engine.stop()

    def __enter__(self) -> Harness:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the outside world ----------------------------------------------------------

    def world_put(self, obj: Obj) -> Obj:
        stored: Obj = self.local_kube.put(copy.deepcopy(obj))
        return stored

    def world_remove(self, api_version: str, kind: str, name: str,
                     namespace: str | None = None) -> None:
        self.local_kube.remove(api_version, kind, name, namespace)

    # -- the watcher ----------------------------------------------------------------

    def snapshot(self) -> dict[Key, Obj]:
        if hasattr(self.local_kube, "wait_idle"):
            self.local_kube.wait_idle()
        state: dict[Key, Obj] = {}
        for api_version, kind in WATCHED:
            for obj in self.local_kube.list(api_version, kind):
                obj.setdefault("apiVersion", api_version)
                obj.setdefault("kind", kind)
                meta = obj["metadata"]
                state[(kind, meta.get("namespace"), meta["name"])] = obj
        return state

    def changes(self) -> list[tuple[str, Obj]]:
        """What a watch would have reported since the last call."""
        now = self.snapshot()
        events: list[tuple[str, Obj]] = []
        for key, old in self.seen.items():
            new = now.get(key)
            if new is None or new["metadata"].get("uid") != old["metadata"].get("uid"):
                events.append(("delete", old))
        for key, new in now.items():
            old = self.seen.get(key)
            if old is None or new["metadata"].get("uid") != old["metadata"].get("uid"):
                events.append(("add", new))
            elif new["metadata"].get("resourceVersion") != old["metadata"].get("resourceVersion"):
                events.append(("update", new))
        self.seen = now
        return events

    def dispatch(self, change: str, obj: Obj) -> list[Outcome]:
        return self.deliver(Event.for_object(change, obj))

    def deliver(self, event: Event) -> list[Outcome]:
        self.history.append(event)
        outcomes = deliver(self.engine, event)
        failed = [o for o in outcomes if not o.ok]
        assert not failed, f"{event.type} {event.ref}: {[o.detail for o in failed]}"
        return outcomes

    def settle(self, max_rounds: int = 12) -> int:
        """Deliver events until a round produces no change; returns the events delivered.

        Fails if the handlers keep changing the cluster (ping-pong between handlers)."""
        delivered = 0
        for _ in range(max_rounds):
            events = self.changes()
            if not events:
                return delivered
            for change, obj in events:
                for _ in range(2 if self.deliver_twice else 1):
                    self.dispatch(change, obj)
                    delivered += 1
        raise AssertionError(f"no fixpoint after {max_rounds} rounds: {self.changes()}")

    def resync(self) -> None:
        """The watcher's periodic resync: an update event for every object it watches."""
        for obj in self.snapshot().values():
            self.dispatch("update", obj)
        self.settle()

    def redeliver_history(self) -> None:
        """Every event delivered so far, again, in order (at-least-once delivery, replays)."""
        for event in list(self.history):
            outcomes = deliver(self.engine, event)
            assert all(o.ok for o in outcomes), [o.detail for o in outcomes if not o.ok]

    # -- reading the result ------------------------------------------------------------

    def objects(self, kind: str = "ConfigMap") -> dict[str, Obj]:
        return {f"{o['metadata']['namespace']}/{o['metadata']['name']}": o
                for o in self.local_kube.list("v1", kind)}

    def copies(self, kind: str = "ConfigMap") -> dict[str, Obj]:
        """Every object owned by some CopyRule, by ``ns/name``."""
        return {k: o for k, o in self.objects(kind).items() if desired.is_copy(o)}

    def rule(self, name: str) -> Obj | None:
        found: Obj | None = self.local_kube.get(desired.API_VERSION, desired.KIND, name)
        return found

    def versions(self) -> dict[Key, str]:
        return {k: str(o["metadata"].get("resourceVersion")) for k, o in self.snapshot().items()}


def namespace(name: str, labels: Obj | None = None) -> Obj:
    return {"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": name, "labels": dict(labels or {})}}


def config_map(namespace_: str, name: str, data: Obj | None = None,
               labels: Obj | None = None, **extra: Any) -> Obj:
    obj: Obj = {"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": name, "namespace": namespace_, "labels": dict(labels or {})},
                "data": dict(data or {})}
    obj.update(extra)
    return obj


def secret(namespace_: str, name: str, data: Obj | None = None, labels: Obj | None = None,
           type_: str = "Opaque") -> Obj:
    return {"apiVersion": "v1", "kind": "Secret", "type": type_,
            "metadata": {"name": name, "namespace": namespace_, "labels": dict(labels or {})},
            "data": dict(data or {})}


def copy_rule(name: str, rule_type: str = "configmap", namespaces: Any = ("default",),
              match_labels: Obj | None = None, targets: Obj | None = None) -> Obj:
    spec: Obj = {"ruleType": rule_type, "namespaces": list(namespaces),
                 "selector": {"matchLabels": dict(match_labels or {"copyrator": "true"})}}
    if targets is not None:
        spec["targetNamespaces"] = targets
    return {"apiVersion": desired.API_VERSION, "kind": desired.KIND, "metadata": {"name": name},
            "spec": spec}
