"""RBAC is derived from the code, and the manifests must grant exactly that: no less, no more.

* Router: the built-in handlers run through the router's real Flask app (in this process, so
  every API request is seen with the line of code that made it) against the local API server,
  over scenarios that reach their API calls: the recorded copy-rules and mirrors-and-rates
  traffic, a scheduled refresh, a provider failure (Warning Events, created then counted), a
  mirror's StatefulSet changing, copies edited and deleted by hand. Every request is mapped to
  the (apiGroup, resource, verb) the API server authorizes; the ownerReferences the router
  writes add ``update`` on the owners' ``finalizers``. A static scan lists every
  ``kube.<method>(...)`` call in ``handlers/`` and ``router/``; one the scenarios did not reach
  fails the test (its permissions could not be derived), unless :data:`NOT_REACHED` explains it.
* Watcher: ``python -m eventop.watcher run`` (the image's command) against the local API server;
  its list and watch requests, as served, are the permissions it needs.
* Refresh CronJob: ``python -m eventop.watcher emit`` makes no API request at all, so its
  ServiceAccount has no binding and mounts no token.
* ApiServerSource: Knative requires get, list and watch on each resource it watches, which
  must be the watcher's resources.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest

from eventop.testing.cluster import load_crds
from eventop.testing.waiting import wait_until
from tests.install.rbac import (
    Access,
    KubeRecorder,
    Site,
    access_of,
    granted,
    kube_call_sites,
    reached,
)
from tests.install.support import (
    REPO,
    Sink,
    command_of,
    env_of,
    find,
    needs_kubectl,
    pod_template,
    render,
)

pytestmark = needs_kubectl

NAMESPACE = "eventop-system"
RECORDINGS = REPO / "tests" / "recordings"
RATES_URL = "https://rates.test/v1"

# Call sites the scenarios can not reach, each with why its permissions are still covered.
# Keep this empty where possible: an entry here is a permission derived by hand.
NOT_REACHED: dict[str, str] = {}


# -- helpers ---------------------------------------------------------------------------------

def plurals() -> dict[tuple[str, str], tuple[str, str]]:
    from eventop.kube.resources import BUILTIN

    return {(r.api_version, r.kind): (r.group, r.plural) for r in BUILTIN}


def served_accesses(local_kube: Any) -> set[Access]:
    found: set[Access] = set()
    for method, path, query, _status in list(local_kube.requests):
        found |= access_of(method, path, query)
    return found


def manifest_run(local_kube: Any, kind: str, name: str, sink: Sink
                 ) -> tuple[list[str], dict[str, str]]:
    """The command and environment of the deploy/ container ``kind``/``name``, aimed at the
    local API server and ``sink``: whatever the manifest turns on (leader election, say) is
    what the derivation sees."""
    container, = pod_template(find(render("deploy"), kind, name))["spec"]["containers"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBECONFIG", "EVENTOP_"))}
    env.update(env_of(container))
    env.update(EVENTOP_KUBE_URL=local_kube.url, PYTHONPATH=str(REPO), KUBECONFIG=os.devnull,
               K_SINK=sink.url)
    return command_of(container, env), env


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
                    (call.body or {}).get("spec", {}).get("resources", {}).get(
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


class DatabaseScenarios:
    """A Database's life through the router (the scenarios' events posted by hand): created,
    its server ready (the StatefulSet controller played: claims, status), initialized, a
    scheduled backup, a minor and a major upgrade, deleted under each policy with the
    snapshot API served, a Retain'd Database's Secret adopted by the next, a Secret another
    router process made between our read and our create. What this reaches is what the
    router needs for Databases (its verbs on their Jobs, CronJobs, claims, snapshots,
    finalizers and status)."""

    def __init__(self, scenarios: RouterScenarios, recorder: KubeRecorder) -> None:
        self.s = scenarios
        self.local_kube = scenarios.local_kube
        self.recorder = recorder
        self.ns = "rbac-db"

    def get(self, api_version: str, kind: str, name: str) -> dict:
        found = self.local_kube.get(api_version, kind, name, self.ns)
        assert found is not None, f"the router made no {kind} {name}"
        return dict(found)

    def status(self, api_version: str, kind: str, name: str, status: dict) -> dict:
        """Write what a controller would (a Job's verdict, a StatefulSet's pods)."""
        obj = self.get(api_version, kind, name)
        obj["status"] = status
        return self.s.put(obj)

    def servers(self, name: str) -> None:
        """The StatefulSet controller: claims from the template, every replica ready (or
        none left, once scaled to zero)."""
        sts = self.get("apps/v1", "StatefulSet", name)
        spec = sts["spec"]
        for i in range(spec["replicas"]):
            template = spec["volumeClaimTemplates"][0]
            claim = f"{template['metadata']['name']}-{name}-{i}"
            if self.local_kube.get("v1", "PersistentVolumeClaim", claim, self.ns) is None:
                self.s.put({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                            "metadata": {"name": claim, "namespace": self.ns, "labels": {
                                **template["metadata"]["labels"],
                                **spec["selector"]["matchLabels"]}},
                            "spec": template["spec"]}, change="add")
        n = spec["replicas"]
        self.status("apps/v1", "StatefulSet", name, {
            "observedGeneration": sts["metadata"]["generation"], "replicas": n,
            "readyReplicas": n, "updatedReplicas": n, "currentRevision": f"{name}-r",
            "updateRevision": f"{name}-r"})

    def job_done(self, name: str) -> None:
        self.status("batch/v1", "Job", name, {
            "startTime": "2026-11-20T10:00:00Z", "completionTime": "2026-11-20T10:01:00Z",
            "succeeded": 1, "conditions": [{"type": "Complete", "status": "True",
                                            "lastTransitionTime": "2026-11-20T10:01:00Z"}]})

    def job_named(self, prefix: str) -> str:
        (name,) = [j["metadata"]["name"] for j in self.local_kube.list("batch/v1", "Job",
                                                                         self.ns)
                   if j["metadata"]["name"].startswith(prefix)]
        return str(name)

    def delete(self, name: str) -> None:
        """The user deletes it: the finalizer holds it (an update event)."""
        db = self.get("eventop.dev/v1", "Database", name)
        self.local_kube.remove("eventop.dev/v1", "Database", name, self.ns)
        held = self.local_kube.get("eventop.dev/v1", "Database", name, self.ns)
        self.s.post("update", held or db)

    def database(self, name: str, **spec: Any) -> dict:
        return self.s.put({"apiVersion": "eventop.dev/v1", "kind": "Database",
                           "metadata": {"name": name, "namespace": self.ns},
                           "spec": {"engine": "postgres", "storage": {"size": "1Gi"}, **spec}},
                          change="add")

    def run(self) -> None:
        self.s.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": self.ns}},
                   change="add")
        self.life()
        self.policies()
        self.secret_made_by_another_router()

    def life(self) -> None:
        self.database("orders", version="16.10")
        self.servers("orders-pg16")
        self.job_done("orders-init")
        cron = self.get("batch/v1", "CronJob", "orders-backup")
        template = cron["spec"]["jobTemplate"]
        self.s.put({"apiVersion": "batch/v1", "kind": "Job", "metadata": {
            "name": "orders-backup-1", "namespace": self.ns,
            "labels": template["metadata"]["labels"], "ownerReferences": [{
                "apiVersion": "batch/v1", "kind": "CronJob", "name": "orders-backup",
                "uid": cron["metadata"]["uid"], "controller": True}]},
            "spec": template["spec"]}, change="add")
        self.job_done("orders-backup-1")
        for version, sts in (("16.11", "orders-pg16"), ("17", "orders-pg17")):
            db = self.get("eventop.dev/v1", "Database", "orders")
            db["spec"]["version"] = version
            self.s.put(db)
            self.job_done(self.job_named(f"orders-backup-{version.replace('.', '-')}"))
            self.servers(sts)
        self.job_done("orders-upgrade-pg17")
        assert self.get("eventop.dev/v1", "Database", "orders")["status"]["version"] == "17.7"
        self.delete("orders")
        self.scaled_down("orders-pg17")
        for snapshot in self.local_kube.list("snapshot.storage.k8s.io/v1", "VolumeSnapshot",
                                             self.ns):
            self.status("snapshot.storage.k8s.io/v1", "VolumeSnapshot",
                        snapshot["metadata"]["name"], {"readyToUse": True})
        assert self.local_kube.get("eventop.dev/v1", "Database", "orders", self.ns) is None

    def scaled_down(self, name: str) -> None:
        assert self.get("apps/v1", "StatefulSet", name)["spec"]["replicas"] == 0
        self.servers(name)

    def policies(self) -> None:
        for name, policy in (("keep", "Retain"), ("scratch", "Delete")):
            self.database(name, version="16", deletionPolicy=policy)
            self.servers(f"{name}-pg16")
            self.delete(name)
        self.scaled_down("scratch-pg16")
        assert self.local_kube.get("v1", "Secret", "scratch-credentials", self.ns) is None
        self.database("keep", version="16", deletionPolicy="Retain")  # adopts the Secret
        secret = self.get("v1", "Secret", "keep-credentials")
        assert secret["metadata"]["labels"]["eventop.dev/parent-uid"] == self.get(
            "eventop.dev/v1", "Database", "keep")["metadata"]["uid"]

    def secret_made_by_another_router(self) -> None:
        """Between this router's read and its create, another router process made the
        Secret: the create's 409 is answered by a read, and the Secret is left as it is."""
        theirs: dict[str, Any] = {}

        def another_router_first(call: Any) -> None:
            if call.method == "POST" and call.path.endswith(f"/namespaces/{self.ns}/secrets"):
                self.recorder.interceptors.remove(another_router_first)
                body = json.loads(json.dumps(call.body))
                body["data"] = {**body["data"], "password": "dGhlaXJz"}
                theirs.update(self.local_kube.put(body))

        self.recorder.interceptors.append(another_router_first)
        self.database("race", version="16")
        assert theirs, "the router made no Secret"
        assert self.get("v1", "Secret", "race-credentials")["data"]["password"] == "dGhlaXJz"


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


