"""Overlapping runs of one parent (``engine/write.py``): a write an earlier run has in flight
is never sent twice, and another write of that child waits for it."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from eventop.engine.desired import Child
from eventop.engine.plan import Action, Plan
from eventop.engine.write import MESSAGE_LIMIT, InFlight, execute, one_line

Obj = dict[str, Any]
PARENT = {"apiVersion": "example.com/v1", "kind": "Team",
          "metadata": {"name": "a", "namespace": "teams", "uid": "parent-uid"}}


def roster(members: str) -> Obj:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "a-roster", "namespace": "teams",
                         "ownerReferences": [{"uid": "parent-uid", "controller": True}]},
            "data": {"members": members}}


class GatedWriter:
    """Records each write; creates wait for ``gate`` (a write held in flight)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.gate = threading.Event()
        self.sent = threading.Event()

    def create(self, obj: Obj) -> Obj:
        self.calls.append(("create", obj["data"]["members"]))
        self.sent.set()
        assert self.gate.wait(10)
        return {**obj, "metadata": {**obj["metadata"], "uid": "child", "resourceVersion": "1"}}

    def apply(self, obj: Obj, *, force: bool, existing: Obj | None = None) -> Obj:
        self.calls.append(("apply", obj["data"]["members"]))
        return obj


def create(members: str) -> Plan:
    body = roster(members)
    return Plan([Action("create", "ConfigMap", "teams", "a-roster", body, None, Child(body))])


def test_a_write_an_earlier_run_has_in_flight_is_not_sent_again() -> None:
    writer, inflight = GatedWriter(), InFlight()
    with ThreadPoolExecutor(4) as pool:
        first_sent = threading.Event()
        first = pool.submit(execute, create("ann"), writer, PARENT, submit=pool.submit,
                            inflight=inflight, dispatched=first_sent.set)
        assert first_sent.wait(10) and writer.sent.wait(10)
        # The next run read a cache without the child (its create is in flight): the same
        # create, from a snapshot taken before it planned.
        prior = inflight.snapshot()
        second_sent = threading.Event()
        second = pool.submit(execute, create("ann"), writer, PARENT, submit=pool.submit,
                             inflight=inflight, prior=prior, dispatched=second_sent.set)
        assert second_sent.wait(10)  # sent nothing: the next run may start already
        assert not second.done()  # but it is done only when the write it relies on is
        writer.gate.set()
        one, two = first.result(10), second.result(10)
    assert writer.calls == [("create", "ann")]
    assert [o["data"] for o in one.created] == [{"members": "ann"}]
    assert [o["data"] for o in two.unchanged] == [{"members": "ann"}] and not two.created
    assert len(inflight) == 0


def test_another_write_of_a_child_in_flight_is_sent_after_it() -> None:
    writer, inflight = GatedWriter(), InFlight()
    with ThreadPoolExecutor(4) as pool:
        first = pool.submit(execute, create("ann"), writer, PARENT, submit=pool.submit,
                            inflight=inflight)
        assert writer.sent.wait(10)
        body = roster("ann,bob")
        update = Plan([Action("apply", "ConfigMap", "teams", "a-roster", body, roster("ann"),
                              Child(body))])
        second = pool.submit(execute, update, writer, PARENT, submit=pool.submit,
                             inflight=inflight, prior=inflight.snapshot())
        assert not second.done() and writer.calls == [("create", "ann")]
        writer.gate.set()
        first.result(10)
        assert [o["data"] for o in second.result(10).updated] == [{"members": "ann,bob"}]
    assert writer.calls == [("create", "ann"), ("apply", "ann,bob")]


def test_a_refusal_keeps_the_api_servers_whole_message_on_one_line() -> None:
    # As a v1.24 API server words them: the first line alone ends at the colon.
    conflict = ('Apply failed with 2 conflicts: conflicts with "eventop-x" using v1:\n- .data.a\n'
                'conflicts with "kubectl-patch" using v1:\n- .data.b')
    assert one_line(conflict) == ('Apply failed with 2 conflicts: conflicts with "eventop-x" '
                                  'using v1: .data.a conflicts with "kubectl-patch" using v1: '
                                  '.data.b')
    escalation = ('rolebindings.rbac.authorization.k8s.io "admins" is forbidden: user "x" is '
                  'attempting to grant RBAC permissions not currently held:\n'
                  '{APIGroups:[""], Resources:["pods"], Verbs:["create"]}')
    assert one_line(escalation).endswith('held: {APIGroups:[""], Resources:["pods"], '
                                         'Verbs:["create"]}')
    assert len(one_line("x" * 5000)) == MESSAGE_LIMIT


