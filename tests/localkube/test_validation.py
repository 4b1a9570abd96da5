"""422s: custom resources against their schema, built-in kinds against the real rules."""

from __future__ import annotations

from typing import Any

import pytest

from eventop.kube import Kube, errors
from eventop.localkube.validation import MSG_QUALIFIED
from tests.localkube.support import Http, cm


def _mirror(spec: dict[str, Any], name: str = "m") -> dict[str, Any]:
    return {"apiVersion": "eventop.dev/v1", "kind": "RegistryMirror",
            "metadata": {"name": name, "namespace": "default"}, "spec": spec}


@pytest.mark.parametrize(("spec", "field", "reason", "message"), [
    ({}, "spec.upstream", "FieldValueRequired", "Required value"),
    ({"upstream": "ftp://x"}, "spec.upstream", "FieldValueInvalid",
     "Invalid value: \"ftp://x\": spec.upstream in body should match "
     "'^https?://[^\\s/$.?#].[^\\s]*$'"),
    ({"upstream": "https://x.io", "hostPort": 0}, "spec.hostPort", "FieldValueInvalid",
     "Invalid value: 0: spec.hostPort in body should be greater than or equal to 1"),
    ({"upstream": "https://x.io", "hostPort": 70000}, "spec.hostPort", "FieldValueInvalid",
     "Invalid value: 70000: spec.hostPort in body should be less than or equal to 65535"),
    ({"upstream": "https://x.io", "hostPort": "80"}, "spec.hostPort", "FieldValueInvalid",
     "Invalid value: \"string\": spec.hostPort in body must be of type integer: \"string\""),
])
def test_custom_resources_are_validated_against_their_schema(
        k: Kube, spec: dict[str, Any], field: str, reason: str, message: str) -> None:
    with pytest.raises(errors.Invalid) as caught:
        k.create(_mirror(spec))
    assert caught.value.causes == [{"reason": reason, "message": message, "field": field}]
    assert str(caught.value.message) == \
        f'RegistryMirror.eventop.dev "m" is invalid: {field}: {message}'


def test_several_errors_are_listed_together(k: Kube) -> None:
    rule = {"apiVersion": "eventop.dev/v1", "kind": "CopyRule", "metadata": {"name": "r"},
            "spec": {"ruleType": "pods", "namespaces": []}}
    with pytest.raises(errors.Invalid) as caught:
        k.create(rule)
    assert [c["field"] for c in caught.value.causes] == ["spec.namespaces", "spec.ruleType"]
    assert caught.value.message.startswith('CopyRule.eventop.dev "r" is invalid: [')
    assert "should have at least 1 items" in caught.value.message


@pytest.mark.parametrize("name", ["postgres", "pg_monitor"])
def test_a_value_a_not_schema_excludes_is_refused_as_the_real_server_words_it(
        k: Kube, name: str) -> None:
    """A ``not: {anyOf: [enum, pattern]}`` schema (eventop's CRDs once had one, for reserved
    database names), with the message the real v1.24 server gives (it names no field, and
    lists the failure after the others)."""
    k.create({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
              "metadata": {"name": "dbs.example.com"},
              "spec": {"group": "example.com", "scope": "Namespaced",
                       "names": {"kind": "Db", "plural": "dbs", "singular": "db"},
                       "versions": [{"name": "v1", "served": True, "storage": True,
                                     "schema": {"openAPIV3Schema": {
                                         "type": "object", "properties": {"spec": {
                                             "type": "object", "properties": {
                                                 "port": {"type": "integer", "minimum": 1024},
                                                 "databaseName": {
                                                     "type": "string",
                                                     "not": {"anyOf": [
                                                         {"enum": ["postgres", "template0"]},
                                                         {"pattern": "^pg_"}]}}}}}}}}]}})
    db = {"apiVersion": "example.com/v1", "kind": "Db",
          "metadata": {"name": "x", "namespace": "default"},
          "spec": {"databaseName": name, "port": 5}}
    with pytest.raises(errors.Invalid) as caught:
        k.create(db)
    assert caught.value.message == (
        'Db.example.com "x" is invalid: [spec.port: Invalid value: 5: spec.port in body '
        'should be greater than or equal to 1024, <nil>: Invalid value: "": '
        '"spec.databaseName" must not validate the schema (not)]')
    k.create({**db, "spec": {"databaseName": "orders", "port": 5432}})


