"""The router's cache on the real API server: it stays current across an API server restart
(its watches break and resume, or re-list), with no change lost. Needs the state directory of
``../shared/k8s/cluster`` (``EVENTOP_TEST_CLUSTER_DIR``) to restart the API server."""

from __future__ import annotations

import os
import subprocess
import threading
import uuid
from pathlib import Path

import pytest

from eventop.kube import Kube
from eventop.kube.informer import Cache, InformerSpec
from eventop.kube.reflector import Backoff, WatchSettings
from eventop.testing.waiting import wait_until
from tests.support.cluster import cluster_script, uncontrollable_reason

pytestmark = pytest.mark.cluster
REPO = Path(__file__).resolve().parents[2]


def test_cache_after_an_api_server_restart_holds_every_change() -> None:
    kubeconfig = os.environ.get("EVENTOP_TEST_KUBECONFIG")
    state = os.environ.get("EVENTOP_TEST_CLUSTER_DIR")
    script = cluster_script()
    if not kubeconfig:
        pytest.skip("cluster suite: set EVENTOP_TEST_KUBECONFIG to run it")
    if not (state and script.exists()):
        pytest.skip(uncontrollable_reason(state, script))
    kube = Kube.connect(kubeconfig=kubeconfig)
    ns = f"cache-{uuid.uuid4().hex[:6]}"
    kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})

    def cm(name: str, value: str) -> dict:
        return {"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": name, "namespace": ns}, "data": {"v": value}}

    cache = Cache(kube, [InformerSpec("v1", "ConfigMap")],
                  settings=WatchSettings(resync_seconds=0, backoff=Backoff(0.2, 2.0))).start()
    try:
        assert cache.wait_synced(30)
        store = cache.informers[("v1", "ConfigMap")].store
        assert store is not None
        kube.create(cm("before", "1"))
        kube.create(cm("changed", "1"))
        assert wait_until(lambda: store.get(ns, "changed") is not None, 20)

        restarted = threading.Event()

        def restart() -> None:
            subprocess.run([str(script), "restart-apiserver", state, "5"], check=True,
                           capture_output=True, timeout=180)
            restarted.set()

        threading.Thread(target=restart, daemon=True).start()
        assert wait_until(restarted.is_set, 180), "the API server did not come back"
        assert wait_until(lambda: _answers(kube), 60)
        kube.delete("v1", "ConfigMap", "before", ns)
        kube.replace({**kube.get("v1", "ConfigMap", "changed", ns), "data": {"v": "2"}})
        kube.create(cm("after", "1"))

        def current() -> bool:
            changed = store.get(ns, "changed")
            return (store.get(ns, "before") is None and store.get(ns, "after") is not None
                    and changed is not None and changed["data"] == {"v": "2"})

        assert wait_until(current, 60), sorted(o["metadata"]["name"] for o in store.list(ns))
        listed = {o["metadata"]["name"]: o["metadata"]["resourceVersion"]
                  for o in kube.list("v1", "ConfigMap", ns)}
        cached = {o["metadata"]["name"]: o["metadata"]["resourceVersion"] for o in store.list(ns)}
        assert cached == listed
    finally:
        cache.stop()
        kube.delete("v1", "Namespace", ns)


def _answers(kube: Kube) -> bool:
    try:
        kube.ping()
        return True
    except Exception:
        return False


def test_a_reference_mode_event_of_a_quiet_kind_is_answered_on_a_real_api_server() -> None:
    """A Reference-mode event names an object, not a version. The cache must reach the
    object's own resourceVersion: the API server's newest one (other kinds changed since)
    reaches the watch of a quiet kind only with a bookmark, and the event was a 503. An
    event ahead of the API server's newest version is run on the object as it is now."""
    from eventop.engine import Controller, Desired
    from eventop.engine.runtime import Engine
    from eventop.engine.settings import EngineSettings
    from eventop.handlers.events import Event
    from eventop.handlers.registry import Registry
    from eventop.testing.cluster import RealCluster

    kubeconfig = os.environ.get("EVENTOP_TEST_KUBECONFIG")
    if not kubeconfig:
        pytest.skip("cluster suite: set EVENTOP_TEST_KUBECONFIG to run it")
    cluster = RealCluster(kubeconfig, [REPO / "crds" / "copyrules.yaml"])
    kube = Kube.connect(kubeconfig=kubeconfig)
    ctl = Controller("ref-mode", parent="eventop.dev/v1/CopyRule", registry=Registry(),
                     module="tests.engine")
    runs: list[str] = []
    ctl.reconcile(lambda rule, reads: runs.append(rule["metadata"]["name"]) or Desired())
    name = f"ref-{uuid.uuid4().hex[:6]}"
    rule = cluster.put({"apiVersion": "eventop.dev/v1", "kind": "CopyRule",
                        "metadata": {"name": name},
                        "spec": {"ruleType": "configmap", "namespaces": ["default"],
                                 "selector": {"matchLabels": {"never": name}}}})
    engine = Engine([ctl], kube, settings=EngineSettings(workers=1, cache_wait=5.0,
                                                          run_on_watch=False))
    engine.start()
    ns = f"ref-{uuid.uuid4().hex[:6]}"
    try:
        assert wait_until(lambda: engine.readiness()[0], 60), engine.readiness()
        assert engine.started.wait(60) and wait_until(engine.queue.idle, 60)
        # Other kinds change: the API server's newest resourceVersion moves past the rule's
        kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        for i in range(3):
            kube.create({"apiVersion": "v1", "kind": "ConfigMap",
                         "metadata": {"name": f"c{i}", "namespace": ns}})
        runs.clear()
        ticket, _notes = engine.submit(Event(
            id=f"{name}-ref", type="dev.knative.apiserver.ref.add", source="test",
            data={"apiVersion": "eventop.dev/v1", "kind": "CopyRule", "name": name}))
        assert ticket.wait(30)
        assert runs == [name]
        # An event claiming a version the API server has not reached (forged, or another
        # cluster's): answered on the rule as it is now (unchanged since its last run: no
        # run), not a 503 sent again forever.
        runs.clear()
        current = kube.get("eventop.dev/v1", "CopyRule", name)
        ahead = {**current, "metadata": {**current["metadata"], "resourceVersion": str(
            int(current["metadata"]["resourceVersion"]) + 10**6)}}
        ticket, notes = engine.submit(Event.for_object("update", ahead))
        assert ticket.wait(30)
        assert runs == [] and notes == {"ref-mode": "only status or resourceVersion changed"}
    finally:
        engine.stop()
        kube.delete("v1", "Namespace", ns)
        kube.delete("eventop.dev/v1", "CopyRule", rule["metadata"]["name"])


