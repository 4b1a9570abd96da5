"""The shipped RegistryMirror examples are valid against the CRD schema and build valid objects."""

from __future__ import annotations

from typing import Any

import jsonschema
import kubernetes_validate
import pytest

from eventop.handlers.mirrors import build
from tests.support.crds import docs_of, example_files, load_crd, storage_schema

EXAMPLES = example_files("registrymirror")


def crd_schema() -> dict[str, Any]:
    return storage_schema("registrymirrors.yaml")


def test_examples_cover_docker_hub_gcr_quay_and_an_internal_registry_with_credentials() -> None:
    mirrors = {m["spec"]["upstream"]: m for m in docs_of("RegistryMirror", EXAMPLES)}
    assert {"https://registry-1.docker.io", "https://gcr.io", "https://quay.io"} <= set(mirrors)
    with_creds = [m for m in mirrors.values() if m["spec"].get("credentialsSecretRef")]
    assert with_creds
    secrets = {s["metadata"]["name"]: s for s in docs_of("Secret", EXAMPLES)}
    for m in with_creds:
        secret = secrets[m["spec"]["credentialsSecretRef"]["name"]]
        assert secret["metadata"]["namespace"] == m["metadata"]["namespace"]
        assert {"username", "password"} <= set(secret.get("stringData") or secret.get("data"))


def test_examples_use_distinct_host_ports() -> None:
    ports = [m["spec"].get("hostPort", 5000) for m in docs_of("RegistryMirror", EXAMPLES)]
    assert len(ports) == len(set(ports))


@pytest.mark.parametrize("mirror", docs_of("RegistryMirror", EXAMPLES),
                         ids=lambda m: m["metadata"]["name"])
def test_example_is_valid_against_the_crd_schema_and_builds_valid_objects(
        mirror: dict[str, Any]) -> None:
    jsonschema.validate(mirror, crd_schema())
    owned = {**mirror, "metadata": {**mirror["metadata"], "uid": "u-1"}}
    for obj in build.desired_objects(owned):
        kubernetes_validate.validate(obj, "1.28", strict=True)


@pytest.mark.parametrize("doc", docs_of("Secret", EXAMPLES) + docs_of("Namespace", EXAMPLES),
                         ids=lambda d: d["kind"])
def test_other_example_objects_pass_the_kubernetes_schema(doc: dict[str, Any]) -> None:
    kubernetes_validate.validate(doc, "1.28", strict=True)


@pytest.mark.parametrize("spec", [
    {"hostPort": 5000},  # upstream is required
    {"upstream": "quay.io"},
    {"upstream": "https://quay.io", "hostPort": 70000},
    {"upstream": "https://quay.io", "storage": {"size": "big"}},
    {"upstream": "https://quay.io", "ttl": "7d"},
    {"upstream": "https://quay.io", "credentialsSecretRef": {}},
    {"upstream": "https://quay.io", "credentialsSecretRef": {"name": ""}},
    {"upstream": "https://quay.io", "image": {"registry": ""}},
])
def test_crd_schema_rejects_invalid_specs(spec: dict[str, Any]) -> None:
    doc = {"apiVersion": "eventop.dev/v1", "kind": "RegistryMirror",
           "metadata": {"name": "x", "namespace": "m"}, "spec": spec}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, crd_schema())


def test_crd_prints_upstream_endpoint_and_readiness() -> None:
    crd = load_crd("registrymirrors.yaml")
    columns = {c["name"]: c["jsonPath"]
               for c in crd["spec"]["versions"][0]["additionalPrinterColumns"]}
    assert columns["Upstream"] == ".spec.upstream"
    assert columns["Endpoint"] == ".status.endpoint"
    assert "Ready" in columns["Ready"]
    assert crd["spec"]["names"]["shortNames"] == ["mirror"]
