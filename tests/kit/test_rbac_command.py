"""``python -m eventop.router rbac``: the ClusterRoles a handler author applies, printed from
what the loaded handlers declare (engine/rbac.py), as a user runs it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

from eventop import handlers
from eventop.engine import rbac
from tests.kit.test_example import granted

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "static-site"


def run_rbac(*args: str, handlers_path: str | None = "static_site.py",
             cwd: Path = EXAMPLE) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("EVENTOP_", "KUBECONFIG"))}
    env["KUBECONFIG"] = str(cwd / "no-such-kubeconfig")  # no cluster to ask
    if handlers_path:
        env.update(EVENTOP_HANDLERS=handlers_path, EVENTOP_BUILTIN_HANDLERS="none")
    return subprocess.run([sys.executable, "-m", "eventop.router", "rbac", *args], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=120)


def documents(text: str) -> dict[tuple[str, str], dict]:
    return {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(text) if d}


EVENTS = {("", "events", verb) for verb in ("get", "create", "patch")}


def test_the_printed_roles_of_the_example_are_the_ones_its_author_wrote_by_hand() -> None:
    """examples/static-site/rbac.yaml (its router role checked against the engine's requests
    in test_example.py) leaves Events to eventop's own role; the printed one grants them."""
    proc = run_rbac("--crds", "crds", "--name", "static-sites")
    assert proc.returncode == 0, proc.stderr
    printed = documents(proc.stdout)
    router_role, _, watcher_role, _ = yaml.safe_load_all((EXAMPLE / "rbac.yaml").read_text())
    assert granted(printed[("ClusterRole", "static-sites-router")]["rules"]) == \
        granted(router_role["rules"]) | EVENTS
    assert granted(printed[("ClusterRole", "static-sites-watcher")]["rules"]) == \
        granted(watcher_role["rules"])
    binding = printed[("ClusterRoleBinding", "static-sites-watcher")]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "eventop-watcher",
                                    "namespace": "eventop-system"}]
    assert binding["roleRef"]["name"] == "static-sites-watcher"


def test_a_kind_whose_plural_is_unknown_is_one_line_naming_it_and_the_fix() -> None:
    proc = run_rbac()  # no --crds, no cluster
    assert proc.returncode == 2 and proc.stdout == ""
    [line] = proc.stderr.splitlines()
    assert line.startswith("python -m eventop.router rbac: error: cannot tell the plural of "
                           "example.com/v1/StaticSite: pass its CustomResourceDefinition "
                           "with --crds"), line


def test_knative_mode_prints_the_sources_role_and_a_trigger_for_each_new_kind_only() -> None:
    proc = run_rbac("--crds", "crds", "--mode", "knative", "--name", "static-sites")
    assert proc.returncode == 0, proc.stderr
    printed = documents(proc.stdout)
    source = printed[("ClusterRole", "static-sites-apiserversource")]
    assert {verb for _, _, verb in granted(source["rules"])} == {"get", "list", "watch"}
    triggers = {d["spec"]["filter"]["attributes"]["kind"]
                for (kind, _), d in printed.items() if kind == "Trigger"}
    assert triggers == {"StaticSite", "Deployment"}  # ConfigMaps, Services: knative/ has them
    assert "value: {apiVersion: example.com/v1, kind: StaticSite}" in proc.stdout


def test_the_printed_role_covers_the_built_in_handlers_but_what_their_code_writes_itself() -> None:
    """deploy/'s role is derived from the built-in handlers' real requests (test_rbac.py).
    What the printed role lacks is exactly what no declaration says: copies written with
    Child(mode="replace") (update), a Database's PersistentVolumes patched by its own code,
    and parents read by the handlers' own calls (get)."""
    role = rbac.router_role(handlers.load(""), rbac.plurals_from([]))
    printed = {(g, r, v) for (g, r), verbs in role.rules.items() for v in verbs}
    [deployed] = [d for d in yaml.safe_load_all(
        (REPO / "deploy" / "common" / "router-rbac.yaml").read_text())
        if d and d["kind"] == "ClusterRole"]
    assert granted(deployed["rules"]) - printed == {
        ("", "configmaps", "update"), ("", "secrets", "update"),
        ("", "persistentvolumes", "patch"),
        ("eventop.dev", "databases", "get"), ("eventop.dev", "exchangerates", "get")}


def test_what_it_prints_validates_against_the_kubernetes_and_knative_schemas() -> None:
    from tests.install.support import KUBERNETES_VERSIONS, is_knative
    from tests.install.test_validate import builtin_errors, knative_errors

    proc = run_rbac("--crds", "crds", "--mode", "knative", "--name", "static-sites")
    assert proc.returncode == 0, proc.stderr
    objs = tuple(documents(proc.stdout).values())
    assert {o["kind"] for o in objs} == {"ClusterRole", "ClusterRoleBinding", "Trigger"}
    assert builtin_errors(objs, KUBERNETES_VERSIONS[0]) == []
    assert [e for o in objs if is_knative(o) for e in knative_errors(o)] == []
