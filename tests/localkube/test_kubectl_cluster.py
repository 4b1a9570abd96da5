"""The same kubectl commands against the real cluster (``EVENTOP_TEST_KUBECONFIG``) and
against localkube: what kubectl prints or stores must agree."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.localkube.kubectl import Kubectl, kubectl_binary
from tests.support.apiserver import local_kube_server

pytestmark = pytest.mark.cluster


@pytest.fixture
def both(tmp_path: Path) -> Iterator[tuple[Kubectl, Kubectl]]:
    real = Kubectl(kubectl_binary(), Path(os.environ["EVENTOP_TEST_KUBECONFIG"]),
                   tmp_path / "real-cache")
    (tmp_path / "local").mkdir()
    with local_kube_server() as lk:
        yield real, Kubectl.for_url(lk.url, tmp_path / "local")


def _created(kubectl: Kubectl, *args: str) -> dict:
    out = kubectl("create", *args, "--dry-run=server", "-o", "json").stdout
    obj = json.loads(out)
    obj["metadata"] = {k: v for k, v in obj["metadata"].items()
                       if k in ("name", "namespace", "labels", "annotations")}
    return obj


@pytest.mark.parametrize("args", [
    ["namespace", "kubectl-cmp"],
    ["configmap", "cmp", "--from-literal=a=1", "--from-literal=b=2"],
    ["secret", "generic", "cmp", "--from-literal=token=s3"],
    ["secret", "docker-registry", "cmp-pull", "--docker-server=r.example",
     "--docker-username=u", "--docker-password=p"],
    ["serviceaccount", "cmp"],
])
def test_typed_create_stores_the_same_object(both: tuple[Kubectl, Kubectl],
                                             args: list[str]) -> None:
    real, local = both
    assert _created(local, *args) == _created(real, *args)


def test_get_prints_the_same_columns(both: tuple[Kubectl, Kubectl]) -> None:
    real, local = both
    for kind in ("namespaces", "configmaps", "registrymirrors", "copyrules"):
        headers = [k(*["get", kind, "-A"]).stdout.splitlines()[0].split()
                   for k in (real, local) if k(*["get", kind, "-A"]).stdout]
        if len(headers) == 2:
            assert headers[0] == headers[1], kind


def test_a_mistyped_field_is_refused_by_both(both: tuple[Kubectl, Kubectl]) -> None:
    typo = ("apiVersion: eventop.dev/v1\nkind: ExchangeRate\nmetadata: {name: typo, "
            "namespace: default}\nspec: {currency: USD, curency: GBP}\n")
    for kubectl in both:
        result = kubectl("apply", "--dry-run=server", "-f", "-", stdin=typo, check=False)
        assert result.returncode == 1 and "curency" in result.stderr


def test_explain_agrees_on_custom_resources(both: tuple[Kubectl, Kubectl]) -> None:
    real, local = both
    assert local("explain", "exchangerates.spec").stdout == \
        real("explain", "exchangerates.spec").stdout


def test_categories_list_the_same_kinds(both: tuple[Kubectl, Kubectl]) -> None:
    real, local = both
    for category in ("eventop", "all", "api-extensions"):
        listed = [sorted(k("api-resources", f"--categories={category}", "-o", "name")
                         .stdout.split()) for k in (real, local)]
        # localkube serves fewer built-in kinds: what it lists, the real server lists too.
        assert listed[1] and set(listed[1]) <= set(listed[0]), category
        if category == "eventop":
            assert listed[1] == listed[0]
