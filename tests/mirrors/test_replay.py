"""Replay the recorded RegistryMirror traffic of ``mirrors-and-rates``.

The recording (a real v1.24 API server): mirrors ``docker-hub`` (hostPort 5001, 20Gi),
``quay`` (5002) and ``gcr`` (5003) created in ``registry-mirrors``; ``docker-hub`` grown to
50Gi (generation 2) and its status patched by hand; ``gcr`` deleted.

After each recorded change the mirror's objects must match it; at the end ``docker-hub``
and ``quay`` have theirs (``docker-hub`` at generation 2, with a 50Gi claim) and nothing is
left of ``gcr`` (the local API server garbage-collects owned objects, as a real one does).

Twice: the controller run in-process by the engine, and through the whole pipeline (router under
gunicorn, CloudEvents over HTTP). Then the whole recording once more: nothing changes.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from eventop import handlers
from eventop.engine.runtime import Engine
from eventop.handlers.events import Event
from eventop.handlers.mirrors.build import Names
from eventop.testing import LocalCluster, replay
from tests.support.engine import deliver, running_engine

RECORDING = Path(__file__).resolve().parents[1] / "recordings" / "mirrors-and-rates"
PATHS = [RECORDING / "apis_eventop.dev_v1_registrymirrors.list.json",
         RECORDING / "apis_eventop.dev_v1_registrymirrors.watch.jsonl"]
NS = "registry-mirrors"
UPSTREAMS = {"docker-hub": "https://registry-1.docker.io", "quay": "https://quay.io",
             "gcr": "https://gcr.io"}
Obj = dict[str, Any]
KINDS = (("v1", "PersistentVolumeClaim"), ("v1", "Service"), ("apps/v1", "StatefulSet"),
         ("apps/v1", "DaemonSet"))


def objects_of(local_kube: Any, name: str) -> dict[str, Obj]:
    out = {}
    for api_version, kind in KINDS:
        for obj in local_kube.list(api_version, kind, NS):
            if (obj["metadata"].get("labels") or {}).get("app.kubernetes.io/instance") == name:
                out[f"{kind}/{obj['metadata']['name']}"] = obj
    return out


def upstream_of(local_kube: Any, name: str) -> str:
    sts = local_kube.get("apps/v1", "StatefulSet", Names.of(name).statefulset, NS)
    env = {e["name"]: e.get("value") for e in sts["spec"]["template"]["spec"]["containers"][0][
        "env"]}
    return str(env["REGISTRY_PROXY_REMOTEURL"])


def check_after(local_kube: Any, change: str, obj: Obj, seen: dict[str, list[str]]) -> None:
    name = obj["metadata"]["name"]
    objs = objects_of(local_kube, name)
    if change == "delete":
        assert objs == {}, f"{name} deleted but {sorted(objs)} are left"
        seen.setdefault(name, []).append("gone")
        return
    assert len(objs) == 5, f"{name} after {change}: {sorted(objs)}"
    assert upstream_of(local_kube, name) == UPSTREAMS[name]
    mirror = local_kube.get("eventop.dev/v1", "RegistryMirror", name, NS)
    for o in objs.values():
        assert o["metadata"]["ownerReferences"][0]["uid"] == mirror["metadata"]["uid"]
    pvc = local_kube.get("v1", "PersistentVolumeClaim", Names.of(name).pvc, NS)
    size = pvc["spec"]["resources"]["requests"]["storage"]
    seen.setdefault(name, []).append(f"gen{mirror['metadata']['generation']}:{size}")


def check_end_state(local_kube: Any, hub_generation: int = 2) -> None:
    assert local_kube.get("eventop.dev/v1", "RegistryMirror", "gcr", NS) is None
    assert objects_of(local_kube, "gcr") == {}
    for name, port in (("docker-hub", 5001), ("quay", 5002)):
        assert len(objects_of(local_kube, name)) == 5
        assert upstream_of(local_kube, name) == UPSTREAMS[name]
        status = local_kube.get("eventop.dev/v1", "RegistryMirror", name, NS)["status"]
        assert status["endpoint"] == f"localhost:{port}"
        degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
        assert degraded["status"] == "False"
        # the hand-written Ready=True/Reconciled of the recording is replaced by the truth:
        # no StatefulSet controller runs here, so no registry pod is ready
        ready = next(c for c in status["conditions"] if c["type"] == "Ready")
        assert (ready["status"], ready["reason"]) == ("False", "RegistryNotReady")
    hub = local_kube.get("eventop.dev/v1", "RegistryMirror", "docker-hub", NS)
    assert hub["status"]["observedGeneration"] == hub["metadata"]["generation"] == hub_generation
    pvc = local_kube.get("v1", "PersistentVolumeClaim", Names.of("docker-hub").pvc, NS)
    assert pvc["spec"]["resources"]["requests"]["storage"] == "50Gi"
    pvc = local_kube.get("v1", "PersistentVolumeClaim", Names.of("quay").pvc, NS)
    assert pvc["spec"]["resources"]["requests"]["storage"] == "10Gi"  # the CRD default


EXPECTED_SEEN = {"docker-hub": ["gen1:20Gi", "gen2:50Gi", "gen2:50Gi"],
                 "quay": ["gen1:10Gi"], "gcr": ["gen1:10Gi", "gone"]}


@pytest.fixture
def engine(kube: Any) -> Iterator[Engine]:
    """Only the mirrors' controller, run by the engine as the router runs it."""
    own = handlers.load("", builtin="mirrors")
    assert own.controllers
    with running_engine(kube, own) as running:
        yield running


