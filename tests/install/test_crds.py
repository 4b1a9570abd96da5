"""The CRDs are valid CRDs with structural schemas, and every shipped example passes them."""

from __future__ import annotations

from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.install.support import (
    KUBERNETES_VERSIONS,
    REPO,
    crd_schemas,
    needs_kubectl,
    render,
    structural_errors,
)

pytestmark = needs_kubectl

EXAMPLES = sorted((REPO / "crds" / "examples").glob("*.yaml"))


def crds() -> list[dict]:
    return [o for o in render("crds") if o["kind"] == "CustomResourceDefinition"]


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_crd_validates_as_a_crd(version: str) -> None:
    assert len(crds()) == 4
    for crd in crds():
        kubernetes_validate.validate(crd, version, strict=True)


def test_crd_schemas_are_structural() -> None:
    problems = {crd["metadata"]["name"]: structural_errors(v["schema"]["openAPIV3Schema"])
                for crd in crds() for v in crd["spec"]["versions"]}
    assert problems == {name: [] for name in problems}


def test_structural_check_reports_untyped_fields_and_bad_defaults() -> None:
    schema = {"type": "object", "properties": {
        "spec": {"type": "object", "properties": {
            "size": {"description": "no type"},
            "base": {"type": "string", "pattern": "^[A-Z]{3}$", "default": "eur"},
        }}}}
    found = structural_errors(schema)
    assert any(".spec.size: no type" in p for p in found)
    assert any(".spec.base: default does not validate" in p for p in found)


def test_crds_follow_the_conventions_users_rely_on() -> None:
    """Status subresource, one storage version, short names, printer columns, `eventop`."""
    for crd in crds():
        spec = crd["spec"]
        name = crd["metadata"]["name"]
        assert spec["group"] == "eventop.dev", name
        assert name == f"{spec['names']['plural']}.{spec['group']}"
        assert "eventop" in spec["names"].get("categories", []), name
        assert spec["names"].get("shortNames"), name
        assert [v["name"] for v in spec["versions"] if v["storage"]] == ["v1"], name
        for version in spec["versions"]:
            assert version.get("subresources", {}).get("status") == {}, name
            assert version.get("additionalPrinterColumns"), name


def example_objects(path: Path) -> list[dict]:
    return [o for o in yaml.safe_load_all(path.read_text()) if o]


def test_every_crd_has_an_example() -> None:
    kinds = {o["kind"] for p in EXAMPLES for o in example_objects(p)
             if o["apiVersion"].startswith("eventop.dev/")}
    assert kinds == {crd["spec"]["names"]["kind"] for crd in crds()}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_validates_against_its_crd(path: Path) -> None:
    """Custom resources against their CRD; the built-in objects beside them (the namespace,
    a credentials Secret) strictly against the newest Kubernetes schema."""
    schemas = crd_schemas(crds())
    for obj in example_objects(path):
        if not obj["apiVersion"].startswith("eventop.dev/"):
            kubernetes_validate.validate(obj, KUBERNETES_VERSIONS[-1], strict=True)
            continue
        schema = schemas.get((obj["apiVersion"], obj["kind"]))
        assert schema is not None, f"{path.name}: no CRD serves {obj['apiVersion']} {obj['kind']}"
        errors = [f"{e.message} at {list(e.path)}"
                  for e in jsonschema.Draft7Validator(schema).iter_errors(obj)]
        assert errors == [], path.name


STORED = REPO / "tests" / "install" / "stored" / "accepted-before.yaml"


def test_what_an_earlier_crd_accepted_still_passes_the_crds() -> None:
    """A schema made stricter locks the objects stored before it: Kubernetes 1.24 checks the
    whole object on every write, so their status and finalizer could no longer be written
    (an upgrade trial: a CopyRule with ``names: []`` answered 422 to 307 status writes a
    minute, a Database under deletion stayed Terminating with its data already deleted)."""
    schemas = crd_schemas(crds())
    stored = [o for o in yaml.safe_load_all(STORED.read_text()) if o]
    assert {o["kind"] for o in stored} >= {"CopyRule", "Database"}
    for obj in stored:
        schema = schemas[(obj["apiVersion"], obj["kind"])]
        errors = [f"{e.message} at {list(e.path)}"
                  for e in jsonschema.Draft7Validator(schema).iter_errors(obj)]
        assert errors == [], obj["metadata"]["name"]


def test_example_check_rejects_a_value_outside_the_schema() -> None:
    schemas = crd_schemas(crds())
    bad = {"apiVersion": "eventop.dev/v1", "kind": "ExchangeRate",
           "metadata": {"name": "x"}, "spec": {"currency": "XYZ"}}
    assert list(jsonschema.Draft7Validator(schemas[("eventop.dev/v1", "ExchangeRate")])
                .iter_errors(bad))
