"""What the router's RBAC is derived from: the built-in handlers driven through the router's
Flask app in this process against the local API server, over scenarios that reach every
API call they make (see ``test_rbac.py``, which checks the manifests against the trace).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
from collections.abc import Iterator
from typing import Any

from eventop.testing.cluster import load_crds
from eventop.testing.waiting import wait_until
from tests.install.database_scenarios import DatabaseScenarios
from tests.install.rbac import KubeRecorder
from tests.install.support import REPO, env_of, find, pod_template, render

RECORDINGS = REPO / "tests" / "recordings"
RATES_URL = "https://rates.test/v1"


# -- the router's scenarios ------------------------------------------------------------------

class RouterScenarios:
    """Drive the router's Flask app in-process, changing the world through the local API."""

    def __init__(self, local_kube: Any, client: Any) -> None:
        self.local_kube = local_kube
        self.client = client
        self.ids = itertools.count()
        self.answers: list[tuple[int, Any]] = []

    def post(self, change: str, obj: dict) -> int:
        from eventop.events import to_cloudevent, to_http

        headers, body = to_http(to_cloudevent(change, obj, "https://127.0.0.1:6443"))
        return self._answer(self.client.post("/", data=body, headers=headers))

    def _answer(self, response: Any) -> int:
        """Keep every answer; a 4xx means the scenario sent a bad event (a test bug)."""
        self.answers.append((response.status_code, response.get_json(silent=True)))
        assert response.status_code < 400 or response.status_code >= 500, self.answers[-1]
        return int(response.status_code)

    def post_type(self, type_: str) -> int:
        from cloudevents.core.v1.event import CloudEvent

        from eventop.events import to_http

        headers, body = to_http(CloudEvent(attributes={
            "type": type_, "source": "/tests/install", "id": f"rbac-{next(self.ids)}",
            "specversion": "1.0"}))
        return self._answer(self.client.post("/", data=body, headers=headers))

    def post_ref(self, change: str, obj: dict) -> int:
        """A Reference-mode event (Knative ApiServerSource ``mode: Reference``)."""
        from cloudevents.core.v1.event import CloudEvent

        from eventop.events import to_http

        meta = obj["metadata"]
        headers, body = to_http(CloudEvent(attributes={
            "type": f"dev.knative.apiserver.ref.{change}", "source": "https://127.0.0.1:6443",
            "id": f"rbac-{next(self.ids)}", "specversion": "1.0",
            "datacontenttype": "application/json", "kind": obj["kind"],
            "name": meta["name"], "namespace": meta.get("namespace") or "",
            "apiversion": obj["apiVersion"]},
            data={"apiVersion": obj["apiVersion"], "kind": obj["kind"], "name": meta["name"],
                  "namespace": meta.get("namespace")}))
        return self._answer(self.client.post("/", data=body, headers=headers))

    def put(self, obj: dict, change: str = "update") -> dict:
        from eventop.testing import world_copy

        stored = self.local_kube.put(world_copy(obj))
        self.post(change, stored)
        return stored

    def replay(self, name: str) -> None:
        from eventop.testing import world_copy
        from eventop.watcher.recording import load_initial, load_recording

        paths = [RECORDINGS / name]
        for obj in load_initial(paths):
            self.post("add", self.local_kube.put(world_copy(obj)))
        for change, obj in load_recording(paths):
            meta = obj["metadata"]
            if change == "delete" or (obj["kind"] == "Namespace"
                                      and meta.get("deletionTimestamp")):
                self.local_kube.remove(obj["apiVersion"], obj["kind"], meta["name"],
                                       meta.get("namespace"))
                # Not the recording's resourceVersion: this API server's are different (the
                # router would wait for its cache to reach a version that never comes).
                gone = json.loads(json.dumps(obj))
                gone["metadata"].pop("resourceVersion", None)
                self.post("delete", gone)
            else:
                self.post(change, self.local_kube.put(world_copy(obj)))
        self.local_kube.wait_idle()

    def forged_delete(self) -> None:
        """A delete event for an object that still exists (stale, or forged): the cache never
        sees it go, so after its wait the router asks the API server (a list by name) and,
        finding the object, trusts its cache instead of answering 503 forever."""
        alive = self.local_kube.get("v1", "Namespace", "rbac-configmap")
        assert alive is not None
        assert self.post("delete", alive) == 200, self.answers[-1]

    def copy_lifecycle(self, kind: str) -> None:
        """A rule of each type through a copy's whole life: created, edited by hand with an
        extra key (server-side apply can not drop it: replaced), deleted by hand (restored),
        blocked by someone else's object (a conflict), and the source deleted (copies
        deleted). Copy rules handle ConfigMaps and Secrets alike, so both kinds run."""
        name = f"rbac-{kind.lower()}"
        self.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}},
                 change="add")
        self.put({"apiVersion": "eventop.dev/v1", "kind": "CopyRule", "metadata": {"name": name},
                  "spec": {"ruleType": kind.lower(), "namespaces": [name],
                           "selector": {"matchLabels": {"rbac-test": "yes"}}}}, change="add")
        source = self.put({"apiVersion": "v1", "kind": kind, "metadata": {
            "name": "rbac-source", "namespace": name, "labels": {"rbac-test": "yes"}},
            "data": {"a": "MQ=="}}, change="add")
        copies = [o for o in self.local_kube.list("v1", kind)
                  if o["metadata"]["name"] == "rbac-source"
                  and o["metadata"].get("ownerReferences")]
        assert len(copies) >= 2, f"CopyRule {name} made no copies of its source"
        edited = json.loads(json.dumps(copies[0]))
        edited.setdefault("data", {})["added-by-hand"] = "eA=="
        self.put(edited)
        gone = copies[-1]
        self.local_kube.remove("v1", kind, "rbac-source", gone["metadata"]["namespace"])
        self.post("delete", gone)
        conflict_ns = f"{name}-conflict"
        self.local_kube.put({"apiVersion": "v1", "kind": "Namespace",
                             "metadata": {"name": conflict_ns}})
        self.local_kube.put({"apiVersion": "v1", "kind": kind, "metadata": {
            "name": "rbac-source", "namespace": conflict_ns}, "data": {"mine": "eWVz"}})
        self.post("add", self.local_kube.get("v1", "Namespace", conflict_ns))
        self.local_kube.remove("v1", kind, "rbac-source", name)
        self.post("delete", source)
        left = [o for o in self.local_kube.list("v1", kind)
                if o["metadata"]["name"] == "rbac-source" and o["metadata"].get("ownerReferences")]
        assert left == [], f"the copies of a deleted {kind} source were not deleted"

    def copy_conflicts(self, recorder: KubeRecorder) -> None:
        """More conflicting slots than one reconcile posts Warning Events for (a summary
        Event), and a slot taken by someone else between the rule's read and its write."""
        # main-rule (from the recording) copies a new source, default/rbac-source.
        rule = self.local_kube.get("eventop.dev/v1", "CopyRule", "main-rule")
        assert rule is not None, "the copy-rules recording no longer leaves main-rule"
        kind = "Secret" if rule["spec"]["ruleType"] == "secret" else "ConfigMap"
        self.put({"apiVersion": "v1", "kind": kind, "metadata": {
            "name": "rbac-source", "namespace": rule["spec"]["namespaces"][0],
            "labels": rule["spec"]["selector"]["matchLabels"]}, "data": {"a": "MQ=="}},
            change="add")
        for i in range(12):
            ns = f"rbac-many-{i}"
            self.local_kube.put({"apiVersion": "v1", "kind": "Namespace",
                                 "metadata": {"name": ns}})
            self.local_kube.put({"apiVersion": "v1", "kind": kind, "metadata": {
                "name": "rbac-source", "namespace": ns}, "data": {"theirs": "eWVz"}})
        self.post("update", self.local_kube.get("eventop.dev/v1", "CopyRule",
                                                rule["metadata"]["name"]))
        plural = f"{kind.lower()}s"

        def someone_else_first(call: Any) -> None:
            if call.method == "POST" and call.path.endswith(f"/namespaces/rbac-race/{plural}"):
                recorder.interceptors.remove(someone_else_first)
                self.local_kube.put({"apiVersion": "v1", "kind": kind, "metadata": {
                    "name": "rbac-source", "namespace": "rbac-race"},
                    "data": {"a": "dGhlaXJz"}})  # the same key as the source, their value

        recorder.interceptors.append(someone_else_first)
        self.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "rbac-race"}},
                 change="add")
        assert someone_else_first not in recorder.interceptors, "no copy into rbac-race"
        # A selector only the API server refuses (In with no values): InvalidSpec status.
        self.put({"apiVersion": "eventop.dev/v1", "kind": "CopyRule",
                  "metadata": {"name": "rbac-invalid"},
                  "spec": {"ruleType": "configmap", "namespaces": ["default"], "selector": {
                      "matchExpressions": [{"key": "a", "operator": "In", "values": []}]}}},
                 change="add")

    def mirror_credentials_resize_and_reference_mode(self, recorder: KubeRecorder) -> None:
        """A mirror whose credentials Secret is missing (Warning Event) and then appears
        (Normal Event); a resize the API server refuses (the recorded 422 for an unbound
        claim); workload events in Knative's Reference mode."""
        import yaml

        examples = REPO / "crds" / "examples"
        mirror = next(o for o in yaml.safe_load_all(
            (examples / "registrymirror-internal.yaml").read_text()) if o["kind"] ==
            "RegistryMirror")
        secret = yaml.safe_load((examples / "registrymirror-internal-credentials.yaml")
                                .read_text())
        mirror = self.put(mirror, change="add")
        self.put(secret, change="add")
        refused = (RECORDINGS / "errors" / "apply-422-pvc-resize-unbound.json").read_bytes()

        def refuse_resize(call: Any) -> None:
            if call.method == "PATCH" and "/persistentvolumeclaims/" in call.path and (
                    isinstance(call.body, dict)  # (not the hand-over's JSON patch, a list)
                    and call.body.get("spec", {}).get("resources", {}).get(
                        "requests", {}).get("storage") == "200Gi"):
                recorder.interceptors.remove(refuse_resize)
                from eventop.kube.errors import from_response

                raise from_response(422, refused, f"apply {call.path}")

        recorder.interceptors.append(refuse_resize)
        bigger = self.local_kube.get("eventop.dev/v1", "RegistryMirror", "internal",
                                     mirror["metadata"]["namespace"])
        bigger["spec"]["storage"]["size"] = "200Gi"
        self.put(bigger)
        assert refuse_resize not in recorder.interceptors, "the mirror never asked to resize"
        sts = next(o for o in self.local_kube.list("apps/v1", "StatefulSet",
                                                   mirror["metadata"]["namespace"])
                   if any(r.get("name") == "internal"
                          for r in o["metadata"].get("ownerReferences") or []))
        self.post_ref("update", sts)
        self.post_ref("delete", sts)

    def mirror_changes(self) -> None:
        """A mirror's spec changed (registry and node proxy updated in place), and one of its
        Services edited by hand (put back)."""
        mirror = json.loads(json.dumps(self.local_kube.get(
            "eventop.dev/v1", "RegistryMirror", "quay", "registry-mirrors")))
        mirror["spec"].update(upstream="https://mirror.example.com", hostPort=5102)
        self.put(mirror)
        svc = next(o for o in self.local_kube.list("v1", "Service", "registry-mirrors")
                   if o["metadata"]["name"] == "mirror-quay")
        svc = json.loads(json.dumps(svc))
        svc["spec"]["ports"][0]["port"] = 5999
        self.put(svc)

    def mirror_workloads_change(self) -> None:
        for sts in self.local_kube.list("apps/v1", "StatefulSet"):
            sts = json.loads(json.dumps(sts))
            sts["status"] = {"replicas": 1, "readyReplicas": 1, "availableReplicas": 1,
                             "observedGeneration": sts["metadata"].get("generation", 1)}
            self.put(sts)
        for ds in self.local_kube.list("apps/v1", "DaemonSet"):
            self.post("update", ds)
        for mirror in self.local_kube.list("eventop.dev/v1", "RegistryMirror"):
            self.post("update", mirror)
            self.post("delete", mirror)

    def refresh_and_provider_failure(self, rates: Any) -> None:
        self.post_type("dev.eventop.exchangerates.refresh")
        self.post_type("dev.knative.sources.ping")
        rates.fail = True
        self.local_kube.put({"apiVersion": "v1", "kind": "Namespace",
                             "metadata": {"name": "rbac-rates"}})
        cr = self.put({"apiVersion": "eventop.dev/v1", "kind": "ExchangeRate",
                       "metadata": {"name": "rbac-usd", "namespace": "rbac-rates"},
                       "spec": {"currency": "USD"}}, change="add")
        self.post("update", cr)  # the same failure again: the Warning Event's count goes up
        self.post_type("dev.eventop.exchangerates.refresh")
        rates.fail = False
        self.post_type("dev.eventop.exchangerates.refresh")
        # An event for a Ready, current ExchangeRate (its own status write coming back).
        current = self.local_kube.get("eventop.dev/v1", "ExchangeRate", "rbac-usd",
                                      "rbac-rates")
        self.post("update", current)
        # The ConfigMap of an ExchangeRate deleted by hand is written again.
        cm = self.local_kube.get("v1", "ConfigMap", "rbac-usd", "rbac-rates")
        self.local_kube.remove("v1", "ConfigMap", "rbac-usd", "rbac-rates")
        self.post("delete", cm)
        self.post("update", current)
        # The delete event arriving while the ExchangeRate still exists, then after it is
        # gone but before the garbage collector removed its ConfigMap.
        self.post("delete", current)
        cm = self.local_kube.get("v1", "ConfigMap", "rbac-usd", "rbac-rates")
        self.local_kube.remove("eventop.dev/v1", "ExchangeRate", "rbac-usd", "rbac-rates")
        if cm is not None and self.local_kube.get("v1", "ConfigMap", "rbac-usd",
                                                  "rbac-rates") is None:
            from eventop.testing import world_copy

            self.local_kube.put(world_copy(cm))
        self.post("delete", current)

    def rate_configmap_race_and_takeover(self, recorder: KubeRecorder) -> None:
        """An ExchangeRate whose ConfigMap name someone takes between its read and its create
        (a conflict), and one taking over the ConfigMap of an earlier one of its name."""
        def someone_else_first(call: Any) -> None:
            if call.method == "POST" and call.path.endswith("/namespaces/rbac-rates/configmaps"):
                recorder.interceptors.remove(someone_else_first)
                self.local_kube.put({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
                    "name": "rbac-race", "namespace": "rbac-rates"}, "data": {"theirs": "yes"}})

        recorder.interceptors.append(someone_else_first)
        self.put({"apiVersion": "eventop.dev/v1", "kind": "ExchangeRate",
                  "metadata": {"name": "rbac-race", "namespace": "rbac-rates"},
                  "spec": {"currency": "USD"}}, change="add")
        assert someone_else_first not in recorder.interceptors, "no ConfigMap for rbac-race"
        self.local_kube.put({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
            "name": "rbac-again", "namespace": "rbac-rates", "ownerReferences": [{
                "apiVersion": "eventop.dev/v1", "kind": "ExchangeRate", "name": "rbac-again",
                "uid": "u-earlier", "controller": True}]}, "data": {"rate": "0.5"}})
        self.put({"apiVersion": "eventop.dev/v1", "kind": "ExchangeRate",
                  "metadata": {"name": "rbac-again", "namespace": "rbac-rates"},
                  "spec": {"currency": "USD"}}, change="add")