def deliver_ok(engine: Engine, event: Event) -> None:
    outcomes = deliver(engine, event)
    assert outcomes, f"no handler for {event.type}"
    failed = [o for o in outcomes if not o.ok]
    assert not failed, [o.detail for o in failed]


def test_recorded_session_in_process_leaves_each_mirrors_objects_and_status(
        engine: Engine, local_kube: Any) -> None:
    local_kube.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    seen: dict[str, list[str]] = {}
    replay(
        LocalCluster(local=local_kube), PATHS,
        lambda change, obj: deliver_ok(engine, Event.for_object(change, obj)),
        after_each=lambda change, obj: check_after(local_kube, change, obj, seen))
    assert seen == EXPECTED_SEEN
    check_end_state(local_kube)


@pytest.fixture
def pipeline_env() -> dict[str, str]:
    return {"EVENTOP_BUILTIN_HANDLERS": "mirrors"}


def test_recorded_session_through_the_router_converges_and_replays_rewrite_nothing(
        pipeline: Any) -> None:
    pipeline.cluster.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    local_kube = pipeline.cluster.local
    seen: dict[str, list[str]] = {}
    statuses = pipeline.replay(PATHS, after_each=lambda change, obj: check_after(
        local_kube, change, obj, seen))
    assert statuses and all(s in (200, 202) for s in statuses), statuses
    assert seen == EXPECTED_SEEN
    check_end_state(local_kube)

    # The same recording again (at-least-once delivery, a replayed stream): same state, and
    # docker-hub and quay's objects are not rewritten. The world writes docker-hub's two
    # recorded specs again, so its generation moves on to 4 (20Gi, then 50Gi again; the
    # claim is not shrunk in between).
    before = {n: {k: o["metadata"]["resourceVersion"] for k, o in objects_of(local_kube, n).items()}
              for n in ("docker-hub", "quay")}
    statuses = pipeline.replay(PATHS)
    assert all(s in (200, 202) for s in statuses), statuses
    check_end_state(local_kube, hub_generation=4)
    after = {n: {k: o["metadata"]["resourceVersion"] for k, o in objects_of(local_kube, n).items()}
             for n in ("docker-hub", "quay")}
    assert after == before