@pytest.fixture(scope="module")
def router_trace() -> Iterator[KubeRecorder]:
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
    try:
        with requests_mock.Mocker() as mock, recorder.recording():
            mock.get(f"{RATES_URL}/latest", json=rates)
            app = create_app(registry=builtin_registry(), kube=Kube.connect(url=server.url))
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
            server.wait_idle()
        if os.environ.get("EVENTOP_RBAC_DEBUG"):
            for answer in scenarios.answers:
                print(answer)
        yield recorder
    finally:
        del os.environ["EVENTOP_CACHE_WAIT_SECONDS"]
        for engine in engines:
            engine.stop()
        provider.get_client = original_get_client  # type: ignore[assignment]
        server.stop()


# -- router ----------------------------------------------------------------------------------

def cache_accesses() -> set[Access]:
    """list and watch of every kind a built-in controller declares: the router's cache holds
    them, whether or not the local API server of the scenarios serves them (Jobs, say)."""
    table = plurals()
    found = set()
    for ctl in builtin_registry().controllers:
        for kind in ctl.kinds():
            group, plural = table[kind.key]
            found |= {Access(group, plural, "list"), Access(group, plural, "watch")}
    return found


def derived_router_accesses(trace: KubeRecorder) -> set[Access]:
    return trace.accesses() | trace.owner_finalizer_accesses(plurals()) | cache_accesses() | \
        trace.reads_after_create()


