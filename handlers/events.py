"""The event a handler receives: a CloudEvent read as "this Kubernetes object changed".

Built by the router from the wire (binary or structured CloudEvent), or directly in tests
with :meth:`Event.for_object`. Handlers treat it as a hint of *what to look at*: they read
the current state from the API server and converge, so a late, repeated or forged event can
at most cause one more reconcile. The wire contract itself is :mod:`eventop.events`.
"""

from __future__ import annotations

import functools
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from eventop.events import (
    RESOURCE_PREFIX,
    is_kube_type,
    kube_extensions,
    subject_for,
)
from eventop.events import event_id as _event_id


class InvalidEvent(ValueError):
    """The event names an object no API server could send (a namespaced kind without a
    namespace): answered 400, never taken for news that the object is gone."""


@dataclass(frozen=True)
class ObjectRef:
    api_version: str
    kind: str
    name: str
    namespace: str | None = None
    uid: str | None = None
    resource_version: str | None = None


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
        return is_kube_type(self.type)

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
    def named_in_data(self) -> dict[str, Any]:
        """The object as the data names it, by extension name (``apiversion``, ``kind``,
        ``name``, ``namespace``, and ``uid``, ``resourceversion``): the object's own fields in
        Resource mode, the reference's in Reference mode; None where the data says nothing.
        The router refuses an event whose extensions say otherwise."""
        data = self.data if isinstance(self.data, dict) else {}
        meta = data.get("metadata") if self.object is not None else data
        meta = meta if isinstance(meta, dict) else {}
        return {"apiversion": data.get("apiVersion"), "kind": data.get("kind"),
                "name": meta.get("name"), "namespace": meta.get("namespace"),
                "uid": meta.get("uid"), "resourceversion": meta.get("resourceVersion")}

    @functools.cached_property
    def ref(self) -> ObjectRef | None:
        """Which object this is about, in either mode (data first, extensions as fallback).

        Computed once per event: the registry asks it for every registration it matches.
        """
        if not self.is_kube:
            return None
        said, ext = self.named_in_data, self.extensions
        api_version = said["apiversion"] or ext.get("apiversion")
        kind = said["kind"] or ext.get("kind")
        name = said["name"] or ext.get("name")
        if not (api_version and kind and name):
            return None
        rv = said["resourceversion"]
        return ObjectRef(str(api_version), str(kind), str(name),
                         said["namespace"] or ext.get("namespace") or None,
                         said["uid"], str(rv) if rv else None)

    @classmethod
    def for_object(cls, change: str, obj: dict[str, Any], *, source: str = "test",
                   event_id: str | None = None) -> Event:
        """A Resource-mode event as the watcher or ApiServerSource would send it."""
        return cls(
            id=event_id or _event_id(change, obj),
            type=RESOURCE_PREFIX + change, source=source, data=obj,
            subject=subject_for(obj), time=datetime.now(UTC).isoformat(),
            extensions=kube_extensions(obj),
        )

    @classmethod
    def simple(cls, type_: str, data: Any = None, *, source: str = "test") -> Event:
        return cls(id=str(uuid.uuid4()), type=type_, source=source, data=data,
                   time=datetime.now(UTC).isoformat())


__all__ = ["Event", "ObjectRef"]