def test_schema_defaults_are_filled_and_unknown_fields_pruned(k: Kube) -> None:
    obj = k.create(_mirror({"upstream": "https://quay.io", "storage": {}, "bogus": 1}))
    assert obj["spec"] == {"upstream": "https://quay.io", "hostPort": 5000,
                           "storage": {"size": "10Gi"}}


def test_updates_are_validated_too(k: Kube) -> None:
    k.create({"apiVersion": "eventop.dev/v1", "kind": "ExchangeRate",
              "metadata": {"name": "usd", "namespace": "default"}, "spec": {"currency": "USD"}})
    with pytest.raises(errors.Invalid, match='Unsupported value: "EUR"'):
        k.patch("eventop.dev/v1", "ExchangeRate", "usd", "default", {"spec": {"currency": "EUR"}})
    assert k.get("eventop.dev/v1", "ExchangeRate", "usd", "default")["spec"]["currency"] == "USD"


@pytest.mark.parametrize(("kind", "name", "fragment"), [
    ("ConfigMap", "Bad_Name", "a lowercase RFC 1123 subdomain must consist of"),
    ("Service", "1svc", "a DNS-1035 label must consist of"),
    ("Namespace", "a.b", "a lowercase RFC 1123 label must consist of"),
])
def test_names_follow_the_rules_of_their_kind(k: Kube, kind: str, name: str,
                                              fragment: str) -> None:
    meta: dict[str, Any] = {"name": name}
    if kind != "Namespace":
        meta["namespace"] = "default"
    with pytest.raises(errors.Invalid) as caught:
        k.create({"apiVersion": "v1", "kind": kind, "metadata": meta})
    assert caught.value.causes[0]["field"] == "metadata.name"
    assert fragment in caught.value.causes[0]["message"]


def test_label_values_are_validated(k: Kube) -> None:
    with pytest.raises(errors.Invalid, match="must be no more than 63 characters"):
        k.create(cm("x", labels={"a": "v" * 64}))


@pytest.mark.parametrize(("key", "messages"), [
    ("Example.com/app", ["prefix part a lowercase RFC 1123 subdomain must consist of"]),
    ("/app", ["prefix part must be non-empty"]),
    ("example.com/", ["name part must be non-empty", "name part must consist of"]),
    ("a/b/c", ["a qualified name must consist of"]),
    ("k" * 64, ["name part must be no more than 63 characters"]),
])
def test_label_keys_are_qualified_names_with_an_optional_dns_prefix(
        k: Kube, key: str, messages: list[str]) -> None:
    """Like apimachinery's IsQualifiedName: one cause per broken rule, naming the key."""
    with pytest.raises(errors.Invalid) as caught:
        k.create(cm("x", labels={key: "v"}))
    got = [c["message"] for c in caught.value.causes]
    assert len(got) == len(messages)
    for message, fragment in zip(got, messages, strict=True):
        assert message.startswith(f'Invalid value: "{key}": {fragment}')
    assert {c["field"] for c in caught.value.causes} == {"metadata.labels"}


def test_label_keys_with_a_dns_prefix_are_accepted(k: Kube) -> None:
    created = k.create(cm("x", labels={"app.kubernetes.io/name": "v", "eventop.dev/rule": "r"}))
    assert created["metadata"]["labels"]["eventop.dev/rule"] == "r"


def test_annotation_keys_are_qualified_names_and_their_total_size_is_bounded(k: Kube) -> None:
    bad = cm("x")
    bad["metadata"]["annotations"] = {"Example.COM/Note": "ok", "a b": "v"}  # keys lower-cased
    with pytest.raises(errors.Invalid) as caught:
        k.create(bad)
    assert [c["message"] for c in caught.value.causes] == [
        f'Invalid value: "a b": name part {MSG_QUALIFIED}']
    big = cm("y")
    big["metadata"]["annotations"] = {"note": "v" * 256 * 1024}
    with pytest.raises(errors.Invalid, match="Too long: must have at most 262144 bytes"):
        k.create(big)


def _owner(**ref: Any) -> dict[str, Any]:
    return {"apiVersion": "eventop.dev/v1", "kind": "CopyRule", "name": "r", "uid": "u1", **ref}


