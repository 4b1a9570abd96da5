"""Router workers electing a leader (``EVENTOP_RUN_ON_WATCH=leader``, as deploy/'s replicas
do): only the Lease holder's watch starts runs, the others still answer events, and when the
leader dies another takes over.

Run on the local API server and, in the cluster suite, on a real one: the test pipeline's two
gunicorn workers stand for deploy/'s two replicas. No watcher runs, so a copy made without
an event posted was made by a run the leader's own watch started.
"""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from eventop.testing.waiting import wait_until

REPO = Path(__file__).resolve().parents[2]
Obj = dict[str, Any]
LEASE = ("coordination.k8s.io/v1", "Lease", "eventop-router", "default")


def namespace(name: str, labels: Obj | None = None) -> Obj:
    return {"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": name, "labels": dict(labels or {})}}


def holder(pipe: Any) -> str:
    lease = pipe.cluster.kube.get_or_none(*LEASE)
    return str(((lease or {}).get("spec") or {}).get("holderIdentity") or "")


def copied(pipe: Any, ns: str) -> bool:
    return pipe.cluster.kube.get_or_none("v1", "ConfigMap", "app-config", ns) is not None


def failover(pipe: Any) -> None:
    run = uuid.uuid4().hex[:6]
    label = {"eventop.dev/test-run": run}
    src, first, during, after = (f"eventop-lead-{run}-{k}" for k in ("src", "a", "b", "c"))
    cluster = pipe.cluster
    cluster.put(namespace(src))
    cluster.put(namespace(first, label))
    cluster.put({"apiVersion": "v1", "kind": "ConfigMap",
                 "metadata": {"name": "app-config", "namespace": src,
                              "labels": {"copyrator": "true"}}, "data": {"k": "v"}})
    cluster.put({"apiVersion": "eventop.dev/v1", "kind": "CopyRule",
                 "metadata": {"name": f"eventop-lead-{run}"},
                 "spec": {"ruleType": "configmap", "namespaces": [src],
                          "selector": {"matchLabels": {"copyrator": "true"}},
                          "targetNamespaces": {"selector": {"matchLabels": label}}}})
    try:
        # No event posted: the leader's watch saw the rule and ran it.
        cluster.wait_for(lambda: copied(pipe, first), 30, "the copy in the first namespace")
        leader = cluster.wait_for(lambda: holder(pipe), 30, "a Lease holder")
        _host, pid, _suffix = leader.rsplit("_", 2)
        os.kill(int(pid), signal.SIGKILL)  # no release: the lease must expire

        # Nobody leads for up to the lease's 15 s: an event still gets its run, in the
        # surviving worker (or the one gunicorn starts in place of the dead one).
        ns = cluster.put(namespace(during, label))
        assert pipe.post("add", ns) == 200
        assert copied(pipe, during)

        new = cluster.wait_for(lambda: holder(pipe) not in ("", leader) and holder(pipe),
                               45, "another worker holding the Lease")
        assert new != leader
        cluster.put(namespace(after, label))  # no event posted: the new leader's watch
        assert wait_until(lambda: copied(pipe, after), 30), \
            f"no copy in {after}: the new leader {new} did not run the rule from its watch"
    finally:
        cluster.remove("eventop.dev/v1", "CopyRule", f"eventop-lead-{run}")
        for ns_name in (src, first, during, after):
            cluster.remove("v1", "Namespace", ns_name)


def test_the_lease_holders_watch_starts_runs_and_another_worker_takes_over_when_it_dies(
        pipeline: Any) -> None:
    failover(pipeline)


@pytest.fixture
def real_pipeline(cluster_pipeline: Any) -> Iterator[Any]:
    cluster_pipeline.cluster.install_crds([REPO / "crds" / "copyrules.yaml"])
    yield cluster_pipeline


@pytest.mark.cluster
def test_on_a_real_api_server_another_worker_takes_the_lease_over_when_the_leader_dies(
        real_pipeline: Any) -> None:
    failover(real_pipeline)
