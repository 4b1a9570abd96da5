"""The kit's Pipeline: the router running a project's handlers, events posted by the test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from eventop.testing import LocalCluster, Pipeline, eventually

HANDLER = '''
from eventop import on

@on("dev.knative.apiserver.resource.*", api_version="v1", kind="ConfigMap")
def seen(event, kube):
    return f"saw {event.ref.namespace}/{event.ref.name}"
'''
CM = {"apiVersion": "v1", "kind": "ConfigMap",
      "metadata": {"name": "settings", "namespace": "default"}, "data": {"a": "b"}}


@pytest.fixture
def cluster() -> Iterator[LocalCluster]:
    cluster = LocalCluster()
    try:
        yield cluster
    finally:
        cluster.close()


def test_a_handler_file_is_run_and_its_result_logged(cluster: LocalCluster,
                                                     tmp_path: Path) -> None:
    (tmp_path / "seen.py").write_text(HANDLER)
    with Pipeline(cluster, str(tmp_path / "seen.py"), cwd=tmp_path) as router:
        assert router.post("add", cluster.put(CM)) == 200
        [line] = router.events_logged()
    assert line["results"] == [{"handler": "seen.seen", "outcome": "ok",
                                "detail": "saw default/settings"}]


def test_a_router_token_is_sent_with_every_event(cluster: LocalCluster, tmp_path: Path) -> None:
    (tmp_path / "seen.py").write_text(HANDLER)
    env = {"EVENTOP_ROUTER_TOKEN": "s3cret"}
    with Pipeline(cluster, str(tmp_path / "seen.py"), env=env, cwd=tmp_path) as router:
        assert router.post("add", cluster.put(CM)) == 200
        router._auth = {}  # as a sender without the token
        assert router.post("update", cluster.put(CM)) == 401


def test_a_watcher_that_exits_at_start_fails_the_pipeline_with_its_reason(
        cluster: LocalCluster, tmp_path: Path) -> None:
    # Before, the watcher's exit went unnoticed and the test failed 30 s later on a copy
    # that never came, its reason only in a log file.
    (tmp_path / "seen.py").write_text(HANDLER)
    with pytest.raises(RuntimeError, match=r"exited with 2 at start.*nosuchthings"):
        Pipeline(cluster, str(tmp_path / "seen.py"), watcher=True,
                 resources="v1/nosuchthings", cwd=tmp_path)


def test_a_handler_owning_quotas_and_role_bindings_runs_on_the_local_api_server(
        cluster: LocalCluster, tmp_path: Path) -> None:
    """The kinds a tenant operator writes are served by the local API server, and the
    watcher watches them as the handlers derive them (by kind where the plural is not known)."""
    (tmp_path / "tenants.py").write_text(TENANTS)
    cluster.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team"}})
    with Pipeline(cluster, str(tmp_path / "tenants.py"), watcher=True, cwd=tmp_path):
        cluster.put({**CM, "metadata": {"name": "tenant", "namespace": "team"},
                     "data": {"cpu": "2"}})
        quota = eventually(lambda: cluster.get("v1", "ResourceQuota", "quota", "team"),
                           what="the quota")
        assert quota["spec"]["hard"] == {"cpu": "2"}
        cluster.put({**CM, "metadata": {"name": "tenant", "namespace": "team"},
                     "data": {"cpu": "3"}})  # a change of what the engine created
        eventually(lambda: (cluster.get("v1", "ResourceQuota", "quota", "team") or {})
                   .get("spec", {}).get("hard") == {"cpu": "3"}, what="the quota updated")
        binding = eventually(lambda: cluster.get("rbac.authorization.k8s.io/v1", "RoleBinding",
                                                 "admins", "team"), what="the binding")
        assert binding["subjects"][0]["name"] == "alice"


TENANTS = '''
from eventop.engine import Controller, Desired
from eventop.handlers import Registry

registry = Registry()
tenants = Controller("tenants", parent="v1/ConfigMap",
                     owns=["v1/ResourceQuota", "rbac.authorization.k8s.io/v1/RoleBinding"],
                     registry=registry)


@tenants.reconcile
def want(cm, reads):
    if cm["metadata"]["name"] != "tenant":
        return Desired([])
    ns = cm["metadata"]["namespace"]
    quota = {"apiVersion": "v1", "kind": "ResourceQuota",
             "metadata": {"name": "quota", "namespace": ns},
             "spec": {"hard": {"cpu": cm["data"]["cpu"]}}}
    binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
               "metadata": {"name": "admins", "namespace": ns},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                           "name": "admin"},
               "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                             "name": "alice"}]}
    return Desired([quota, binding])
'''


def test_what_a_test_put_into_a_real_cluster_goes_with_it_and_nothing_else(
        cluster: LocalCluster, tmp_path: Path) -> None:
    """A kit run against a real cluster left the test's parents (and what they owned)
    behind, to collide with the next run. The local API server stands in for the real one
    here, reached through a kubeconfig as a real one is."""
    from eventop.testing import RealCluster

    theirs = cluster.put({**CM, "metadata": {"name": "theirs", "namespace": "default"}})
    real = RealCluster(str(cluster.kubeconfig(tmp_path / "kubeconfig")))
    real.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "kit-made"}})
    real.put({**CM, "metadata": {"name": "mine", "namespace": "kit-made"}})
    real.put({**theirs, "data": {"changed": "by the test"}})  # existed before: kept
    real.put({**CM, "metadata": {"name": "removed", "namespace": "default"}})
    real.remove("v1", "ConfigMap", "removed", "default")
    assert real.delete_made(10) == []
    assert cluster.get("v1", "Namespace", "kit-made") is None
    assert cluster.get("v1", "ConfigMap", "theirs", "default") is not None
    held = {**CM, "metadata": {"name": "held", "namespace": "default",
                               "finalizers": ["example.com/hold"]}}
    real.put(held)
    assert real.delete_made(0.5) == ["ConfigMap default/held"]
