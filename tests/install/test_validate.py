"""Every rendered object validates: built-in kinds against the Kubernetes OpenAPI schemas of
each supported version (strict: unknown fields are errors), Knative kinds against the real
Knative CRD schemas, so a typo anywhere in deploy/ or knative/ fails here, not at install time.
"""

from __future__ import annotations

import copy

import jsonschema
import kubernetes_validate
import pytest

from tests.install.support import (
    KUBERNETES_VERSIONS,
    find,
    ident,
    is_knative,
    knative_schemas,
    needs_kubectl,
    render,
)

pytestmark = needs_kubectl


def builtin_errors(objs: tuple[dict, ...], version: str) -> list[str]:
    errors = []
    for obj in objs:
        if is_knative(obj):
            continue
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            errors.append(f"{ident(obj)}: {exc.message} at {list(exc.path)}")
        except kubernetes_validate.SchemaNotFoundError:
            errors.append(f"{ident(obj)}: no schema for {obj['apiVersion']} in {version}")
    return errors


def knative_errors(obj: dict) -> list[str]:
    schema = knative_schemas().get((obj["apiVersion"], obj["kind"]))
    if schema is None:
        return [f"{ident(obj)}: no Knative schema for {obj['apiVersion']} {obj['kind']}"]
    validator = jsonschema.Draft7Validator(schema)
    return [f"{ident(obj)}: {e.message} at {list(e.path)}" for e in validator.iter_errors(obj)]


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("directory", ["crds", "deploy", "knative"])
def test_builtin_objects_validate_strictly(directory: str, version: str) -> None:
    assert builtin_errors(render(directory), version) == []


def test_strict_validation_rejects_an_unknown_field() -> None:
    """The check above can fail: a misspelt field in a Deployment is reported."""
    dep = copy.deepcopy(find(render("deploy"), "Deployment", "eventop-router"))
    dep["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
    assert builtin_errors((dep,), KUBERNETES_VERSIONS[-1])


def test_knative_resources_validate_against_the_knative_schemas() -> None:
    objs = [o for o in render("knative") if is_knative(o)]
    assert {o["kind"] for o in objs} >= {"Service", "Broker", "Trigger", "ApiServerSource",
                                        "PingSource"}
    assert [e for o in objs for e in knative_errors(o)] == []


@pytest.mark.parametrize("kind,name,path,value", [
    ("Trigger", "eventop-rates-refresh", ("spec", "subscriber", "ref", "nmae"), "x"),
    ("Broker", "eventop", ("spec", "delivery", "retry"), "five"),
    ("ApiServerSource", "eventop", ("spec", "resources"), "configmaps"),
    ("PingSource", "eventop-rates-refresh", ("spec", "schedul"), "0 * * * *"),
])
def test_knative_validation_rejects_mistakes(kind: str, name: str, path: tuple[str, ...],
                                             value: object) -> None:
    obj = copy.deepcopy(find(render("knative"), kind, name))
    node = obj
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    assert knative_errors(obj)


def test_knative_service_template_rejects_unknown_container_field() -> None:
    ksvc = copy.deepcopy(find(render("knative"), "Service", "eventop-router"))
    ksvc["spec"]["template"]["spec"]["containers"][0]["securityContex"] = {}
    assert knative_errors(ksvc)
