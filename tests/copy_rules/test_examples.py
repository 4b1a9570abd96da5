"""The shipped CopyRule examples are valid against the CRD schema; invalid specs are not."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import pytest

from eventop.handlers.copy_rules import desired
from tests.support.crds import docs_of, example_files, load_crd, storage_schema

EXAMPLES = example_files("copyrule")


def crd() -> dict[str, Any]:
    return load_crd("copyrules.yaml")


def crd_schema() -> dict[str, Any]:
    return storage_schema("copyrules.yaml")


def rules_in(path: Path) -> list[dict[str, Any]]:
    return docs_of("CopyRule", [path])


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_is_a_valid_cluster_scoped_copy_rule(path: Path) -> None:
    docs = rules_in(path)
    assert docs, f"{path.name} holds no CopyRule"
    for doc in docs:
        assert doc["apiVersion"] == "eventop.dev/v1"
        assert "namespace" not in doc["metadata"]  # CopyRule is cluster-scoped
        jsonschema.validate(doc, crd_schema())
        assert desired.rule_kind(doc) in ("ConfigMap", "Secret")


def test_the_original_copyrator_rule_ships_as_an_example() -> None:
    specs = [d["spec"] for p in EXAMPLES for d in rules_in(p)]
    assert {"ruleType": "configmap", "namespaces": ["default"],
            "selector": {"matchLabels": {"copyrator": "true"}}} in specs


def test_examples_cover_both_rule_types_and_target_narrowing() -> None:
    specs = [d["spec"] for p in EXAMPLES for d in rules_in(p)]
    assert {s["ruleType"] for s in specs} == {"configmap", "secret"}
    assert any("names" in s.get("targetNamespaces", {}) for s in specs)
    assert any("selector" in s.get("targetNamespaces", {}) for s in specs)


@pytest.mark.parametrize("spec", [
    {"ruleType": "pod", "namespaces": ["default"]},  # not in the enum
    {"ruleType": "configmap", "namespaces": []},  # at least one source namespace
    {"ruleType": "configmap"},  # namespaces required
    {"namespaces": ["default"]},  # ruleType required
    {"ruleType": "configmap", "namespaces": ["Default"]},  # not a namespace name
    {"ruleType": "configmap", "namespaces": ["default"],
     "selector": {"matchExpressions": [{"key": "a", "operator": "Equals"}]}},
    {"ruleType": "secret", "namespaces": ["default"], "targetNamespaces": {"names": ["a_b"]}},
])
def test_crd_schema_rejects_invalid_specs(spec: dict[str, Any]) -> None:
    doc = {"apiVersion": "eventop.dev/v1", "kind": "CopyRule", "metadata": {"name": "x"},
           "spec": spec}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, crd_schema())


def test_crd_is_cluster_scoped_with_short_name_status_and_printer_columns() -> None:
    spec = crd()["spec"]
    assert spec["scope"] == "Cluster" and spec["names"]["shortNames"] == ["copyr"]
    (version,) = spec["versions"]
    assert version["subresources"] == {"status": {}}
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert columns["Type"] == ".spec.ruleType"
    assert {"Sources", "Copies", "Conflicts", "Age"} <= set(columns)
    status = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    assert {"observedGeneration", "sources", "copies", "conflicts", "conflictList", "errors",
            "lastError", "conditions"} <= set(status)