def test_a_refusal_that_keeps_coming_back_is_a_warning_once_then_debug_until_it_changes(
        caplog: Any, monkeypatch: Any) -> None:
    """An RBAC grant removed refuses every copy on every retry: one warning per write, not
    per retry (the status condition and the Event say it all along); a different answer,
    or a success in between, is news again."""
    import logging

    from eventop.engine import write
    from eventop.kube.errors import Forbidden, Invalid
    from eventop.kube.recent import Recent

    monkeypatch.setattr(write, "_refusals_logged", Recent(16))  # nothing from other tests

    answers: list[Exception | None] = [Forbidden("secrets is forbidden"),
                                       Forbidden("secrets is forbidden"),
                                       Invalid("data: Invalid value"), None,
                                       Forbidden("secrets is forbidden")]

    class Refusing:
        def create(self, obj: Obj) -> Obj:
            answer = answers.pop(0)
            if answer is not None:
                raise answer
            return obj

    with caplog.at_level(logging.DEBUG, "eventop.engine"):
        for _ in range(5):
            execute(create("x"), Refusing(), PARENT)  # type: ignore[arg-type]
    levels = [(r.levelname, "Forbidden" if "forbidden" in r.getMessage() else "other")
              for r in caplog.records if "refused" in r.getMessage()]
    assert levels == [("WARNING", "Forbidden"), ("DEBUG", "Forbidden"), ("WARNING", "other"),
                      ("WARNING", "Forbidden")]


def creates_in_teams(count: int) -> list[Action]:
    """One create of the roster in each of ``team-0`` ... ``team-<count - 1>``, in order."""
    actions = []
    for i in range(count):
        body = {**roster("ann"), "metadata": {**roster("ann")["metadata"],
                                               "namespace": f"team-{i}"}}
        actions.append(Action("create", "ConfigMap", f"team-{i}", "a-roster", body, None,
                              Child(body)))
    return actions


def test_a_run_stops_sending_its_writes_once_the_api_server_is_found_unreachable() -> None:
    """A fan-out of 200 copies sent 200 requests into an outage on every retry of its run
    (1,500 in 13 s, a user's trial): after the first unreachable answer the rest fail at
    once with it, and the run is retried with backoff as before."""
    import pytest

    from eventop.kube import errors

    calls: list[str] = []

    class DownWriter:
        def create(self, obj: Obj) -> Obj:
            calls.append(obj["metadata"]["namespace"])
            raise errors.Unreachable("create: Kubernetes API unreachable at x: refused")

    actions = creates_in_teams(20)
    with pytest.raises(errors.Unavailable, match="unreachable"):
        execute(Plan(actions), DownWriter(), PARENT)  # type: ignore[arg-type]
    assert calls == ["team-0"]
    with ThreadPoolExecutor(4) as pool, pytest.raises(errors.Unavailable):
        calls.clear()
        execute(Plan(actions), DownWriter(), PARENT, submit=pool.submit)  # type: ignore[arg-type]
    assert 1 <= len(calls) <= 4  # only those already sent when the first answer came


def test_an_answer_of_500_for_one_object_does_not_stop_the_runs_other_writes() -> None:
    """A 5xx is an answer and may concern one object (a webhook failing in one namespace):
    only no answer at all stops the run's writes (a reviewer's finding: a namespace whose
    write always failed held back every write planned after it)."""
    import pytest

    from eventop.kube import errors

    calls: list[str] = []

    class OneFailing:
        def create(self, obj: Obj) -> Obj:
            ns = obj["metadata"]["namespace"]
            calls.append(ns)
            if ns == "team-0":
                raise errors.Unavailable("Internal error: failed calling webhook")
            return {**obj, "metadata": {**obj["metadata"], "uid": ns, "resourceVersion": "1"}}

    actions = creates_in_teams(10)
    with pytest.raises(errors.Unavailable, match="webhook"):
        execute(Plan(actions), OneFailing(), PARENT)  # type: ignore[arg-type]
    assert calls == [f"team-{i}" for i in range(10)]


def test_a_delete_that_finds_its_object_gone_is_gone_not_deleted() -> None:
    """Another replica's delete came first (a 404): not this run's deletion to report."""
    class GoneAlready:
        def delete(self, obj: Obj) -> bool:
            return False

    existing = {**roster("ann"), "metadata": {**roster("ann")["metadata"], "uid": "c",
                                               "resourceVersion": "3"}}
    plan = Plan([Action("delete", "ConfigMap", "teams", "a-roster", None, existing)])
    outcome = execute(plan, GoneAlready(), PARENT)  # type: ignore[arg-type]
    assert outcome.deleted == [] and [o["metadata"]["uid"] for o in outcome.gone] == ["c"]
