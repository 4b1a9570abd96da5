"""Leader election on a Lease: one active watcher, fast hand-over, a stale leader steps down."""

from __future__ import annotations

import threading
import time

import pytest

from eventop.kube import Kube
from eventop.testing.processes import WatcherProcess
from eventop.testing.waiting import wait_until
from eventop.watcher.leader import LeaderElector

# Short, for a quick suite, but with room for a loaded CI machine: the leader renews every
# 0.1 s and only loses its lease if it stalls for 1.2 s (a candidate waits 2 s).
TIMING = {"lease_seconds": 2.0, "renew_deadline": 1.2, "retry_period": 0.1}


def elector(local_kube, identity: str) -> LeaderElector:
    return LeaderElector(Kube.connect(url=local_kube.url), "eventop-watcher", "default",
                         identity, **TIMING)


def holder(local_kube) -> str:
    lease = local_kube.get("coordination.k8s.io/v1", "Lease", "eventop-watcher", "default")
    return lease["spec"]["holderIdentity"] if lease else ""


def test_only_one_candidate_leads_and_release_hands_over_at_once(local_kube) -> None:
    a, b = elector(local_kube, "a"), elector(local_kube, "b")
    stop = threading.Event()
    assert a.acquire(stop)
    a.hold(stop.set)
    got: list[bool] = []
    t = threading.Thread(target=lambda: got.append(b.acquire(stop)))
    t.start()
    time.sleep(TIMING["lease_seconds"] + 0.5)  # a keeps renewing, so b must keep waiting
    assert got == [] and holder(local_kube) == "a"
    a.release()
    t.join(5)
    assert got == [True] and holder(local_kube) == "b"
    lease = local_kube.get("coordination.k8s.io/v1", "Lease", "eventop-watcher", "default")
    assert lease["spec"]["leaseTransitions"] == 1
    assert not stop.is_set()  # a released on purpose: that is not a lost lease
    b.release()


def test_a_leader_that_stops_renewing_is_replaced_after_the_lease_expires(local_kube) -> None:
    a, b = elector(local_kube, "a"), elector(local_kube, "b")
    stop = threading.Event()
    assert a.acquire(stop)  # and then never renews: a crashed process
    assert not b.try_acquire_or_renew()  # still fresh as far as b has seen
    assert b.acquire(stop)  # once the record stayed unchanged for the lease duration
    assert holder(local_kube) == "b"
    b.release()


def test_leader_cut_off_from_the_api_steps_down(local_kube) -> None:
    a = elector(local_kube, "a")
    stop, lost = threading.Event(), threading.Event()
    assert a.acquire(stop)
    a.hold(lost.set)
    local_kube.set_unavailable(True)
    assert lost.wait(5)
    assert not a.is_leader
    local_kube.set_unavailable(False)
    a.release()
    assert holder(local_kube) == "a"  # it lost, so it must not write the lease any more


def test_timings_must_leave_room_to_renew(local_kube) -> None:
    with pytest.raises(ValueError, match="renew deadline"):
        LeaderElector(Kube.connect(url=local_kube.url), "l", "default", "a",
                      lease_seconds=5, renew_deadline=5, retry_period=1)


def test_second_replica_stands_by_until_the_first_exits(local_kube, sink, tmp_path) -> None:
    env = {"EVENTOP_RESOURCES": "v1/configmaps@demo", "EVENTOP_KUBE_URL": local_kube.url,
           "EVENTOP_METRICS_PORT": "0", "EVENTOP_LEASE_NAMESPACE": "default",
           "EVENTOP_LEASE_SECONDS": "2", "EVENTOP_RENEW_DEADLINE_SECONDS": "1.5",
           "EVENTOP_RETRY_PERIOD_SECONDS": "0.2", "EVENTOP_READ_TIMEOUT_SECONDS": "2"}
    local_kube.put({"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": "one", "namespace": "demo"}})
    elect = ["--leader-elect"]
    first = WatcherProcess(sink.url, {**env, "HOSTNAME": "first"}, str(tmp_path), elect)
    second = None
    try:
        assert sink.wait_for(2, 30)  # the ConfigMap and kube-root-ca.crt
        second = WatcherProcess(sink.url, {**env, "HOSTNAME": "second"}, str(tmp_path), elect)
        assert wait_until(lambda: "standing by" in second.log(), 30), second.log()
        assert len(sink.accepted) == 2  # the standby lists nothing
        assert holder(local_kube).startswith("first_")
        first.stop(keep_log=True)  # SIGTERM: release the lease on the way out
        assert first.returncode == 0, first.log()
        assert sink.wait_for(4, 30)  # the new leader's initial list
        assert holder(local_kube).startswith("second_")
    finally:
        for proc in (first, second):
            if proc is not None:
                proc.stop()
