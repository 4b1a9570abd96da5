"""The event a handler receives: a CloudEvent read as "this Kubernetes object changed".

Built by the router from the wire (binary or structured CloudEvent), or directly in tests
with :meth:`Event.for_object`. Handlers treat it as a hint of *what to look at*: they read
the current state from the API server and converge, so a late, repeated or forged event can
at most cause one more reconcile.
"""

from __future__ import annotations

import functools
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from eventop.kube.resources import ResourceTable

_KNOWN_KINDS = ResourceTable()  # built once: subject_for runs for every event the watcher sends

RESOURCE_PREFIX = "dev.knative.apiserver.resource."
REF_PREFIX = "dev.knative.apiserver.ref."
RESOURCE_TYPES = tuple(RESOURCE_PREFIX + c for c in ("add", "update", "delete"))
REF_TYPES = tuple(REF_PREFIX + c for c in ("add", "update", "delete"))
KUBE_TYPES = RESOURCE_TYPES + REF_TYPES
REFRESH_TYPE = "dev.eventop.exchangerates.refresh"
PING_TYPE = "dev.knative.sources.ping"


@dataclass(frozen=True)
class ObjectRef:
    api_version: str
    kind: str
    name: str
    namespace: str | None = None
    uid: str | None = None


@dataclass(frozen=True)
class Event:
    id: str
    type: str
    source: str
    data: Any = None
    subject: str | None = None
    time: str | None = None
    extensions: dict[str, str] = field(default_factory=dict)

    @property
    def is_kube(self) -> bool:
        return self.type.startswith((RESOURCE_PREFIX, REF_PREFIX))

    @property
    def change(self) -> str | None:
        """``add``, ``update`` or ``delete`` for Kubernetes events, else None."""
        return self.type.rsplit(".", 1)[1] if self.is_kube else None

    @property
    def object(self) -> dict[str, Any] | None:
        """The object (its last state on delete) in Resource mode; None in Reference mode."""
        if self.type.startswith(RESOURCE_PREFIX) and isinstance(self.data, dict):
            return self.data
        return None

    @functools.cached_property
    def ref(self) -> ObjectRef | None:
        """Which object this is about, in either mode (data first, extensions as fallback).

        Computed once per event: the registry asks it for every registration it matches.
        """
        if not self.is_kube:
            return None
        data = self.data if isinstance(self.data, dict) else {}
        meta = data.get("metadata") if self.object is not None else data
        meta = meta if isinstance(meta, dict) else {}
        api_version = data.get("apiVersion") or self.extensions.get("apiversion")
        kind = data.get("kind") or self.extensions.get("kind")
        name = meta.get("name") or self.extensions.get("name")
        if not (api_version and kind and name):
            return None
        return ObjectRef(str(api_version), str(kind), str(name),
                         meta.get("namespace") or self.extensions.get("namespace") or None,
                         meta.get("uid"))

    @classmethod
    def for_object(cls, change: str, obj: dict[str, Any], *, source: str = "test",
                   event_id: str | None = None) -> Event:
        """A Resource-mode event as the watcher or ApiServerSource would send it."""
        meta = obj.get("metadata") or {}
        return cls(
            id=event_id or f"{meta.get('uid')}/{meta.get('resourceVersion')}/{change}",
            type=RESOURCE_PREFIX + change, source=source, data=obj,
            subject=subject_for(obj), time=datetime.now(UTC).isoformat(),
            extensions=kube_extensions(obj),
        )

    @classmethod
    def simple(cls, type_: str, data: Any = None, *, source: str = "test") -> Event:
        return cls(id=str(uuid.uuid4()), type=type_, source=source, data=data,
                   time=datetime.now(UTC).isoformat())


def subject_for(obj: dict[str, Any]) -> str:
    """``/apis/<apiVersion>/namespaces/<ns>/<plural>/<name>`` as ApiServerSource writes it."""
    meta = obj.get("metadata") or {}
    api_version, kind = obj.get("apiVersion", ""), obj.get("kind", "")
    res = _KNOWN_KINDS.by_kind(api_version, kind)
    plural = res.plural if res else kind.lower() + "s"
    ns = meta.get("namespace")
    ns_part = f"/namespaces/{ns}" if ns else ""
    return f"/apis/{api_version}{ns_part}/{plural}/{meta.get('name')}"


def kube_extensions(obj: dict[str, Any]) -> dict[str, str]:
    meta = obj.get("metadata") or {}
    ext = {"kind": str(obj.get("kind", "")), "name": str(meta.get("name", "")),
           "apiversion": str(obj.get("apiVersion", ""))}
    if meta.get("namespace"):
        ext["namespace"] = str(meta["namespace"])
    return ext
