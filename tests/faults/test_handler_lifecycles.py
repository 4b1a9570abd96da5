"""Each handler's life on the real API server, driven only by the real watcher: create, change,
hand edits, delete, garbage collection (``pytest -m cluster``).

Black-box like the fault suite (same stack: watcher and router as processes, the cluster's
own controllers): the test changes the cluster as a user would and waits for what must
follow; no event is posted by hand except the scheduled rate refresh, which in production
comes from a CronJob. Copy rules' hand edits are part of every fault run
(:mod:`tests.faults.workload`); here the mirror and the exchange rate.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import requests

from demo.provider import EUR_RATES
from eventop.events import simple_event, to_http
from eventop.handlers.mirrors.build import Names
from eventop.kube.errors import Conflict as KubeConflict
from tests.faults.stack import Stack, converge
from tests.faults.workload import namespace

pytestmark = pytest.mark.cluster
TIMEOUT = 90.0
Obj = dict[str, Any]


def wait(what: str, check: Any) -> None:
    _, left = converge(lambda: [] if check() else [what], TIMEOUT)
    assert not left, f"not reached within {TIMEOUT:.0f} s: {what}"


def refresh(stack: Stack) -> None:
    """What the hourly CronJob posts (``python -m eventop.watcher emit``)."""
    headers, body = to_http(simple_event("dev.eventop.exchangerates.refresh", "/tests", None,
                                         f"refresh-{uuid.uuid4().hex}"))
    assert requests.post(stack.router.url, headers=headers, data=body, timeout=60).ok


def env_of(sts: Obj | None) -> dict[str, str]:
    if sts is None:
        return {}
    return {e["name"]: e.get("value", "") for e in
            sts["spec"]["template"]["spec"]["containers"][0].get("env") or []}


@pytest.fixture
def ns(stack: Stack) -> Any:
    name = f"life-{uuid.uuid4().hex[:6]}"
    stack.world.apply(namespace(name, {"pod-security.kubernetes.io/enforce": "privileged"}))
    stack.start_watcher()
    yield name
    stack.world.delete("v1", "Namespace", name)


def test_registry_mirror_lifecycle(stack: Stack, ns: str) -> None:
    world, names = stack.world, Names.of("hub")
    mirror = {"apiVersion": "eventop.dev/v1", "kind": "RegistryMirror",
              "metadata": {"name": "hub", "namespace": ns},
              "spec": {"upstream": "https://registry-1.docker.io", "hostPort": 23456}}
    world.apply(mirror)
    kinds = {"StatefulSet": ("apps/v1", names.statefulset),
             "DaemonSet": ("apps/v1", names.daemonset),
             "Service": ("v1", names.service), "headless Service": ("v1", names.headless_service),
             "PersistentVolumeClaim": ("v1", names.pvc)}

    def get(kind: str) -> Obj | None:
        api, name = kinds[kind]
        return world.get_or_none(api, kind.split()[-1], name, ns)
    wait("every object of the mirror", lambda: all(get(k) for k in kinds))

    mirror["spec"]["upstream"] = "https://mirror.gcr.io"  # changed
    world.apply(mirror)
    wait("the new upstream in the StatefulSet", lambda: env_of(get("StatefulSet")).get(
        "REGISTRY_PROXY_REMOTEURL") == "https://mirror.gcr.io")

    for kind in ("StatefulSet", "DaemonSet"):  # deleted by hand: made again
        api, name = kinds[kind]
        world.delete(api, kind, name, ns)
        wait(f"the {kind} made again", lambda k=kind: get(k) is not None
             and not get(k)["metadata"].get("deletionTimestamp"))

    uid = world.get("eventop.dev/v1", "RegistryMirror", "hub", ns)["metadata"]["uid"]
    world.delete("eventop.dev/v1", "RegistryMirror", "hub", ns)  # garbage collection
    wait("everything the mirror owned gone", lambda: all(
        (o := get(k)) is None or o["metadata"].get("deletionTimestamp")
        or uid not in [r["uid"] for r in o["metadata"].get("ownerReferences") or []]
        for k in kinds))


def test_registry_mirror_statefulset_edited_by_hand_is_restored(stack: Stack, ns: str) -> None:
    """A change of a mirror's StatefulSet runs the mirror's reconcile, which applies it back."""
    world, names = stack.world, Names.of("hub")
    world.apply({"apiVersion": "eventop.dev/v1", "kind": "RegistryMirror",
                 "metadata": {"name": "hub", "namespace": ns},
                 "spec": {"upstream": "https://quay.io", "hostPort": 23457}})
    wait("the StatefulSet", lambda: world.get_or_none("apps/v1", "StatefulSet",
                                                      names.statefulset, ns))
    for _ in range(10):  # read-modify-write: the StatefulSet controller writes its status too
        sts = world.get("apps/v1", "StatefulSet", names.statefulset, ns)
        for e in sts["spec"]["template"]["spec"]["containers"][0]["env"]:
            if e["name"] == "REGISTRY_PROXY_REMOTEURL":
                e["value"] = "https://evil.example.com"
        try:
            world.replace(sts)
            break
        except KubeConflict:
            continue
    _, left = converge(lambda: [] if env_of(world.get(
        "apps/v1", "StatefulSet", names.statefulset, ns))["REGISTRY_PROXY_REMOTEURL"]
        == "https://quay.io" else ["edited"], TIMEOUT)
    assert not left


def test_exchange_rate_lifecycle(stack: Stack, ns: str) -> None:
    world = stack.world
    rate = {"apiVersion": "eventop.dev/v1", "kind": "ExchangeRate",
            "metadata": {"name": "usd", "namespace": ns}, "spec": {"currency": "USD"}}
    world.apply(rate)

    def data() -> Obj:
        cm = world.get_or_none("v1", "ConfigMap", "usd", ns)
        return (cm or {}).get("data") or {}
    wait("the rate ConfigMap", lambda: data().get("rate") == EUR_RATES["USD"])

    rate["spec"]["currency"] = "GBP"  # changed
    world.apply(rate)
    wait("the GBP rate", lambda: (data().get("currency"), data().get("rate"))
         == ("GBP", EUR_RATES["GBP"]))

    world.patch("v1", "ConfigMap", "usd", ns, {"data": {"rate": "999"}})  # edited by hand
    refresh(stack)
    wait("the hand edit undone by the scheduled refresh",
         lambda: data().get("rate") == EUR_RATES["GBP"])

    world.delete("v1", "ConfigMap", "usd", ns)  # deleted by hand: the next refresh makes it
    refresh(stack)
    wait("the ConfigMap made again", lambda: data().get("rate") == EUR_RATES["GBP"])

    world.delete("eventop.dev/v1", "ExchangeRate", "usd", ns)
    wait("the ConfigMap gone with its ExchangeRate",
         lambda: world.get_or_none("v1", "ConfigMap", "usd", ns) is None)
