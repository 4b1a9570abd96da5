"""Leader election on a Lease: one leader, fast hand-over, a stale leader steps down."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from eventop.kube import Kube
from eventop.kube.errors import RESTARTED, Forbidden
from eventop.kube.leader import LeaderElector
from eventop.testing.waiting import wait_until

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


def test_a_campaign_stands_again_after_a_loss_and_hands_the_lease_back_when_stopped(
        local_kube) -> None:
    """The router's way: a replica that lost the lease stays up, and leads again once it
    can; stopping it releases the lease."""
    a = elector(local_kube, "a")
    stop = threading.Event()
    led: list[bool] = []
    campaign = a.campaign(stop, on_lead=lambda: led.append(a.is_leader))
    assert wait_until(lambda: a.is_leader, 5) and holder(local_kube) == "a"
    assert wait_until(lambda: led == [True], 5)  # each start of leading is announced
    local_kube.set_unavailable(True)
    assert wait_until(lambda: not a.is_leader, 5)  # past the renew deadline
    local_kube.set_unavailable(False)
    assert wait_until(lambda: a.is_leader, 10)  # stood again, and its own lease was free
    assert wait_until(lambda: led == [True, True], 5)
    assert campaign.is_alive()
    stop.set()
    campaign.join(5)
    assert not campaign.is_alive() and not a.is_leader
    assert holder(local_kube) == ""  # handed back: a standby takes over at once


def test_a_candidate_that_can_not_reach_the_lease_says_so_once_not_every_retry(
        local_kube, caplog) -> None:
    a = elector(local_kube, "a")
    stop = threading.Event()
    local_kube.set_unavailable(True)
    with caplog.at_level(logging.WARNING, logger="eventop.kube.leader"):
        thread = threading.Thread(target=a.acquire, args=(stop,))
        thread.start()
        time.sleep(10 * TIMING["retry_period"])  # about ten attempts
        local_kube.set_unavailable(False)
        assert wait_until(lambda: a.is_leader, 5)
        stop.set()
        thread.join(5)
    said = [r.getMessage() for r in caplog.records if "failed" in r.getMessage()]
    assert len(said) == 1 and "the API server is unreachable or failing" in said[0], said
    assert "service account" not in said[0]  # a 503 is not a grant missing
    a.release()


def first_failure(candidate: LeaderElector, caplog: pytest.LogCaptureFixture) -> None:
    """Campaign until the first warning is logged, then stop."""
    stop = threading.Event()
    with caplog.at_level(logging.WARNING, logger="eventop.kube.leader"):
        t = threading.Thread(target=candidate.acquire, args=(stop,))
        t.start()
        wait_until(lambda: caplog.records, timeout=5)
        stop.set()
        t.join(5)


def test_a_lease_namespace_that_does_not_exist_is_named_as_the_cause(
        local_kube, caplog: pytest.LogCaptureFixture) -> None:
    candidate = LeaderElector(Kube.connect(url=local_kube.url), "eventop-watcher", "nowhere",
                              "a", **TIMING)
    first_failure(candidate, caplog)
    assert "check that the namespace nowhere exists" in caplog.records[0].getMessage()
    assert "service account" not in caplog.records[0].getMessage()


class _Refusing:
    """A Kube whose Lease reads succeed ``allowed`` times, then are refused (403)."""

    def __init__(self, allowed: int) -> None:
        self.allowed = allowed

    def get_or_none(self, *_args: object) -> None:
        if self.allowed <= 0:
            raise Forbidden('leases.coordination.k8s.io "eventop-watcher" is forbidden',
                            reason="Forbidden")
        self.allowed -= 1

    def create(self, obj: dict) -> dict:
        return obj


@pytest.mark.parametrize(("allowed", "said"), [
    (0, "check that this service account may get, create and update leases in default, "
        "unless the API server has just started"),
    (1, "it was allowed before: the API server has most likely just restarted"),
])
def test_a_refused_lease_names_a_missing_grant_or_a_restart_by_what_came_before(
        caplog: pytest.LogCaptureFixture, allowed: int, said: str) -> None:
    """A 403 right after an API-server restart (its authorizer not loaded yet) is not the
    missing grant it would be on a first attempt."""
    candidate = LeaderElector(_Refusing(allowed), "eventop-watcher", "default", "a",
                              **TIMING)  # type: ignore[arg-type]
    if allowed:
        assert candidate.try_acquire_or_renew()
    first_failure(candidate, caplog)
    [line] = [r.getMessage() for r in caplog.records]
    assert "403 Forbidden" in line and said in line, line


def test_a_403_the_client_already_explains_gets_no_second_hint(
        caplog: pytest.LogCaptureFixture) -> None:
    class Explained(_Refusing):
        def get_or_none(self, *_args: object) -> None:
            raise Forbidden(f"leases are forbidden (the API server failed or was unreachable "
                            f"1s ago: {RESTARTED})", reason="Forbidden")

    candidate = LeaderElector(Explained(0), "eventop-watcher", "default", "a",
                              **TIMING)  # type: ignore[arg-type]
    first_failure(candidate, caplog)
    [line] = [r.getMessage() for r in caplog.records]
    assert line.endswith(f"1s ago: {RESTARTED})"), line  # one parenthesis, the client's