def builtin_registry() -> Any:
    """The shipped handlers only (what the router runs without EVENTOP_HANDLERS)."""
    from eventop import handlers

    registry = handlers.load("", builtin=None)
    modules = [r.module for r in registry.registrations] + [c.module
                                                              for c in registry.controllers]
    assert {m.split(".")[2] for m in modules} >= {"copy_rules", "exchange_rates", "mirrors"}
    return registry


class FakeRates:
    """The Frankfurter API as requests-mock answers it: every asked currency at 1.25."""

    def __init__(self) -> None:
        self.fail = False
        self.calls = 0

    def __call__(self, request: Any, context: Any) -> Any:
        self.calls += 1
        if self.fail:
            context.status_code = 404
            return {"message": "not found"}
        base = request.qs.get("from", ["eur"])[0].upper()
        to = [c.upper() for c in request.qs.get("to", [""])[0].split(",") if c]
        context.headers["Content-Type"] = "application/json"
        return {"amount": 1.0, "base": base, "date": "2026-11-20",
                "rates": {c: 1.25 + 0.01 * self.calls for c in to}}


def manifest_env(name: str) -> str:
    """A variable of deploy/'s router container ("" when it does not set it)."""
    container, = pod_template(find(render("deploy"), "Deployment", "eventop-router")
                              )["spec"]["containers"]
    return env_of(container).get(name, "")


