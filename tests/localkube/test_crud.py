"""Reads and writes through the official client: versions, generation, status, selectors."""

from __future__ import annotations

import pytest

from eventop.kube import Kube, errors
from eventop.localkube import LocalKube
from tests.localkube.support import Http, cm


def test_create_assigns_uid_timestamp_and_increasing_resource_versions(k: Kube) -> None:
    a = k.create(cm("a"))
    b = k.create(cm("b"))
    assert a["metadata"]["uid"] != b["metadata"]["uid"]
    assert int(b["metadata"]["resourceVersion"]) == int(a["metadata"]["resourceVersion"]) + 1
    assert a["metadata"]["creationTimestamp"].endswith("Z")
    assert "generation" not in a["metadata"]  # like the real server for ConfigMaps


def test_generation_counts_spec_changes_of_custom_resources_only(k: Kube) -> None:
    rate = k.create({"apiVersion": "eventop.dev/v1", "kind": "ExchangeRate",
                     "metadata": {"name": "usd", "namespace": "default"},
                     "spec": {"currency": "USD"}})
    assert rate["metadata"]["generation"] == 1
    labelled = k.patch("eventop.dev/v1", "ExchangeRate", "usd", "default",
                       {"metadata": {"labels": {"x": "y"}}})
    assert labelled["metadata"]["generation"] == 1
    changed = k.patch("eventop.dev/v1", "ExchangeRate", "usd", "default",
                      {"spec": {"currency": "CHF"}})
    assert changed["metadata"]["generation"] == 2
    status = k.patch_status(changed, {"rate": "0.93"})
    assert status["metadata"]["generation"] == 2
    assert status["status"] == {"rate": "0.93"}


def test_writes_to_the_main_resource_ignore_status_and_status_writes_ignore_the_rest(
        k: Kube) -> None:
    k.create({"apiVersion": "eventop.dev/v1", "kind": "ExchangeRate",
              "metadata": {"name": "usd", "namespace": "default"}, "spec": {"currency": "USD"},
              "status": {"rate": "dropped on create"}})
    obj = k.get("eventop.dev/v1", "ExchangeRate", "usd", "default")
    assert "status" not in obj
    obj["status"] = {"rate": "1"}
    replaced = k.replace(obj)
    assert "status" not in replaced
    after = k.patch("eventop.dev/v1", "ExchangeRate", "usd", "default",
                    {"spec": {"currency": "GBP"}, "status": {"rate": "2"}}, subresource="status")
    assert after["spec"]["currency"] == "USD" and after["status"] == {"rate": "2"}


def test_replace_with_a_stale_resource_version_is_the_real_conflict(k: Kube) -> None:
    old = k.create(cm("x"))
    k.patch("v1", "ConfigMap", "x", "default", {"data": {"k": "new"}})
    with pytest.raises(errors.Conflict) as caught:
        k.replace(old)
    assert caught.value.message == (
        'Operation cannot be fulfilled on configmaps "x": the object has been modified; '
        "please apply your changes to the latest version and try again")


def test_a_write_that_changes_nothing_keeps_the_resource_version(k: Kube) -> None:
    obj = k.create(cm("x"))
    again = k.replace(obj)
    patched = k.patch("v1", "ConfigMap", "x", "default", {"data": {"k": "v"}})
    assert obj["metadata"]["resourceVersion"] == again["metadata"]["resourceVersion"] == \
        patched["metadata"]["resourceVersion"]


def test_json_patch_and_strategic_merge_patch_are_accepted(http: Http) -> None:
    http.call("POST", "/api/v1/namespaces/default/configmaps", cm("x", data={"a": "1"}))
    path = "/api/v1/namespaces/default/configmaps/x"
    status, body = http.call("PATCH", path, [{"op": "add", "path": "/data/b", "value": "2"},
                                             {"op": "remove", "path": "/data/a"}],
                             content_type="application/json-patch+json")
    assert status == 200 and body["data"] == {"b": "2"}
    status, body = http.call("PATCH", path, {"data": {"c": "3"}},
                             content_type="application/strategic-merge-patch+json")
    assert status == 200 and body["data"] == {"b": "2", "c": "3"}
    status, body = http.call("PATCH", path, {"data": {}}, content_type="text/plain")
    assert status == 415


