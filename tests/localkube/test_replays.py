"""localkube replays the recorded scenarios (tests/recordings/) as the v1.24 kube-apiserver did.

The same actions as in each recording are performed against localkube and its watch streams
compared event by event with the recorded ones: type, object, resourceVersion order and the
shape of each object; and field ownership (managedFields) evolves as recorded.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import requests

from eventop.localkube import LocalKube
from tests.localkube.support import NS_PATH, Http, cm, recording, shape


class Watches:
    """Record several watch streams at once while a scenario runs.

    Each watch starts at the version the scenario starts from, so one that connects late
    still sees every event; it ends at the first bookmark at or past the version the
    scenario ended with, so a slow scenario on a loaded machine loses nothing to a timeout.
    """

    def __init__(self, url: str, paths: list[str]) -> None:
        self.url = url
        self.events: dict[str, list[dict[str, Any]]] = {p: [] for p in paths}
        self.errors: list[BaseException] = []
        self.http = Http(url)
        self.start_rv = self._current_rv()
        self.end_rv: int | None = None
        self.threads = [threading.Thread(target=self._run, args=(p,)) for p in paths]
        for t in self.threads:
            t.start()

    def _current_rv(self) -> str:
        return str(self.http.call("GET", "/api/v1/namespaces")[1]["metadata"]["resourceVersion"])

    def _run(self, path: str) -> None:
        params = {"watch": "true", "resourceVersion": self.start_rv,
                  "allowWatchBookmarks": "true", "timeoutSeconds": "60"}
        try:
            with requests.get(self.url + path, params=params, stream=True,
                              timeout=(5, 30)) as resp:
                for line in resp.iter_lines():
                    if not line:
                        continue
                    event = json.loads(line)
                    if event["type"] != "BOOKMARK":
                        self.events[path].append(event)
                    elif self.end_rv is not None and int(
                            event["object"]["metadata"]["resourceVersion"]) >= self.end_rv:
                        return
        except BaseException as exc:  # reported by join()
            self.errors.append(exc)

    def join(self) -> dict[str, list[dict[str, Any]]]:
        self.end_rv = int(self._current_rv())
        for t in self.threads:
            t.join(30)
        self.http.close()
        assert not self.errors, self.errors
        assert not any(t.is_alive() for t in self.threads), "a watch never reached the end"
        return self.events


def _summary(events: list[dict[str, Any]], skip_root_ca: bool = False) -> list[tuple[Any, ...]]:
    out = []
    for event in events:
        meta = event["object"]["metadata"]
        if skip_root_ca and meta.get("name") == "kube-root-ca.crt" and \
                meta.get("namespace") != "team-b":
            continue
        status = event["object"].get("status") or {}
        out.append((event["type"], meta.get("namespace"), meta["name"], meta.get("generation"),
                    status.get("phase"), len(status.get("conditions") or [])))
    return out


def test_copy_rules_scenario_produces_the_recorded_watch_streams(lk: LocalKube) -> None:
    paths = ["/api/v1/namespaces", "/api/v1/configmaps", "/api/v1/secrets",
             "/apis/eventop.dev/v1/copyrules"]
    watches = Watches(lk.url, paths)
    http = Http(lk.url)
    cms, rules = "/api/v1/namespaces/{}/configmaps", "/apis/eventop.dev/v1/copyrules"
    label = [{"op": "add", "path": "/metadata/labels", "value": {"copyrator": "true"}}]
    jp = "application/json-patch+json"
    mp = "application/merge-patch+json"
    http.call("POST", NS_PATH, {"metadata": {"name": "team-a"}})
    http.call("POST", NS_PATH, {"metadata": {"name": "team-b"}})
    http.call("POST", cms.format("default"), cm("registry-config",
                                                 data={"mirror": "mirror.internal:5000"}))
    http.call("PATCH", cms.format("default") + "/registry-config", label, content_type=jp)
    http.call("POST", "/api/v1/namespaces/default/secrets", {
        "metadata": {"name": "regcred"}, "type": "kubernetes.io/dockerconfigjson",
        "data": {".dockerconfigjson": "e30="}})
    http.call("PATCH", "/api/v1/namespaces/default/secrets/regcred", label, content_type=jp)
    for name, rule_type in (("main-rule", "configmap"), ("registry-credentials", "secret")):
        http.call("POST", rules, {"apiVersion": "eventop.dev/v1", "kind": "CopyRule",
                                  "metadata": {"name": name},
                                  "spec": {"ruleType": rule_type, "namespaces": ["default"],
                                           "selector": {"matchLabels": {"copyrator": "true"}}}})
    http.call("PATCH", cms.format("default") + "/registry-config",
              {"data": {"mirror": "mirror.internal:5001", "insecure": "false"}}, content_type=mp)
    http.call("PATCH", f"{NS_PATH}/team-a", {"metadata": {"labels": {"tier": "apps"}}},
              content_type=mp)
    http.call("POST", NS_PATH, {"metadata": {"name": "team-c"}})
    http.call("POST", cms.format("team-a"), cm("registry-config", "team-a",
                                                data={"mirror": "mirror.internal:5001"}))
    http.call("PATCH", cms.format("team-a") + "/registry-config",
              {"metadata": {"labels": {"app.kubernetes.io/managed-by": "eventop"}}},
              content_type=mp)
    http.call("PATCH", f"{rules}/main-rule/status", {"status": {"copies": 1}}, content_type=mp)
    http.call("DELETE", cms.format("default") + "/registry-config")
    http.call("DELETE", f"{NS_PATH}/team-b")
    http.call("DELETE", f"{rules}/registry-credentials")
    http.close()
    got = watches.join()

    def recorded(path: str) -> list[dict[str, Any]]:
        name = "copy-rules/" + path.strip("/").replace("/", "_") + ".watch.jsonl"
        return [e for e in recording(name) if e["type"] != "BOOKMARK"]

    for path in paths:
        ours = [e for e in got[path] if e["type"] != "BOOKMARK"]
        theirs = recorded(path)
        assert _summary(ours) == _summary(theirs), path
        for mine, real in zip(ours, theirs, strict=True):
            assert shape(_no_hand_made(mine["object"])) == \
                shape(_no_hand_made(real["object"])), (path, real)
    _assert_rv_order(got)


def _no_hand_made(obj: dict[str, Any]) -> dict[str, Any]:
    """Drop what kubectl added in the recording and our scenario does not (annotations of
    kubectl apply, the labels kubectl set on the recorded CopyRule)."""
    meta = {k: v for k, v in obj["metadata"].items()
            if not (k in ("annotations", "labels") and obj["kind"] == "CopyRule")}
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items()
                   if k != "kubectl.kubernetes.io/last-applied-configuration"}
    if annotations:
        meta["annotations"] = annotations
    else:
        meta.pop("annotations", None)
    out = {**obj, "metadata": meta}
    if obj["kind"] == "ExchangeRate":
        out["spec"] = {k: v for k, v in obj["spec"].items() if k != "base"}
    return out


def _assert_rv_order(streams: dict[str, list[dict[str, Any]]]) -> None:
    for events in streams.values():
        rvs = [int(e["object"]["metadata"]["resourceVersion"]) for e in events]
        assert rvs == sorted(rvs)


def test_namespace_deletion_removes_content_before_the_namespace_like_the_recording(
        lk: LocalKube) -> None:
    watches = Watches(lk.url, ["/api/v1/namespaces", "/api/v1/configmaps"])
    http = Http(lk.url)
    http.call("POST", NS_PATH, {"metadata": {"name": "team-b"}})
    http.call("DELETE", f"{NS_PATH}/team-b")
    http.close()
    got = watches.join()

    def rv(events: list[dict[str, Any]], etype: str, name: str, n: int = 0) -> int:
        found = [int(e["object"]["metadata"]["resourceVersion"]) for e in events
                 if e["type"] == etype and e["object"]["metadata"]["name"] == name]
        return found[n]

    for ns_events, cm_events in (
            (got["/api/v1/namespaces"], got["/api/v1/configmaps"]),
            (recording("copy-rules/api_v1_namespaces.watch.jsonl"),
             recording("copy-rules/api_v1_configmaps.watch.jsonl"))):
        terminating = rv([e for e in ns_events if e["object"]["metadata"].get("name") == "team-b"],
                         "MODIFIED", "team-b")
        content_gone = rv([e for e in cm_events
                           if e["object"]["metadata"].get("namespace") == "team-b"],
                          "DELETED", "kube-root-ca.crt")
        finished = rv(ns_events, "MODIFIED", "team-b", 1)
        gone = rv(ns_events, "DELETED", "team-b")
        assert terminating < content_gone < finished < gone


def test_mirrors_and_rates_scenario_produces_the_recorded_watch_streams(lk: LocalKube) -> None:
    paths = ["/apis/eventop.dev/v1/registrymirrors", "/apis/eventop.dev/v1/exchangerates"]
    watches = Watches(lk.url, paths)
    http = Http(lk.url)
    mirrors = "/apis/eventop.dev/v1/namespaces/registry-mirrors/registrymirrors"
    rates = "/apis/eventop.dev/v1/namespaces/finance/exchangerates"
    mp = "application/merge-patch+json"
    for ns in ("registry-mirrors", "finance"):
        http.call("POST", NS_PATH, {"metadata": {"name": ns}})
    recorded_mirrors = recording(
        "mirrors-and-rates/apis_eventop.dev_v1_registrymirrors.watch.jsonl")
    for event in recorded_mirrors[:3]:
        obj = event["object"]
        http.call("POST", mirrors, {"apiVersion": obj["apiVersion"], "kind": obj["kind"],
                                    "metadata": {"name": obj["metadata"]["name"]},
                                    "spec": obj["spec"]})
    for currency in ("usd", "chf"):
        http.call("POST", rates, {"apiVersion": "eventop.dev/v1", "kind": "ExchangeRate",
                                  "metadata": {"name": f"exchange-rate-{currency}"},
                                  "spec": {"currency": currency.upper()}})
    http.call("PATCH", f"{mirrors}/docker-hub", {"spec": {"storage": {"size": "50Gi"}}},
              content_type=mp)
    http.call("PATCH", f"{mirrors}/docker-hub/status",
              {"status": recorded_mirrors[4]["object"]["status"]}, content_type=mp)
    http.call("PATCH", f"{rates}/exchange-rate-chf", {"spec": {"currency": "GBP"}},
              content_type=mp)
    assert http.call("PATCH", f"{rates}/exchange-rate-usd", {"spec": {"currency": "EUR"}},
                     content_type=mp)[0] == 422
    http.call("DELETE", f"{mirrors}/gcr")
    http.call("DELETE", f"{rates}/exchange-rate-chf")
    http.close()
    got = watches.join()
    for path in paths:
        name = "mirrors-and-rates/" + path.strip("/").replace("/", "_") + ".watch.jsonl"
        theirs = [e for e in recording(name) if e["type"] != "BOOKMARK"]
        ours = [e for e in got[path] if e["type"] != "BOOKMARK"]
        assert _summary(ours) == _summary(theirs), path
        for mine, real in zip(ours, theirs, strict=True):
            assert _no_hand_made(mine["object"])["spec"] == real["object"]["spec"]
            assert mine["object"].get("status") == real["object"].get("status")
            assert shape(_no_hand_made(mine["object"])) == shape(_no_hand_made(real["object"]))
            assert json.dumps(mine["object"]) == json.dumps(mine["object"], sort_keys=True)
    _assert_rv_order(got)


def test_field_ownership_evolves_like_the_recorded_managed_fields(lk: LocalKube,
                                                                  http: Http) -> None:
    recorded = [e["object"] for e in recording("copy-rules/api_v1_configmaps.watch.jsonl")
                if e["object"]["metadata"].get("name") == "registry-config"
                and e["object"]["metadata"].get("namespace") == "default"][:3]
    path = "/api/v1/namespaces/default/configmaps"
    ours = [http.call("POST", path, cm("registry-config",
                                       data={"mirror": "mirror.internal:5000"}),
                      params={"fieldManager": "kubectl-create"})[1]]
    ours.append(http.call("PATCH", f"{path}/registry-config",
                          {"metadata": {"labels": {"copyrator": "true"}}},
                          content_type="application/merge-patch+json",
                          params={"fieldManager": "kubectl-label"})[1])
    ours.append(http.call("PATCH", f"{path}/registry-config",
                          {"data": {"mirror": "mirror.internal:5001", "insecure": "false"}},
                          content_type="application/merge-patch+json",
                          params={"fieldManager": "kubectl-patch"})[1])

    def ownership(obj: dict[str, Any]) -> list[tuple[str, str, Any]]:
        return sorted(((m["manager"], m["operation"], m["fieldsV1"])
                       for m in obj["metadata"]["managedFields"]), key=lambda t: t[0])

    for mine, real in zip(ours, recorded, strict=True):
        assert ownership(mine) == ownership(real)


def test_custom_resource_ownership_and_status_subresource_entries_match_the_recording(
        lk: LocalKube, http: Http) -> None:
    recorded = [e["object"] for e in recording(
        "mirrors-and-rates/apis_eventop.dev_v1_registrymirrors.watch.jsonl")
        if e["object"]["metadata"].get("name") == "docker-hub"]
    first = recorded[0]
    http.call("POST", NS_PATH, {"metadata": {"name": "registry-mirrors"}})
    path = "/apis/eventop.dev/v1/namespaces/registry-mirrors/registrymirrors"
    mp = "application/merge-patch+json"
    ours = [http.call("POST", path, {
        "apiVersion": first["apiVersion"], "kind": first["kind"],
        "metadata": {"name": "docker-hub", "annotations": first["metadata"]["annotations"]},
        "spec": first["spec"]}, params={"fieldManager": "kubectl-client-side-apply"})[1]]
    ours.append(http.call("PATCH", f"{path}/docker-hub", {"spec": {"storage": {"size": "50Gi"}}},
                          content_type=mp, params={"fieldManager": "kubectl-patch"})[1])
    ours.append(http.call("PATCH", f"{path}/docker-hub/status",
                          {"status": recorded[2]["status"]}, content_type=mp,
                          params={"fieldManager": "kubectl-patch"})[1])

    def ownership(obj: dict[str, Any]) -> list[dict[str, Any]]:
        return [{k: v for k, v in m.items() if k != "time"}
                for m in obj["metadata"]["managedFields"]]

    for mine, real in zip(ours, recorded, strict=True):
        assert ownership(mine) == ownership(real)
        assert mine["metadata"]["generation"] == real["metadata"]["generation"]