@contextlib.contextmanager
def traced_router() -> Iterator[KubeRecorder]:
    """Every scenario through the router's real app in this process, against the local API
    server, with every API request it made recorded (and the line of code that made it)."""
    import requests_mock

    from eventop.handlers.exchange_rates import provider
    from eventop.kube import Kube
    from eventop.localkube import LocalKube
    from eventop.router.app import create_app

    rates = FakeRates()
    client = provider.FrankfurterClient(RATES_URL, sleep=lambda _s: None)
    original_get_client = provider.get_client
    provider.get_client = lambda: client  # type: ignore[assignment]
    server = LocalKube(crd_dir=str(REPO / "crds"))
    server.start()
    for crd in load_crds([REPO / "tests" / "databases" / "schemas"]):  # the snapshot API
        server.put(crd)
    recorder = KubeRecorder()
    engines: list[Any] = []
    # A delete the cache never sees is checked against the API server after this wait.
    os.environ["EVENTOP_CACHE_WAIT_SECONDS"] = "1"
    # As deploy/ runs it (leader election, say), so that its requests are derived too.
    os.environ["EVENTOP_RUN_ON_WATCH"] = manifest_env("EVENTOP_RUN_ON_WATCH")
    try:
        with requests_mock.Mocker() as mock, recorder.recording():
            mock.get(f"{RATES_URL}/latest", json=rates)
            # The engine starts with the first probe, which so finds a client that has heard
            # nothing from the API server yet and pings it (derived like any other request).
            app = create_app(registry=builtin_registry(), kube=Kube.connect(url=server.url),
                             start_engine=False)
            engines.append(app.extensions["eventop"]["engine"])
            scenarios = RouterScenarios(server, app.test_client())
            assert wait_until(lambda: app.test_client().get("/readyz").status_code == 200, 30)
            scenarios.replay("copy-rules")
            scenarios.copy_lifecycle("ConfigMap")
            scenarios.copy_lifecycle("Secret")
            scenarios.copy_conflicts(recorder)
            scenarios.forged_delete()
            scenarios.replay("mirrors-and-rates")
            scenarios.mirror_changes()
            scenarios.mirror_workloads_change()
            scenarios.mirror_credentials_resize_and_reference_mode(recorder)
            scenarios.refresh_and_provider_failure(rates)
            scenarios.rate_configmap_race_and_takeover(recorder)
            DatabaseScenarios(scenarios, recorder).run()
            if os.environ["EVENTOP_RUN_ON_WATCH"] == "leader":
                # The leader renews its Lease every 2 s: one renewal, however quickly the
                # scenarios ran (a run shorter than that derived no update of the Lease).
                assert wait_until(lambda: any(
                    c.method == "PUT" and "/leases/" in c.path for c in recorder.calls), 15)
            server.wait_idle()
        if os.environ.get("EVENTOP_RBAC_DEBUG"):
            for answer in scenarios.answers:
                print(answer)
        yield recorder
    finally:
        del os.environ["EVENTOP_CACHE_WAIT_SECONDS"], os.environ["EVENTOP_RUN_ON_WATCH"]
        for engine in engines:
            engine.stop()
        provider.get_client = original_get_client  # type: ignore[assignment]
        server.stop()
