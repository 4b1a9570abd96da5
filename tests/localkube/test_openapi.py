"""/openapi/v3 and fieldValidation, compared with the recordings of v1.24 (the gate-on server
for the Strict/Warn answers, the default server for what it publishes for a CRD)."""

from __future__ import annotations

import json
from typing import Any

import requests

from eventop.localkube import LocalKube
from tests.localkube.support import RECORDINGS, cm, recording

ER = "/apis/eventop.dev/v1/namespaces/default/exchangerates"
TYPO = {"apiVersion": "eventop.dev/v1", "kind": "ExchangeRate", "metadata": {"name": "x"},
        "spec": {"currency": "USD", "curency": "GBP"}}


def post(lk: LocalKube, path: str, body: Any, **params: str) -> requests.Response:
    return requests.post(lk.url + path, data=json.dumps(body), params=params, timeout=10,
                         headers={"Content-Type": "application/json"})


def test_strict_refuses_unknown_fields_with_the_recorded_message(lk: LocalKube) -> None:
    real = recording("kubectl/validation/gate-on-exchangerate-strict.json")
    resp = post(lk, ER, TYPO, fieldValidation="Strict")
    assert (resp.status_code, resp.json()) == (real["code"], real["body"])
    real = recording("kubectl/validation/gate-on-configmap-strict.json")
    body = {**cm("x"), "metadata": {"name": "x", "bogus2": 1}, "bogus": 1}
    resp = post(lk, "/api/v1/namespaces/default/configmaps", body, fieldValidation="Strict")
    assert (resp.status_code, resp.json()) == (real["code"], real["body"])


def test_warn_accepts_with_the_recorded_warning_and_ignore_is_silent(lk: LocalKube) -> None:
    real = recording("kubectl/validation/gate-on-exchangerate-warn.json")
    resp = post(lk, ER, TYPO, fieldValidation="Warn")
    assert resp.status_code == real["code"] == 201
    assert resp.headers["Warning"] == real["warning"]
    assert "curency" not in resp.json()["spec"]  # pruned, as the recording shows
    resp = post(lk, ER, {**TYPO, "metadata": {"name": "y"}})
    assert resp.status_code == 201 and "Warning" not in resp.headers


def test_nested_lists_maps_and_preserved_fields_are_walked(lk: LocalKube) -> None:
    body = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
            "spec": {"selector": {"matchLabels": {"a": "b"}},
                     "template": {"metadata": {"labels": {"a": "b"}},
                                  "spec": {"containers": [{"name": "c", "image": "i",
                                                           "imagePolicy": "x"}]}}}}
    resp = post(lk, "/apis/apps/v1/namespaces/default/deployments", body,
                fieldValidation="Strict")
    assert resp.status_code == 400
    assert resp.json()["message"].endswith(
        'strict decoding error: unknown field "spec.template.spec.containers[0].imagePolicy"')


def test_a_bad_directive_is_a_400(lk: LocalKube) -> None:
    resp = post(lk, ER, TYPO, fieldValidation="Loud")
    assert resp.status_code == 400 and "Strict" in resp.json()["message"]


def test_openapi_v3_publishes_the_crd_schema_like_the_real_server(lk: LocalKube) -> None:
    index = requests.get(lk.url + "/openapi/v3", timeout=10).json()
    url = index["paths"]["apis/eventop.dev/v1"]["serverRelativeURL"]
    assert url.startswith("/openapi/v3/apis/eventop.dev/v1?hash=")
    doc = requests.get(lk.url + url, timeout=10).json()
    real = json.loads((RECORDINGS / "kubectl" / "openapi" / "eventop.dev-v1.json").read_text())
    for name in ("dev.eventop.v1.RegistryMirror", "dev.eventop.v1.ExchangeRate",
                 "dev.eventop.v1.CopyRule"):
        mine, theirs = doc["components"]["schemas"][name], real["components"]["schemas"][name]
        assert mine["properties"]["spec"] == theirs["properties"]["spec"]
        assert mine["properties"]["metadata"] == theirs["properties"]["metadata"]
        assert mine["x-kubernetes-group-version-kind"] == \
            theirs["x-kubernetes-group-version-kind"]
    patch = doc["paths"]["/apis/eventop.dev/v1/namespaces/{namespace}/registrymirrors/{name}"][
        "patch"]
    assert "fieldValidation" in [p["name"] for p in patch["parameters"]]
    assert requests.get(lk.url + "/openapi/v3/apis/nope/v1", timeout=10).status_code == 404