@pytest.mark.parametrize(("refs", "field", "message"), [
    ([_owner(uid=None)], "metadata.ownerReferences.uid",
     'Invalid value: "": uid must not be empty'),
    ([_owner(apiVersion="eventop.dev/")], "metadata.ownerReferences.apiVersion",
     'Invalid value: "eventop.dev/": version must not be empty'),
    ([_owner(kind="")], "metadata.ownerReferences.kind",
     'Invalid value: "": kind must not be empty'),
    ([_owner(controller=True), _owner(name="s", uid="u2", controller=True)],
     "metadata.ownerReferences", 'Found "true" in references for CopyRule/r and CopyRule/s'),
    ([_owner(apiVersion="v1", kind="Event")], "metadata.ownerReferences",
     "/v1, Kind=Event is disallowed from being an owner"),
])
def test_owner_references_are_validated_like_object_meta(
        k: Kube, refs: list[dict[str, Any]], field: str, message: str) -> None:
    """A reference built from a Reference-mode event (no uid) is refused, as on a cluster."""
    obj = cm("x")
    obj["metadata"]["ownerReferences"] = [{k: v for k, v in r.items() if v is not None}
                                          for r in refs]
    with pytest.raises(errors.Invalid) as caught:
        k.create(obj)
    [found] = caught.value.causes
    assert found["field"] == field and message in found["message"]


def test_owner_references_of_custom_resources_are_validated_too(k: Kube) -> None:
    with pytest.raises(errors.Invalid, match="uid must not be empty"):
        k.create({"apiVersion": "eventop.dev/v1", "kind": "ExchangeRate",
                  "metadata": {"name": "usd", "namespace": "default",
                               "ownerReferences": [_owner(uid="")]},
                  "spec": {"currency": "USD"}})


def _event(namespace: str, involved_namespace: str | None) -> dict[str, Any]:
    involved: dict[str, Any] = {"apiVersion": "eventop.dev/v1", "kind": "CopyRule", "name": "r"}
    if involved_namespace is not None:
        involved["namespace"] = involved_namespace
    return {"apiVersion": "v1", "kind": "Event",
            "metadata": {"name": "r.1", "namespace": namespace},
            "involvedObject": involved, "type": "Normal", "reason": "Synced", "message": "ok"}


@pytest.mark.parametrize(("namespace", "involved_namespace", "accepted"), [
    ("default", None, True),          # a cluster-scoped object: its Events live in default
    ("kube-system", None, False),
    ("kube-public", "kube-public", True),
    ("default", "kube-public", False),
])
def test_an_event_lives_in_the_namespace_of_its_involved_object(
        k: Kube, namespace: str, involved_namespace: str | None, accepted: bool) -> None:
    """kube-apiserver's legacyValidateEvent; eventop's Kube.post_event relies on it."""
    event = _event(namespace, involved_namespace)
    if accepted:
        assert k.create(event)["involvedObject"] == event["involvedObject"]
        return
    with pytest.raises(errors.Invalid) as caught:
        k.create(event)
    assert caught.value.message == (
        'Event "r.1" is invalid: involvedObject.namespace: Invalid value: '
        f'"{involved_namespace or ""}": does not match event.namespace')


def test_an_event_update_keeps_the_namespace_rule(k: Kube) -> None:
    k.create(_event("kube-public", "kube-public"))
    with pytest.raises(errors.Invalid, match=r"does not match event\.namespace"):
        k.patch("v1", "Event", "r.1", "kube-public", {"involvedObject": {"namespace": "default"}})


def test_immutable_configmaps_refuse_data_changes(k: Kube) -> None:
    frozen = cm("x")
    frozen["immutable"] = True
    k.create(frozen)
    with pytest.raises(errors.Invalid) as caught:
        k.patch("v1", "ConfigMap", "x", "default", {"data": {"k": "changed"}})
    assert caught.value.message == \
        'ConfigMap "x" is invalid: data: Forbidden: field is immutable when `immutable` is set'


def test_secret_data_must_be_base64_and_string_data_is_encoded(k: Kube, http: Http) -> None:
    status, body = http.call("POST", "/api/v1/namespaces/default/secrets",
                             {"metadata": {"name": "s"}, "data": {"a": "not base64!"}})
    assert status == 400 and "illegal base64 data" in body["message"]
    secret = k.create({"apiVersion": "v1", "kind": "Secret",
                       "metadata": {"name": "s", "namespace": "default"},
                       "stringData": {"user": "admin"}})
    assert secret["data"] == {"user": "YWRtaW4="} and secret["type"] == "Opaque"
    assert "stringData" not in secret