def test_router_is_granted_exactly_what_its_handlers_use(router_trace: KubeRecorder) -> None:
    need = derived_router_accesses(router_trace)
    have = granted(render("deploy"), "eventop-router", NAMESPACE)
    missing, unused = sorted(map(str, need - have)), sorted(map(str, have - need))
    assert not missing, "the router needs these, add them to its role: " + "; ".join(missing)
    assert not unused, "granted to the router but never used, remove: " + "; ".join(unused)


def test_knative_router_gets_the_same_permissions() -> None:
    assert granted(render("knative"), "eventop-router", NAMESPACE) == granted(
        render("deploy"), "eventop-router", NAMESPACE)


def test_every_kube_call_in_the_router_and_handlers_was_reached(
        router_trace: KubeRecorder) -> None:
    """A call the scenarios never made is a permission nobody derived."""
    sites = [s for room in ("handlers", "engine", "router") for s in kube_call_sites(room)]
    assert sites, "the static scan found no kube calls: is it still looking at the code?"
    missed = {str(s) for s in set(sites) - reached(sites, router_trace.calls)}
    unexplained = sorted(m for m in missed if m.split(" ")[0] not in NOT_REACHED)
    assert not unexplained, ("add a scenario reaching these (or explain in NOT_REACHED): "
                             + "; ".join(unexplained))