def test_delete_with_a_wrong_uid_precondition_is_refused(k: Kube, http: Http) -> None:
    obj = k.create(cm("x"))
    status, body = http.call("DELETE", "/api/v1/namespaces/default/configmaps/x",
                             {"preconditions": {"uid": "not-it"}})
    assert status == 409
    assert body["message"] == (
        'Operation cannot be fulfilled on configmaps "x": Precondition failed: UID in '
        f'precondition: not-it, UID in object meta: {obj["metadata"]["uid"]}')
    assert k.delete("v1", "ConfigMap", "x", "default", uid=obj["metadata"]["uid"]) is True
    assert k.delete("v1", "ConfigMap", "x", "default") is False


def test_delete_answers_a_success_status_naming_the_object(k: Kube, http: Http) -> None:
    obj = k.create(cm("x"))
    status, body = http.call("DELETE", "/api/v1/namespaces/default/configmaps/x")
    assert status == 200
    assert body == {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                    "details": {"name": "x", "kind": "configmaps",
                                "uid": obj["metadata"]["uid"]}}


def test_finalizers_hold_an_object_until_they_are_removed(k: Kube) -> None:
    held = cm("x")
    held["metadata"]["finalizers"] = ["example.com/hold"]
    k.create(held)
    assert k.delete("v1", "ConfigMap", "x", "default") is True
    pending = k.get("v1", "ConfigMap", "x", "default")
    assert pending["metadata"]["deletionTimestamp"]
    k.patch("v1", "ConfigMap", "x", "default", {"metadata": {"finalizers": None}})
    assert k.get_or_none("v1", "ConfigMap", "x", "default") is None


@pytest.mark.parametrize(("selector", "expected"), [
    ("tier=web", ["a", "c"]),
    ("tier==web", ["a", "c"]),
    ("tier!=web", ["b", "d", "kube-root-ca.crt"]),
    ("tier in (web,db)", ["a", "b", "c"]),
    ("tier notin (web)", ["b", "d", "kube-root-ca.crt"]),
    ("tier", ["a", "b", "c"]),
    ("!tier", ["d", "kube-root-ca.crt"]),
    ("tier=web,env=prod", ["c"]),
    ("tier in (web),!env", ["a"]),
])
def test_label_selectors_select_like_the_real_server(k: Kube, selector: str,
                                                     expected: list[str]) -> None:
    for name, labels in (("a", {"tier": "web"}), ("b", {"tier": "db"}),
                         ("c", {"tier": "web", "env": "prod"}), ("d", {"env": "dev"})):
        k.create(cm(name, labels=labels))
    got = k.list("v1", "ConfigMap", "default", label_selector=selector)
    assert [o["metadata"]["name"] for o in got] == expected


def test_field_selectors_on_name_and_namespace(k: Kube, http: Http) -> None:
    k.create(cm("a"))
    k.create(cm("b"))
    assert [o["metadata"]["name"] for o in
            k.list("v1", "ConfigMap", field_selector="metadata.name=a")] == ["a"]
    got = k.list("v1", "ConfigMap", field_selector="metadata.namespace=kube-system")
    assert [o["metadata"]["name"] for o in got] == ["kube-root-ca.crt"]
    status, body = http.call("GET", "/api/v1/configmaps", params={"fieldSelector": "data.k=v"})
    assert status == 400 and "data.k" in body["message"]


def test_lists_paginate_with_limit_and_continue(k: Kube, http: Http) -> None:
    for i in range(7):
        k.create(cm(f"cm-{i}"))
    status, page = http.call("GET", "/api/v1/namespaces/default/configmaps",
                             params={"limit": "3"})
    assert status == 200 and len(page["items"]) == 3
    assert page["metadata"]["remainingItemCount"] == 5
    names = [o["metadata"]["name"] for o in page["items"]]
    while page["metadata"].get("continue"):
        page = http.call("GET", "/api/v1/namespaces/default/configmaps",
                         params={"limit": "3", "continue": page["metadata"]["continue"]})[1]
        names += [o["metadata"]["name"] for o in page["items"]]
    assert names == sorted([f"cm-{i}" for i in range(7)] + ["kube-root-ca.crt"])
    pages = list(k.pages(k.resource("v1", "ConfigMap"), "default", limit=2))
    items, rv = [i for p in pages for i in p["items"]], pages[-1]["metadata"]["resourceVersion"]
    assert len(pages) == 4
    assert len(items) == 8 and int(rv) > 0


def test_create_in_a_missing_namespace_is_404(k: Kube) -> None:
    with pytest.raises(errors.NotFound, match='namespaces "nowhere" not found'):
        k.create(cm("x", "nowhere"))


