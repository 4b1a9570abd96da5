"""CloudEvents on the wire for the router tests, built with the SDK as a real sender would."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from cloudevents.core.bindings.http import to_binary, to_structured
from cloudevents.core.formats.json import JSONFormat
from cloudevents.core.v1.event import CloudEvent

from eventop.events import kube_extensions

# Event types of the handlers in tests/router/recording_handlers.py (loaded by router processes
# only, so the test process never registers them).
RECORD_ENV = "EVENTOP_TEST_RECORD"
FAIL_TYPE = "test.eventop.fail"
UNAVAILABLE_TYPE = "test.eventop.unavailable"
SLOW_TYPE = "test.eventop.slow"
KUBE_TYPE = "test.eventop.kube"
# The recording handler for each kind in the recordings, by (apiVersion, kind).
HANDLER_FOR_KIND = {("v1", "ConfigMap"): "configmaps", ("v1", "Secret"): "secrets",
                    ("v1", "Namespace"): "namespaces",
                    ("eventop.dev/v1", "CopyRule"): "copy_rules",
                    ("eventop.dev/v1", "RegistryMirror"): "mirrors",
                    ("eventop.dev/v1", "ExchangeRate"): "exchange_rates"}
FORMAT = JSONFormat()
SEEN = datetime(2026, 11, 21, 7, 40, 58, tzinfo=UTC)


def configmap(name: str = "app-config", namespace: str = "default",
              data: dict[str, str] | None = None, uid: str = "uid-1",
              resource_version: str = "100") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": namespace, "uid": uid,
                         "resourceVersion": resource_version},
            "data": data if data is not None else {"key": "value"}}


def cloudevent(type_: str, data: Any = None, *, id_: str = "event-1", source: str = "/tests",
               extensions: dict[str, str] | None = None, subject: str | None = None,
               content_type: str | None = "application/json") -> CloudEvent:
    attrs: dict[str, Any] = {"specversion": "1.0", "id": id_, "source": source, "type": type_,
                             "time": SEEN, **(extensions or {})}
    if subject:
        attrs["subject"] = subject
    if content_type and data is not None:
        attrs["datacontenttype"] = content_type
    return CloudEvent(attributes=attrs, data=data)


def kube_event(change: str, obj: dict[str, Any], *, id_: str | None = None,
               mode: str = "resource") -> CloudEvent:
    """What ApiServerSource (or our watcher) sends for one change of ``obj``."""
    meta = obj.get("metadata") or {}
    data: dict[str, Any] = obj
    if mode == "ref":
        data = {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "name": meta["name"],
                **({"namespace": meta["namespace"]} if meta.get("namespace") else {})}
    return cloudevent(f"dev.knative.apiserver.{mode}.{change}", data,
                      id_=id_ or f"{meta.get('uid')}/{meta.get('resourceVersion')}/{change}",
                      source="https://10.96.0.1:443", extensions=kube_extensions(obj))


def binary(event: CloudEvent) -> tuple[dict[str, str], bytes]:
    message = to_binary(event, FORMAT)
    return dict(message.headers), message.body


def structured(event: CloudEvent) -> tuple[dict[str, str], bytes]:
    message = to_structured(event, FORMAT)
    return dict(message.headers), message.body