def test_router_scenarios_exercised_every_handler_kind(router_trace: KubeRecorder) -> None:
    """The derivation saw each handler's writes (a silently broken scenario would not)."""
    writes = {(a.resource, a.verb) for a in router_trace.accesses()}
    for resource, verb in (("jobs", "create"), ("cronjobs", "patch"), ("statefulsets", "delete"),
                           ("persistentvolumeclaims", "delete"), ("volumesnapshots", "create"),
                           ("databases", "patch"), ("databases/status", "patch")):
        assert (resource, verb) in writes, (resource, verb)
    for resource in ("statefulsets", "daemonsets", "services", "persistentvolumeclaims"):
        assert (resource, "patch") in writes, resource  # a mirror's objects: applied
    for resource in ("configmaps", "secrets"):  # copies, rates: created, replaced, deleted
        assert {(resource, v) for v in ("create", "update", "delete")} <= writes, resource
    for cr in ("copyrules", "registrymirrors", "exchangerates"):
        assert (f"{cr}/status", "patch") in writes, cr
    assert ("events", "create") in writes and ("events", "patch") in writes


def test_static_scan_finds_calls_through_self_kube() -> None:
    rel = [s for room in ("handlers", "engine") for s in kube_call_sites(room)
           if isinstance(s, Site)]
    assert {s.method for s in rel} >= {"get_or_none", "pages", "apply", "patch_status"}


# -- access mapping --------------------------------------------------------------------------

@pytest.mark.parametrize("method,path,query,content_type,expected", [
    ("GET", "/api/v1/namespaces/a/configmaps/x", "", None, {("", "configmaps", "get")}),
    ("GET", "/api/v1/configmaps", "limit=500", None, {("", "configmaps", "list")}),
    ("GET", "/apis/apps/v1/statefulsets", "watch=true&resourceVersion=5", None,
     {("apps", "statefulsets", "watch")}),
    ("GET", "/api/v1/namespaces/team-a", "", None, {("", "namespaces", "get")}),
    ("GET", "/api/v1/namespaces", "", None, {("", "namespaces", "list")}),
    ("PATCH", "/apis/eventop.dev/v1/copyrules/r/status", "", "application/merge-patch+json",
     {("eventop.dev", "copyrules/status", "patch")}),
    ("PATCH", "/api/v1/namespaces/a/secrets/s", "fieldManager=eventop",
     "application/apply-patch+yaml", {("", "secrets", "patch"), ("", "secrets", "create")}),
    ("PUT", "/api/v1/namespaces/a/configmaps/x", "", None, {("", "configmaps", "update")}),
    ("POST", "/api/v1/namespaces/a/events", "", None, {("", "events", "create")}),
    ("DELETE", "/apis/apps/v1/namespaces/a/daemonsets/d", "", None,
     {("apps", "daemonsets", "delete")}),
    ("GET", "/version", "", None, set()),
    ("GET", "/apis/eventop.dev/v1", "", None, set()),
])
def test_requests_map_to_the_permissions_the_api_server_checks(
        method: str, path: str, query: str, content_type: str | None,
        expected: set[tuple[str, str, str]]) -> None:
    assert access_of(method, path, query, content_type) == {Access(*e) for e in expected}


# -- watcher, refresh, ApiServerSource -------------------------------------------------------

def watcher_resources() -> list[Any]:
    """What the watcher watches by default: what the built-in handlers listen to."""
    from eventop.watcher.specs import default_resources

    return default_resources(builtin_registry())


def test_watcher_is_granted_exactly_what_it_lists_and_watches(local_kube: Any) -> None:
    """Run deploy/'s watcher command and environment against the local API server until it
    watches every default resource the local API server serves (it serves no Jobs, say);
    what it asked for must be what the handlers' declarations derive (list and watch of each
    resource), and that is what it is granted. Leader election is off there (one replica),
    so no Lease access; turned on in the manifest, it would be derived here too."""
    from eventop.kube import Kube

    derived = {(s.group, s.plural) for s in watcher_resources()}
    kube = Kube.connect(url=local_kube.url)
    served = {(s.group, s.plural) for s in watcher_resources()
              if any(r.plural == s.plural for r in kube.discover(s.api_version))}
    assert {("", "configmaps"), ("eventop.dev", "copyrules")} <= served
    with Sink() as sink:
        command, env = manifest_run(local_kube, "Deployment", "eventop-watcher", sink)
        proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)
        try:
            watching: set[tuple[str, str]] = set()
            deadline = time.monotonic() + 60
            while watching != served and time.monotonic() < deadline and proc.poll() is None:
                time.sleep(0.1)
                watching = {(a.group, a.resource) for a in served_accesses(local_kube)
                            if a.verb == "watch"}
        finally:
            proc.terminate()
            try:
                _out, err = proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                _out, err = proc.communicate()
    assert watching == served, f"the watcher never watched {served - watching}:\n{err[-2000:]}"
    need = {Access(g, p, v) for g, p in derived for v in ("list", "watch")}
    asked = served_accesses(local_kube)
    assert asked <= need, f"the watcher asked for more than its handlers need: {asked - need}"
    have = granted(render("deploy"), "eventop-watcher", NAMESPACE)
    missing, unused = sorted(map(str, need - have)), sorted(map(str, have - need))
    assert not missing, "the watcher needs these, add them to its role: " + "; ".join(missing)
    assert not unused, "granted to the watcher but never used, remove: " + "; ".join(unused)


