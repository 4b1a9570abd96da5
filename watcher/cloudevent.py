"""Kubernetes changes as CloudEvents, exactly as Knative's ApiServerSource sends them.

The contract (DESIGN.md section 2) is shared by the live watcher, ``replay`` and the tests, so
it lives in one function. The id ``<uid>/<resourceVersion>/<change>`` is derived from the
change itself, never random: a redelivered, resynced or replayed change keeps its id, which is
what lets receivers deduplicate and lets two replays of one recording be compared.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from cloudevents.core.bindings.http import to_binary
from cloudevents.core.formats.json import JSONFormat
from cloudevents.core.v1.event import CloudEvent

from eventop.handlers.events import RESOURCE_PREFIX, kube_extensions, subject_for

CHANGES = ("add", "update", "delete")
WATCH_TYPE_TO_CHANGE = {"ADDED": "add", "MODIFIED": "update", "DELETED": "delete"}
_FORMAT = JSONFormat()


def event_id(change: str, obj: dict[str, Any]) -> str:
    """``<uid>/<resourceVersion>/<change>``: stable across redelivery and replay."""
    meta = obj.get("metadata") or {}
    return f"{meta.get('uid')}/{meta.get('resourceVersion')}/{change}"


def to_cloudevent(change: str, obj: dict[str, Any], source: str,
                  time: datetime | str | None = None, *, plural: str | None = None) -> CloudEvent:
    """The Resource-mode CloudEvent for one change of ``obj``.

    ``source`` is the API server URL; ``time`` is when the watcher saw the change (now if
    omitted; an RFC 3339 string is accepted too). ``plural`` names the resource in the subject
    for kinds outside eventop's static table (the watcher knows it from its configuration);
    without it the subject is computed by :func:`eventop.handlers.events.subject_for`.
    """
    if change not in CHANGES:
        raise ValueError(f"change must be one of {', '.join(CHANGES)}, not {change!r}")
    if not obj.get("apiVersion") or not obj.get("kind"):
        raise ValueError("the object needs apiVersion and kind (list items lack them: "
                         "fill them from the list's kind and apiVersion first)")
    if time is None:
        time = datetime.now(UTC)
    elif isinstance(time, str):
        time = datetime.fromisoformat(time.replace("Z", "+00:00"))
    if plural:
        meta = obj.get("metadata") or {}
        ns = meta.get("namespace")
        ns_part = f"/namespaces/{ns}" if ns else ""
        subject = f"/apis/{obj['apiVersion']}{ns_part}/{plural}/{meta.get('name')}"
    else:
        subject = subject_for(obj)
    attributes: dict[str, Any] = {
        "specversion": "1.0",
        "id": event_id(change, obj),
        "type": RESOURCE_PREFIX + change,
        "source": source,
        "subject": subject,
        "time": time,
        "datacontenttype": "application/json",
        **kube_extensions(obj),
    }
    return CloudEvent(attributes=attributes, data=obj)


def simple_event(type_: str, source: str, data: Any = None,
                 event_id_: str | None = None) -> CloudEvent:
    """A non-Kubernetes event (the rate refresh, a test ping)."""
    attributes: dict[str, Any] = {"specversion": "1.0", "type": type_, "source": source}
    if event_id_:
        attributes["id"] = event_id_
    if data is not None:
        attributes["datacontenttype"] = "application/json"
    return CloudEvent(attributes=attributes, data=data)


def to_http(event: CloudEvent) -> tuple[dict[str, str], bytes]:
    """Binary content mode: attributes as ``ce-`` headers, the object as the JSON body."""
    message = to_binary(event, _FORMAT)
    return dict(message.headers), message.body
