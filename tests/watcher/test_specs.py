"""What the watcher watches by default follows what the handlers listen to."""

from __future__ import annotations

from typing import Any

from eventop import handlers
from eventop.engine import Controller, Desired, Kind
from eventop.handlers.registry import Registry
from eventop.watcher.cli import main
from eventop.watcher.specs import default_resources

MANAGED = "app.kubernetes.io/managed-by=eventop"


def names(registry: Registry) -> list[str]:
    return [str(s) for s in default_resources(registry)]


def test_the_built_in_handlers_kinds_are_watched_by_default() -> None:
    derived = names(handlers.load("", builtin=None))
    assert {"eventop.dev/v1/copyrules", "eventop.dev/v1/exchangerates",
            "eventop.dev/v1/registrymirrors", "v1/namespaces", "v1/configmaps", "v1/secrets",
            f"apps/v1/daemonsets:{MANAGED}"} <= set(derived)
    for name in ("copy_rules", "exchange_rates", "mirrors", "databases"):
        registry = handlers.load("", builtin=name)
        kinds = {(k.api_version, k.kind) for k in registry.watched_kinds()}
        assert kinds, name
        for spec in default_resources(registry):
            assert str(spec) in derived or spec.label_selector, (name, str(spec))


def test_a_users_handler_adds_its_kinds_without_restating_the_defaults() -> None:
    registry = handlers.load("", builtin="copy_rules")
    team = Controller("teams", parent="example.com/v1/Team", owns=["apps/v1/Deployment"],
                      module="mine", registry=registry)
    team.reconcile(lambda parent, reads: Desired())
    mine = Registry()
    mine.on("dev.knative.apiserver.*", api_version="batch/v1", kind="Job", selector="a=b")(
        lambda event, kube: None)
    registry.include(mine)
    assert names(registry) == [
        "apps/v1/deployments", "batch/v1/jobs:a=b", "eventop.dev/v1/copyrules",
        "example.com/v1/Team", "v1/configmaps", "v1/namespaces", "v1/secrets"]


def test_a_selector_narrows_a_kind_only_if_every_handler_of_it_declares_it() -> None:
    registry = Registry()
    registry.on("x", api_version="v1", kind="Pod", selector="a=b")(lambda event, kube: None)
    assert names(registry) == ["v1/pods:a=b"]
    ctl = Controller("pods", parent="v1/Pod", module="mine", registry=registry)
    ctl.reconcile(lambda parent, reads: Desired())
    assert names(registry) == ["v1/pods"]  # the controller wants every Pod


def test_a_kind_only_read_is_cached_by_the_router_but_not_watched() -> None:
    registry = Registry()
    ctl = Controller("quiet", parent="example.com/v1/Team", module="mine",
                     reads=[Kind("v1/Namespace", metadata_only=True)], registry=registry)
    ctl.reconcile(lambda parent, reads: Desired())
    assert names(registry) == ["example.com/v1/Team"]
    assert {k.kind for k in ctl.kinds()} == {"Team", "Namespace"}


def test_watcher_resources_prints_the_default_set(capsys: Any, monkeypatch: Any) -> None:
    monkeypatch.setenv("EVENTOP_BUILTIN_HANDLERS", "copy_rules")
    monkeypatch.delenv("EVENTOP_HANDLERS", raising=False)
    assert main(["resources"]) == 0
    assert capsys.readouterr().out.split() == [
        "eventop.dev/v1/copyrules", "v1/configmaps", "v1/namespaces", "v1/secrets"]


def test_a_set_based_selector_in_the_environment_variable_stays_one_resource() -> None:
    from eventop.watcher.specs import parse_resources

    specs = parse_resources("v1/configmaps:app in (a, b),tier notin (x)\n"
                            "  apps/v1/statefulsets v1/secrets@team:app=web")
    assert [(str(s), s.label_selector) for s in specs] == [
        ("v1/configmaps:app in (a, b),tier notin (x)", "app in (a, b),tier notin (x)"),
        ("apps/v1/statefulsets", None),
        ("v1/secrets@team:app=web", "app=web")]
