"""Server-side apply: create-or-update, idempotence, field ownership and conflicts."""

from __future__ import annotations

from typing import Any

import pytest

from eventop.kube import Kube, errors
from eventop.localkube import LocalKube
from tests.localkube.support import Http, cm

APPLY = "application/apply-patch+yaml"
PATH = "/api/v1/namespaces/default/configmaps/x"


def _apply(http: Http, body: dict[str, Any], manager: str = "eventop",
           force: bool = False) -> tuple[int, Any]:
    params = {"fieldManager": manager, **({"force": "true"} if force else {})}
    return http.call("PATCH", PATH, body, content_type=APPLY, params=params)


def test_apply_creates_then_updates(http: Http) -> None:
    assert _apply(http, cm("x", data={"a": "1"}))[0] == 201
    status, body = _apply(http, cm("x", data={"a": "2"}))
    assert status == 200 and body["data"] == {"a": "2"}


def test_reapplying_the_same_configuration_changes_nothing(lk: LocalKube, http: Http) -> None:
    first = _apply(http, cm("x", data={"a": "1"}, labels={"l": "1"}))[1]
    rv = lk.resource_version
    second = _apply(http, cm("x", data={"a": "1"}, labels={"l": "1"}))[1]
    assert second == first
    assert lk.resource_version == rv
    events = http.watch("/api/v1/namespaces/default/configmaps",
                        resourceVersion=first["metadata"]["resourceVersion"], timeoutSeconds=0.3)
    assert events == []


def test_fields_no_longer_applied_by_the_manager_are_removed(http: Http) -> None:
    _apply(http, cm("x", data={"a": "1", "b": "2"}, labels={"keep": "1", "drop": "1"}))
    body = _apply(http, cm("x", data={"a": "1"}, labels={"keep": "1"}))[1]
    assert body["data"] == {"a": "1"}
    assert body["metadata"]["labels"] == {"keep": "1"}
    body = _apply(http, {"apiVersion": "v1", "kind": "ConfigMap",
                         "metadata": {"name": "x", "namespace": "default"}, "data": {"a": "1"}})[1]
    assert "labels" not in body["metadata"]


def test_fields_another_manager_also_set_are_kept(http: Http) -> None:
    _apply(http, cm("x", data={"a": "1", "b": "2"}))
    http.call("PATCH", PATH, {"data": {"b": "3"}}, content_type="application/merge-patch+json",
              params={"fieldManager": "kubectl-edit"})
    body = _apply(http, cm("x", data={"a": "1"}))[1]
    assert body["data"] == {"a": "1", "b": "3"}


def test_changing_fields_of_another_manager_conflicts_until_forced(http: Http) -> None:
    http.call("POST", "/api/v1/namespaces/default/configmaps", cm("x", data={"a": "1", "b": "1"}),
              params={"fieldManager": "curl"})
    status, body = _apply(http, cm("x", data={"a": "2", "b": "2"}))
    assert status == 409 and body["reason"] == "Conflict"
    assert body["message"] == ('Apply failed with 2 conflicts: conflicts with "curl" using v1:\n'
                               "- .data.a\n- .data.b")
    assert [c["field"] for c in body["details"]["causes"]] == [".data.a", ".data.b"]
    status, body = _apply(http, cm("x", data={"a": "2", "b": "2"}), force=True)
    assert status == 200 and body["data"] == {"a": "2", "b": "2"}
    # Equal values are shared, never a conflict.
    assert _apply(http, cm("x", data={"a": "2"}), manager="other")[0] == 200


def test_apply_needs_a_field_manager(http: Http) -> None:
    status, body = http.call("PATCH", PATH, cm("x"), content_type=APPLY)
    assert status == 400 and "fieldManager" in body["message"]


def test_apply_with_a_stale_resource_version_conflicts(http: Http) -> None:
    created = _apply(http, cm("x", data={"a": "1"}))[1]
    _apply(http, cm("x", data={"a": "2"}))
    stale = cm("x", data={"a": "3"})
    stale["metadata"]["resourceVersion"] = created["metadata"]["resourceVersion"]
    status, body = _apply(http, stale)
    assert status == 409 and "the object has been modified" in body["message"]


def test_lists_are_atomic_and_replaced_whole(k: Kube) -> None:
    rule = {"apiVersion": "eventop.dev/v1", "kind": "CopyRule", "metadata": {"name": "r"},
            "spec": {"ruleType": "configmap", "namespaces": ["a", "b"]}}
    k.apply(rule)
    rule["spec"]["namespaces"] = ["c"]
    assert k.apply(rule)["spec"]["namespaces"] == ["c"]


def test_apply_to_the_status_subresource_sets_only_status(k: Kube) -> None:
    rate = {"apiVersion": "eventop.dev/v1", "kind": "ExchangeRate",
            "metadata": {"name": "usd", "namespace": "default"}, "spec": {"currency": "USD"}}
    k.apply(rate)
    out = k.apply({**rate, "spec": {"currency": "CHF"}, "status": {"rate": "1.1"}},
                  subresource="status")
    assert out["status"] == {"rate": "1.1"} and out["spec"]["currency"] == "USD"
    assert out["metadata"]["generation"] == 1
    managers = {(m["manager"], m.get("subresource", "")) for m in out["metadata"]["managedFields"]}
    assert ("eventop", "status") in managers


def test_apply_through_the_client_is_idempotent_for_custom_resources(k: Kube) -> None:
    mirror = {"apiVersion": "eventop.dev/v1", "kind": "RegistryMirror",
              "metadata": {"name": "hub", "namespace": "default"},
              "spec": {"upstream": "https://registry-1.docker.io"}}
    first = k.apply(mirror)
    assert first["spec"]["hostPort"] == 5000  # schema default
    second = k.apply(mirror)
    assert second["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]


def test_apply_conflict_raises_the_kube_conflict_error(k: Kube) -> None:
    k.create(cm("x", data={"a": "1"}))
    unforced = Kube(k.api, field_manager="someone-else")
    with pytest.raises(errors.Conflict) as caught:
        unforced.apply(cm("x", data={"a": "2"}), force=False)
    assert caught.value.causes[0]["reason"] == "FieldManagerConflict"
