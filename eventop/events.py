"""The CloudEvent contract between whoever reports Kubernetes changes and the router.

One module, imported by the watcher (which builds these events), the router (which parses
them), the handlers (which match on their types) and the tests: the contract of Knative's
ApiServerSource in Resource mode, so that the router serves our watcher and Knative alike.

* ``type``: ``dev.knative.apiserver.resource.<add|update|delete>`` (the object as data) or
  ``dev.knative.apiserver.ref.<change>`` (Reference mode: an ObjectReference as data);
* ``id``: ``<uid>/<resourceVersion>/<change>``, derived from the change itself, never random:
  a redelivered, resynced or replayed change keeps its id;
* ``subject``: ``/apis/<apiVersion>[/namespaces/<ns>]/<plural>/<name>``, informative only
  (Knative writes ``/apis/v1/...`` for core kinds and an empty namespace segment for
  cluster-scoped objects): routing uses the extensions;
* extensions ``kind``, ``name``, ``namespace`` (namespaced objects only), ``apiversion``.

Two more event types enter the router: the rate refresh posted by the CronJob
(:data:`REFRESH_TYPE`) and Knative's PingSource (:data:`PING_TYPE`).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from cloudevents.core.bindings.http import to_binary
from cloudevents.core.formats.json import JSONFormat
from cloudevents.core.v1.event import CloudEvent

from eventop.kube.resources import ResourceTable

Obj = dict[str, Any]

APISERVER_PREFIX = "dev.knative.apiserver."
RESOURCE_PREFIX = APISERVER_PREFIX + "resource."
REF_PREFIX = APISERVER_PREFIX + "ref."
#: The pattern (for ``@on``) matching every Kubernetes change, in both modes.
ANY_KUBE_CHANGE = APISERVER_PREFIX + "*"
CHANGES = ("add", "update", "delete")
REFRESH_TYPE = "dev.eventop.exchangerates.refresh"
PING_TYPE = "dev.knative.sources.ping"

_KNOWN_KINDS = ResourceTable()  # built once: subject_for runs for every event the watcher sends
_FORMAT = JSONFormat()


def kube_change_types(*changes: str) -> tuple[str, ...]:
    """``@on`` patterns for some changes only, in both modes: ``kube_change_types("delete")``."""
    for change in changes:
        if change not in CHANGES:
            raise ValueError(f"change must be one of {', '.join(CHANGES)}, not {change!r}")
    return tuple(f"{APISERVER_PREFIX}*.{change}" for change in changes)


def is_kube_type(type_: str) -> bool:
    return type_.startswith((RESOURCE_PREFIX, REF_PREFIX))


def event_id(change: str, obj: Obj) -> str:
    """``<uid>/<resourceVersion>/<change>``: stable across redelivery and replay."""
    meta = obj.get("metadata") or {}
    return f"{meta.get('uid')}/{meta.get('resourceVersion')}/{change}"


def subject_for(obj: Obj, plural: str | None = None) -> str:
    """``/apis/<apiVersion>[/namespaces/<ns>]/<plural>/<name>`` as ApiServerSource writes it.

    ``plural`` names the resource for kinds outside eventop's static table (the watcher
    knows it from discovery); otherwise it is looked up, or guessed as ``<kind>s``.
    """
    meta = obj.get("metadata") or {}
    api_version, kind = obj.get("apiVersion", ""), obj.get("kind", "")
    if plural is None:
        res = _KNOWN_KINDS.by_kind(api_version, kind)
        plural = res.plural if res else kind.lower() + "s"
    ns = meta.get("namespace")
    ns_part = f"/namespaces/{ns}" if ns else ""
    return f"/apis/{api_version}{ns_part}/{plural}/{meta.get('name')}"


def kube_extensions(obj: Obj) -> dict[str, str]:
    """The ``kind``, ``name``, ``apiversion`` (and ``namespace``) extension attributes."""
    meta = obj.get("metadata") or {}
    ext = {"kind": str(obj.get("kind", "")), "name": str(meta.get("name", "")),
           "apiversion": str(obj.get("apiVersion", ""))}
    if meta.get("namespace"):
        ext["namespace"] = str(meta["namespace"])
    return ext


def to_cloudevent(change: str, obj: Obj, source: str, time: datetime | str | None = None, *,
                  plural: str | None = None) -> CloudEvent:
    """The Resource-mode CloudEvent for one change of ``obj``.

    ``source`` is the API server URL; ``time`` is when the change was seen (now if omitted;
    an RFC 3339 string is accepted too).
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
    attributes: dict[str, Any] = {
        "specversion": "1.0",
        "id": event_id(change, obj),
        "type": RESOURCE_PREFIX + change,
        "source": source,
        "subject": subject_for(obj, plural),
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