def test_discovery_lists_resources_and_their_status_subresources(http: Http) -> None:
    core = http.call("GET", "/api/v1")[1]
    names = {r["name"]: r for r in core["resources"]}
    assert names["configmaps"]["kind"] == "ConfigMap" and names["configmaps"]["namespaced"]
    assert "namespaces/status" in names and "configmaps/status" not in names
    assert "watch" in names["configmaps"]["verbs"]
    custom = http.call("GET", "/apis/eventop.dev/v1")[1]
    assert {r["name"] for r in custom["resources"]} == {
        "copyrules", "copyrules/status", "databases", "databases/status", "exchangerates",
        "exchangerates/status", "registrymirrors", "registrymirrors/status"}
    groups = {g["name"] for g in http.call("GET", "/apis")[1]["groups"]}
    assert {"apps", "coordination.k8s.io", "apiextensions.k8s.io", "eventop.dev"} <= groups
    assert http.call("GET", "/api")[1]["versions"] == ["v1"]
    assert http.call("GET", "/version")[1]["minor"] == "24"


def test_health_endpoints_answer_ok(k: Kube, http: Http) -> None:
    k.ping()
    for path in ("/healthz", "/readyz", "/livez"):
        assert http.session.get(http.url + path, timeout=5).text == "ok"


def test_unknown_paths_and_kinds_are_404(http: Http, k: Kube) -> None:
    assert http.call("GET", "/apis/nope.dev/v1/things")[0] == 404
    assert http.call("GET", "/api/v1/namespaces/default/configmaps/x/status")[0] == 404
    with pytest.raises(errors.NotFound):
        k.get("nope.dev/v1", "Thing", "x")


def test_the_request_log_records_method_path_query_and_status(lk: LocalKube, k: Kube) -> None:
    lk.requests.clear()
    k.get_or_none("v1", "ConfigMap", "nope", "default")
    k.list("v1", "ConfigMap", "default")
    k.list("v1", "ConfigMap", "default", label_selector="a=b")  # one page: see Kube.pages
    assert lk.requests == [
        ("GET", "/api/v1/namespaces/default/configmaps/nope", "", 404),
        ("GET", "/api/v1/namespaces/default/configmaps", "limit=500", 200),
        ("GET", "/api/v1/namespaces/default/configmaps", "labelSelector=a%3Db", 200)]


def test_dry_run_answers_without_storing(lk: LocalKube, http: Http) -> None:
    rv = lk.resource_version
    status, body = http.call("POST", "/api/v1/namespaces/default/configmaps", cm("x"),
                             params={"dryRun": "All"})
    assert status == 201 and body["metadata"]["name"] == "x"
    assert lk.get("v1", "ConfigMap", "x", "default") is None
    assert lk.resource_version == rv


def test_generate_name_makes_a_unique_name(k: Kube) -> None:
    made = k.create({"apiVersion": "v1", "kind": "ConfigMap",
                     "metadata": {"generateName": "job-", "namespace": "default"}})
    assert made["metadata"]["name"].startswith("job-") and len(made["metadata"]["name"]) == 9


def test_delete_collection_by_label(k: Kube, http: Http) -> None:
    k.create(cm("a", labels={"batch": "1"}))
    k.create(cm("b", labels={"batch": "1"}))
    k.create(cm("c"))
    status, _ = http.call("DELETE", "/api/v1/namespaces/default/configmaps",
                          params={"labelSelector": "batch=1"})
    assert status == 200
    assert sorted(o["metadata"]["name"] for o in k.list("v1", "ConfigMap", "default")) == [
        "c", "kube-root-ca.crt"]


def test_post_event_creates_then_counts_repeats(k: Kube) -> None:
    involved = k.create(cm("x"))
    k.post_event(involved, "Normal", "Copied", "copied somewhere")
    k.post_event(involved, "Normal", "Copied", "copied somewhere")
    [event] = k.list("v1", "Event", "default")
    assert event["count"] == 2 and event["involvedObject"]["uid"] == involved["metadata"]["uid"]


def test_bodies_over_3_mib_are_refused_and_bad_json_is_400(http: Http) -> None:
    big = cm("big", data={"k": "x" * (3 * 1024 * 1024)})
    assert http.call("POST", "/api/v1/namespaces/default/configmaps", big)[0] == 413
    resp = http.session.post(http.url + "/api/v1/namespaces/default/configmaps",
                             data=b"{not json", headers={"Content-Type": "application/json"},
                             timeout=5)
    assert resp.status_code == 400 and resp.json()["reason"] == "BadRequest"


def test_configmap_data_over_1_mib_is_invalid(k: Kube) -> None:
    with pytest.raises(errors.Invalid, match="Too long: must have at most 1048576 bytes"):
        k.create(cm("big", data={"k": "x" * (1024 * 1024 + 1)}))
