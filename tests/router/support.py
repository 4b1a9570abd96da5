"""Helpers of the router tests: CloudEvents on the wire, built with the SDK as a real sender
would, and the router app's stand-ins (a registry of recording handlers, a Kubernetes API that
only answers pings and discovery); the fixtures built from them are in ``conftest.py``."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from cloudevents.core.bindings.http import to_binary, to_structured
from cloudevents.core.formats.json import JSONFormat
from cloudevents.core.v1.event import CloudEvent
from flask.testing import FlaskClient
from prometheus_client import REGISTRY

from eventop.engine.catchup import CacheBehind
from eventop.events import kube_extensions
from eventop.handlers.events import Event
from eventop.handlers.registry import Registry
from eventop.kube.errors import NotFound, Unavailable

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


# -- the router app's stand-ins -------------------------------------------------------------

#: Where :class:`Recorder`'s handlers are defined: their names in outcomes, logs and metrics.
HANDLERS = f"{__name__}.Recorder.__init__.<locals>"


class FakeKube:
    """Stands in for ``eventop.kube.Kube`` where only ``ping`` and discovery matter."""

    host = "http://fake-api"

    def __init__(self, reachable: bool = True, crds_installed: bool = True) -> None:
        self.reachable = reachable
        self.crds_installed = crds_installed
        self.pings = 0
        self.discoveries = 0
        #: Whether the API server answered another request of the router's just now.
        self.answered_recently = False

    def ping(self) -> None:
        self.pings += 1
        if not self.reachable:
            raise Unavailable("version /version: Kubernetes API unreachable at http://fake-api")

    def answered_within(self, seconds: float) -> bool:
        return self.answered_recently

    def missing_kinds(self, kinds: set[tuple[str, str]]) -> list[str]:
        self.discoveries += 1
        return [] if self.crds_installed else sorted(f"{k}.{v}" for v, k in kinds)


class Recorder:
    """A registry whose handlers remember what they were given."""

    def __init__(self) -> None:
        self.registry = Registry()
        self.seen: list[tuple[str, Event, Any]] = []
        on = self.registry.on

        @on("dev.knative.apiserver.*", api_version="v1", kind="ConfigMap")
        def configmaps(event: Event, kube: Any) -> str:
            self.seen.append(("configmaps", event, kube))
            return "converged"

        @on("dev.knative.apiserver.*", api_version="eventop.dev/v1", kind="CopyRule")
        def copy_rules(event: Event, kube: Any) -> None:
            self.seen.append(("copy_rules", event, kube))

        @on("dev.knative.apiserver.resource.delete", api_version="v1", kind="Secret")
        def deleted_secrets(event: Event, kube: Any) -> None:  # Secrets are listened to
            self.seen.append(("deleted_secrets", event, kube))  # (their adds go unmatched)

        @on("test.any")
        def any_data(event: Event, kube: Any) -> None:
            self.seen.append(("any_data", event, kube))

        @on("test.fail")
        def fails(event: Event, kube: Any) -> None:
            raise RuntimeError("the handler broke")

        @on("test.fail", "test.unavailable")
        def survives(event: Event, kube: Any) -> str:
            self.seen.append(("survives", event, kube))
            return "still ran"

        @on("test.unavailable")
        def api_down(event: Event, kube: Any) -> None:
            raise Unavailable("Kubernetes API unreachable (test)")

        @on("test.behind")
        def cache_behind(event: Event, kube: Any) -> None:
            raise CacheBehind("the cache of CopyRule did not reach resourceVersion 7 (test)")

        @on("test.notfound")
        def not_found(event: Event, kube: Any) -> None:
            raise NotFound("configmaps \"x\" not found", reason="NotFound")

    def handlers(self) -> list[str]:
        return [name for name, _, _ in self.seen]


def post(client: FlaskClient, message: tuple[dict[str, str], bytes], path: str = "/") -> Any:
    headers, body = message
    return client.post(path, headers=headers, data=body)


def ce_headers(**overrides: str | None) -> dict[str, str]:
    headers = {"ce-id": "event-1", "ce-source": "/tests", "ce-type": "test.any",
               "ce-specversion": "1.0", "Content-Type": "application/json"}
    for key, value in overrides.items():
        name = key.replace("_", "-")
        if value is None:
            headers.pop(name, None)
        else:
            headers[name] = value
    return headers


def metric(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def no_kube_configured(monkeypatch: Any, home: Any) -> None:
    """No Kubernetes API to be found: no URL, kubeconfig or in-cluster service, HOME elsewhere."""
    for name in ("EVENTOP_KUBE_URL", "KUBECONFIG", "KUBERNETES_SERVICE_HOST"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(home))