def test_refresh_job_needs_no_api_access(local_kube: Any) -> None:
    """The CronJob's command (its args, ``$(K_SINK)`` expanded) posts one event and never
    calls the Kubernetes API."""
    with Sink() as sink:
        command, env = manifest_run(local_kube, "CronJob", "eventop-rates-refresh", sink)
        proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert [h.get("ce-type") for h in sink.received] == ["dev.eventop.exchangerates.refresh"]
    assert list(local_kube.requests) == []
    objs = render("deploy")
    assert granted(objs, "eventop-refresh", NAMESPACE) == set()
    pod = find(objs, "CronJob", "eventop-rates-refresh")["spec"]["jobTemplate"]["spec"][
        "template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    assert find(objs, "ServiceAccount", "eventop-refresh")["automountServiceAccountToken"] is False


def test_apiserversource_watches_the_watchers_resources_read_only() -> None:
    """Knative's source watches what the handlers listen to (the optional kinds aside: a
    source for a kind the cluster does not serve would not start), with the same label
    selectors, and may only read them; each kind has its Trigger to the router."""
    objs = render("knative")
    source = find(objs, "ApiServerSource", "eventop")
    assert source["spec"]["mode"] == "Resource"
    table = plurals()
    watched = {(*table[(r["apiVersion"], r["kind"])],
                ",".join(f"{k}={v}" for k, v in sorted(
                    (r.get("selector") or {}).get("matchLabels", {}).items())) or None)
               for r in source["spec"]["resources"]}
    assert watched == {(s.group, s.plural, s.label_selector) for s in watcher_resources()
                       if not s.optional}
    need = {Access(g, p, v) for g, p, _ in watched for v in ("get", "list", "watch")}
    assert granted(objs, source["spec"]["serviceAccountName"], NAMESPACE) == need
    triggered = {(f["exact"]["apiversion"], f["exact"]["kind"])
                 for t in objs if t["kind"] == "Trigger"
                 for f in t["spec"].get("filters") or [] if "kind" in f.get("exact", {})}
    assert triggered == {(r["apiVersion"], r["kind"]) for r in source["spec"]["resources"]}


def test_a_kind_a_handler_listens_to_is_watched_in_both_install_modes() -> None:
    """Every kind a built-in handler listens to reaches the router: the watcher's default
    resources (deploy/) and the ApiServerSource (knative/) both cover it."""
    registry = builtin_registry()
    default = {(k.api_version, k.kind) for k in registry.watched_kinds()}
    source = find(render("knative"), "ApiServerSource", "eventop")
    knative = {(r["apiVersion"], r["kind"]) for r in source["spec"]["resources"]}
    optional = {(k.api_version, k.kind) for k in registry.watched_kinds() if k.optional}
    table = plurals()
    derived = {table[k] for k in default}
    assert {(s.group, s.plural) for s in watcher_resources()} == derived
    assert default - optional <= knative, f"nobody watches {default - optional - knative}"


@pytest.mark.parametrize("directory", ["deploy", "knative"])
def test_nobody_gets_wildcards_crd_writes_or_escalation(directory: str) -> None:
    for obj in render(directory):
        for rule in obj.get("rules") or []:
            assert "*" not in rule.get("verbs", []) + rule.get("resources", []) + rule.get(
                "apiGroups", []), obj["metadata"]["name"]
            assert not set(rule.get("verbs", [])) & {"escalate", "bind", "impersonate"}
            if "apiextensions.k8s.io" in rule.get("apiGroups", []):
                assert set(rule["verbs"]) <= {"get", "list", "watch"}
