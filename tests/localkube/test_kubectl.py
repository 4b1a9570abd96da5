"""kubectl's everyday commands against localkube, run with the real kubectl binary.

Skipped when kubectl is not installed. What each command prints is compared with what the
same kubectl prints against a real v1.24 server in ``tests/cluster`` (see
``test_kubectl_cluster.py``) and with the recorded responses behind it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from eventop.localkube import LocalKube
from tests.localkube.kubectl import Kubectl
from tests.support.apiserver import local_kube_server

MIRROR = """apiVersion: eventop.dev/v1
kind: RegistryMirror
metadata: {name: docker-hub, namespace: default}
spec: {upstream: "https://registry-1.docker.io"}
"""


@pytest.fixture
def server() -> Iterator[LocalKube]:
    with local_kube_server() as lk:
        yield lk


@pytest.fixture
def kubectl(server: LocalKube, tmp_path: Path) -> Kubectl:
    return Kubectl.for_url(server.url, tmp_path)


def lines(text: str) -> list[list[str]]:
    return [line.split() for line in text.strip().splitlines()]


def test_get_prints_the_servers_printer_columns(kubectl: Kubectl, server: LocalKube) -> None:
    server.put({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "settings", "namespace": "default"},
                "data": {"a": "1", "b": "2"}})
    out = lines(kubectl("get", "configmaps").stdout)
    assert out[0] == ["NAME", "DATA", "AGE"]
    assert out[2][:2] == ["settings", "2"]


def test_get_custom_resources_prints_the_crd_columns(kubectl: Kubectl,
                                                     server: LocalKube) -> None:
    server.put(yaml.safe_load(MIRROR))
    out = lines(kubectl("get", "registrymirrors").stdout)
    assert out[0] == ["NAME", "UPSTREAM", "ENDPOINT", "READY", "AGE"]
    assert out[1][:2] == ["docker-hub", "https://registry-1.docker.io"]


def test_get_by_category_lists_every_eventop_kind(kubectl: Kubectl,
                                                  server: LocalKube) -> None:
    server.put(yaml.safe_load(MIRROR))
    server.put({"apiVersion": "eventop.dev/v1", "kind": "ExchangeRate",
                "metadata": {"name": "usd", "namespace": "default"},
                "spec": {"currency": "USD"}})
    out = kubectl("get", "eventop").stdout
    assert "registrymirror.eventop.dev/docker-hub" in out
    assert "exchangerate.eventop.dev/usd" in out
    assert "CURRENCY" in out and "UPSTREAM" in out


def test_get_wide_adds_the_priority_columns(kubectl: Kubectl, server: LocalKube) -> None:
    server.put({"apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": "web", "namespace": "default"},
                "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}},
                         "template": {"metadata": {"labels": {"app": "web"}},
                                      "spec": {"containers": [{"name": "nginx",
                                                               "image": "nginx:1.25"}]}}}})
    out = lines(kubectl("get", "deploy", "-o", "wide").stdout)
    assert out[0] == ["NAME", "READY", "UP-TO-DATE", "AVAILABLE", "AGE", "CONTAINERS",
                      "IMAGES", "SELECTOR"]
    assert out[1][:2] == ["web", "0/2"] and out[1][-3:] == ["nginx", "nginx:1.25", "app=web"]


def test_get_short_names_and_all_namespaces(kubectl: Kubectl) -> None:
    out = lines(kubectl("get", "cm", "-A").stdout)
    assert out[0] == ["NAMESPACE", "NAME", "DATA", "AGE"]
    assert {row[0] for row in out[1:]} >= {"default", "kube-system"}


def test_create_namespace_configmap_and_secret(kubectl: Kubectl, server: LocalKube,
                                               tmp_path: Path) -> None:
    (tmp_path / "blob").write_bytes(b"\x00\xff")
    kubectl("create", "namespace", "team-a")
    kubectl("create", "configmap", "settings", "-n", "team-a", "--from-literal=a=1",
            f"--from-file=blob={tmp_path / 'blob'}")
    kubectl("create", "secret", "generic", "creds", "-n", "team-a", "--from-literal=token=s3")
    kubectl("create", "secret", "docker-registry", "pull", "-n", "team-a",
            "--docker-server=r.example", "--docker-username=u", "--docker-password=p")
    assert server.get("v1", "Namespace", "team-a")["status"] == {"phase": "Active"}
    cm = server.get("v1", "ConfigMap", "settings", "team-a")
    assert cm["data"] == {"a": "1"} and cm["binaryData"] == {"blob": "AP8="}
    assert cm["metadata"]["managedFields"][0]["manager"] == "kubectl-create"
    assert server.get("v1", "Secret", "creds", "team-a")["data"] == {"token": "czM="}
    assert server.get("v1", "Secret", "pull", "team-a")["type"] == \
        "kubernetes.io/dockerconfigjson"


def test_create_serviceaccount_service_and_deployment(kubectl: Kubectl,
                                                      server: LocalKube) -> None:
    kubectl("create", "serviceaccount", "robot")
    kubectl("create", "service", "clusterip", "web", "--tcp=80:8080")
    kubectl("create", "deployment", "web", "--image=nginx:1.25", "--replicas=0", "--port=80")
    assert server.get("v1", "ServiceAccount", "robot", "default") is not None
    ports = server.get("v1", "Service", "web", "default")["spec"]["ports"]
    assert ports == [{"name": "80-8080", "protocol": "TCP", "port": 80, "targetPort": 8080}]
    spec = server.get("apps/v1", "Deployment", "web", "default")["spec"]
    assert spec["replicas"] == 0
    assert spec["template"]["spec"]["containers"] == [
        {"name": "nginx", "image": "nginx:1.25", "ports": [{"containerPort": 80}],
         "resources": {}}]


def test_create_of_an_existing_name_is_the_real_already_exists(kubectl: Kubectl) -> None:
    kubectl("create", "namespace", "team-a")
    result = kubectl("create", "namespace", "team-a", check=False)
    assert result.returncode == 1
    assert result.stderr.strip() == \
        'Error from server (AlreadyExists): namespaces "team-a" already exists'


TYPO = """apiVersion: eventop.dev/v1
kind: ExchangeRate
metadata: {name: typo, namespace: default}
spec: {currency: USD, curency: GBP}
"""


def test_apply_validates_and_refuses_a_mistyped_field(kubectl: Kubectl,
                                                      server: LocalKube) -> None:
    kubectl("apply", "-f", "-", stdin=MIRROR)
    assert server.get("eventop.dev/v1", "RegistryMirror", "docker-hub", "default") is not None
    result = kubectl("apply", "-f", "-", stdin=TYPO, check=False)
    assert result.returncode == 1
    assert result.stderr.strip() == (
        'Error from server (BadRequest): error when creating "STDIN": ExchangeRate in version '
        '"v1" cannot be handled as a ExchangeRate: strict decoding error: unknown field '
        '"spec.curency"')
    assert server.get("eventop.dev/v1", "ExchangeRate", "typo", "default") is None


def test_server_side_apply_and_built_in_kinds_are_validated_too(kubectl: Kubectl) -> None:
    bad = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\ndata: {a: b}\ndatta: {}\n"
    for args in (["apply"], ["apply", "--server-side"], ["create"]):
        result = kubectl(*args, "-f", "-", stdin=bad, check=False)
        assert 'strict decoding error: unknown field "datta"' in result.stderr, args
    warned = kubectl("apply", "--validate=warn", "-f", "-", stdin=bad)
    assert 'Warning: unknown field "datta"' in warned.stderr


def test_explain_custom_and_built_in_kinds(kubectl: Kubectl) -> None:
    out = kubectl("explain", "exchangerates.spec").stdout
    assert "KIND:       ExchangeRate" in out and "currency\t<string> -required-" in out
    assert "The currency to quote." in out
    out = kubectl("explain", "mirror.spec.hostPort").stdout
    assert "Port every node serves the mirror on" in out
    out = kubectl("explain", "configmap.data").stdout
    assert "FIELD: data <map[string]string>" in out and "Data contains" in out