def test_services_get_a_cluster_ip_that_cannot_change(k: Kube) -> None:
    svc = k.create({"apiVersion": "v1", "kind": "Service",
                    "metadata": {"name": "web", "namespace": "default"},
                    "spec": {"ports": [{"port": 80}]}})
    ip = svc["spec"]["clusterIP"]
    assert ip.startswith("10.96.") and svc["spec"]["clusterIPs"] == [ip]
    assert svc["spec"]["ports"] == [{"port": 80, "protocol": "TCP", "targetPort": 80}]
    headless = k.create({"apiVersion": "v1", "kind": "Service",
                         "metadata": {"name": "headless", "namespace": "default"},
                         "spec": {"clusterIP": "None"}})
    assert headless["spec"]["clusterIP"] == "None"
    with pytest.raises(errors.Invalid, match=r"spec\.clusterIP: Invalid value"):
        k.patch("v1", "Service", "web", "default", {"spec": {"clusterIP": "10.96.9.9"}})
    kept = k.apply({"apiVersion": "v1", "kind": "Service",
                    "metadata": {"name": "web", "namespace": "default"},
                    "spec": {"ports": [{"port": 81}]}})
    assert kept["spec"]["clusterIP"] == ip


def _sts(replicas: int = 1, service: str = "db") -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": {"name": "db", "namespace": "default"},
            "spec": {"replicas": replicas, "serviceName": service,
                     "selector": {"matchLabels": {"app": "db"}},
                     "template": {"metadata": {"labels": {"app": "db"}},
                                  "spec": {"containers": [{"name": "c", "image": "x"}]}}}}


def test_statefulset_spec_is_immutable_except_the_allowed_fields(k: Kube) -> None:
    created = k.apply(_sts())
    assert created["metadata"]["generation"] == 1
    assert k.apply(_sts(replicas=3))["metadata"]["generation"] == 2
    with pytest.raises(errors.Invalid) as caught:
        k.apply(_sts(replicas=3, service="other"))
    assert caught.value.message == (
        'StatefulSet.apps "db" is invalid: spec: Forbidden: updates to statefulset spec for '
        "fields other than 'replicas', 'template', 'updateStrategy', "
        "'persistentVolumeClaimRetentionPolicy' and 'minReadySeconds' are forbidden")


@pytest.mark.parametrize("kind", ["Deployment", "DaemonSet"])
def test_workload_selectors_must_match_their_template(k: Kube, kind: str) -> None:
    obj = _sts()
    obj["kind"] = kind
    obj["spec"].pop("serviceName")
    obj["spec"]["template"]["metadata"]["labels"] = {"app": "other"}
    with pytest.raises(errors.Invalid, match="`selector` does not match template `labels`"):
        k.create(obj)


def test_workload_pod_template_and_selector_labels_are_validated(k: Kube) -> None:
    """A label value over 63 characters (a long object name copied into a label, say) is
    refused in the pod template and the selector too, not only in metadata."""
    long = "m" * 64
    obj = _sts()
    obj["spec"]["selector"]["matchLabels"]["instance"] = long
    obj["spec"]["template"]["metadata"]["labels"]["instance"] = long
    with pytest.raises(errors.Invalid) as caught:
        k.create(obj)
    assert [(c["field"], c["message"]) for c in caught.value.causes] == [
        (field, f'Invalid value: "{long}": must be no more than 63 characters')
        for field in ("spec.selector.matchLabels", "spec.template.metadata.labels")]


def test_nulls_of_non_nullable_fields_are_pruned_before_defaulting(k: Kube) -> None:
    obj = k.create(_mirror({"upstream": "https://quay.io", "hostPort": None}))
    assert obj["spec"]["hostPort"] == 5000


def test_date_time_fields_must_be_rfc3339(k: Kube) -> None:
    rate = k.create({"apiVersion": "eventop.dev/v1", "kind": "ExchangeRate",
                     "metadata": {"name": "usd", "namespace": "default"},
                     "spec": {"currency": "USD"}})
    ok = k.patch_status(rate, {"lastSuccessfulFetch": "2026-11-21T07:42:44Z"})
    assert ok["status"]["lastSuccessfulFetch"] == "2026-11-21T07:42:44Z"
    with pytest.raises(errors.Invalid) as caught:
        k.patch_status(rate, {"lastSuccessfulFetch": "yesterday"})
    assert caught.value.causes == [{
        "reason": "FieldValueInvalid", "field": "status.lastSuccessfulFetch",
        "message": 'Invalid value: "yesterday": status.lastSuccessfulFetch in body must be of '
                   'type date-time: "yesterday"'}]