def test_a_childs_port_and_env_changed_by_apply_leave_nothing_behind_on_the_real_server(
        ) -> None:
    """What a POST wrote belongs to an Update entry, which an apply never removes from: on
    the real server a changed port stayed beside the new one (refused as two ports named
    http) and a dropped variable stayed. The first apply hands it over first. Written the
    way the engine writes children (``prepare``, then ``execute``): a create straight
    through the writer once hid that the engine's own POST body marked the child as applied
    already, and the hand-over never happened."""
    from eventop.engine.apiserver import Echoes, KubeWriter
    from eventop.engine.desired import Child
    from eventop.engine.plan import Action, Plan, prepare
    from eventop.engine.write import execute

    kube = Kube.connect(kubeconfig=os.environ["EVENTOP_TEST_KUBECONFIG"])
    kube.field_manager = "eventop-test-apply"
    ns = f"apply-{uuid.uuid4().hex[:6]}"
    kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    writer = KubeWriter(kube, Cache(kube, []), Echoes())
    parent = kube.create({"apiVersion": "v1", "kind": "ConfigMap",
                          "metadata": {"name": "owner", "namespace": ns}})

    def write(obj: dict, existing: dict | None) -> dict:
        child = Child(obj, force=True)
        verb = "create" if existing is None else "apply"
        done = execute(Plan([Action(verb, obj["kind"], ns, obj["metadata"]["name"],
                                    prepare(child, parent), existing, child)]),
                       writer, parent)
        assert not done.errors, done.errors
        return (done.created or done.updated)[0]

    def service(port: int) -> dict:
        return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": ns},
                "spec": {"selector": {"app": "web"},
                         "ports": [{"name": "http", "port": port, "targetPort": "http"}]}}

    def deployment(port: int, env: dict[str, str]) -> dict:
        labels = {"app": "web"}
        container = {"name": "web", "image": "nginx", "ports": [{"name": "http",
                                                                  "containerPort": port}],
                     "env": [{"name": k, "value": v} for k, v in env.items()]}
        return {"apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": "web", "namespace": ns},
                "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                         "template": {"metadata": {"labels": labels},
                                      "spec": {"containers": [container]}}}}

    try:
        created = write(service(8080), None)
        ports = write(service(9090), created)["spec"]["ports"]
        assert [p["port"] for p in ports] == [9090]
        created = write(deployment(8080, {"A": "1", "B": "2"}), None)
        applied = write(deployment(9090, {"A": "1"}), created)
        container = applied["spec"]["template"]["spec"]["containers"][0]
        assert [p["containerPort"] for p in container["ports"]] == [9090]
        assert container["env"] == [{"name": "A", "value": "1"}]
        assert "eventop.dev/created-not-applied" not in applied["metadata"]["annotations"]
    finally:
        kube.delete("v1", "Namespace", ns)


@pytest.mark.parametrize("case", ["finalizer_on_a_parent_deleted_meanwhile",
                                  "recreate_of_a_child_held_by_a_finalizer"])
def test_writes_around_an_object_being_deleted_behave_as_on_the_local_server(case: str) -> None:
    """The real API server refuses a new finalizer on an object being deleted, and keeps a
    deleted object with a finalizer under its name: the engine's answers to both
    (``test_apiserver.py``), on the real thing."""
    from tests.engine import test_apiserver

    kubeconfig = os.environ.get("EVENTOP_TEST_KUBECONFIG")
    if not kubeconfig:
        pytest.skip("cluster suite: set EVENTOP_TEST_KUBECONFIG to run it")
    kube = Kube.connect(kubeconfig=kubeconfig)
    ns = f"deleting-{uuid.uuid4().hex[:6]}"
    kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    try:
        getattr(test_apiserver, case)(kube, ns)
    finally:
        kube.delete("v1", "Namespace", ns, None)


def test_a_parent_its_crd_no_longer_accepts_gets_one_warning_on_the_real_api_server() -> None:
    """The real v1.24 API server checks the whole stored object on a status write: a CRD
    made stricter refuses the status of a parent stored before (the local one does too:
    tests/engine/test_apiserver.py)."""
    from tests.engine.stricter_crd import parent_refused_by_a_stricter_crd

    kubeconfig = os.environ.get("EVENTOP_TEST_KUBECONFIG")
    if not kubeconfig:
        pytest.skip("cluster suite: set EVENTOP_TEST_KUBECONFIG to run it")
    kube = Kube.connect(kubeconfig=kubeconfig)
    suffix = uuid.uuid4().hex[:6]
    group, ns = f"s{suffix}.example.com", f"stricter-{suffix}"
    kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    try:
        parent_refused_by_a_stricter_crd(kube, group, ns)
    finally:
        kube.delete("apiextensions.k8s.io/v1", "CustomResourceDefinition", f"widgets.{group}")
        kube.delete("v1", "Namespace", ns)
