"""The engine's contract, run against the in-memory World (no server): what a controller's
pure function returns becomes the right writes, and nothing more."""

from __future__ import annotations

import re
from typing import Any

import pytest

from eventop.engine import (
    Child,
    Controller,
    Desired,
    Key,
    Kind,
    Note,
    SpecError,
    UndeclaredKind,
)
from eventop.engine.controller import PARENT_UID_LABEL
from eventop.engine.testing import World
from eventop.handlers import Registry

Obj = dict[str, Any]
TEAM = "example.com/v1/Team"


def team(name: str, members: list[str], namespace: str = "teams") -> Obj:
    return {"apiVersion": "example.com/v1", "kind": "Team",
            "metadata": {"name": name, "namespace": namespace}, "spec": {"members": members}}


def roster(t: Obj, **extra: Any) -> Obj:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": f"{t['metadata']['name']}-roster",
                         "namespace": t["metadata"]["namespace"]},
            "data": {"members": ",".join(t["spec"]["members"])}, **extra}


def teams_controller(**options: Any) -> Controller:
    ctl = Controller("teams", parent=TEAM, owns=["v1/ConfigMap"], registry=Registry(),
                     **options)

    @ctl.reconcile
    def desired(t: Obj, reads: Any) -> Desired:
        members = t["spec"]["members"]
        return Desired(
            children=[Child(roster(t), mode="replace")] if members else [],
            status=lambda outcome: {"members": len(members),
                                    "conflicts": [str(c) for c in outcome.conflicts]},
            events=[Note("Normal", "Roster", f"{len(members)} members")])
    return ctl


def test_missing_child_is_created_owned_by_its_parent_and_then_left_alone() -> None:
    world = World([team("a", ["ann", "bob"])])
    ctl = teams_controller()
    world.converge(ctl)
    cm = world.get("v1/ConfigMap", "a-roster", "teams")
    assert cm["data"] == {"members": "ann,bob"}
    (ref,) = cm["metadata"]["ownerReferences"]
    assert ref["uid"] == world.get(TEAM, "a", "teams")["metadata"]["uid"] and ref["controller"]
    assert world.writes == [("create", "ConfigMap", "teams", "a-roster"),
                            ("status", "Team", "teams", "a")]
    assert world.get(TEAM, "a", "teams")["status"] == {"members": 2, "conflicts": []}
    world.reconcile(ctl, "a", "teams")
    assert len(world.writes) == 2, "a converged parent costs no write"


def test_events_are_posted_only_by_runs_that_change_the_status() -> None:
    world = World([team("a", ["ann"])])
    ctl = teams_controller()
    world.converge(ctl)
    world.reconcile(ctl, "a", "teams")
    assert [n.reason for _, n in world.events] == ["Roster"]
    world.put(team("a", ["ann", "bob"]))
    world.reconcile(ctl, "a", "teams")
    assert [n.reason for _, n in world.events] == ["Roster", "Roster"]


def test_replace_mode_removes_a_key_added_by_hand() -> None:
    world = World([team("a", ["ann"])])
    ctl = teams_controller()
    world.converge(ctl)
    edited = world.get("v1/ConfigMap", "a-roster", "teams")
    world.put({**edited, "data": {"members": "ann", "extra": "by hand"}})
    world.converge(ctl)
    assert world.get("v1/ConfigMap", "a-roster", "teams")["data"] == {"members": "ann"}
    assert world.writes[-1] == ("replace", "ConfigMap", "teams", "a-roster")


def test_object_someone_else_owns_is_a_conflict_never_written() -> None:
    t = team("a", ["ann"])
    theirs = roster(t, data={"members": "theirs"})
    world = World([t, theirs])
    ctl = teams_controller()
    world.converge(ctl)
    world.converge(ctl)
    assert world.get("v1/ConfigMap", "a-roster", "teams")["data"] == {"members": "theirs"}
    assert world.get(TEAM, "a", "teams")["status"]["conflicts"] == ["teams/a-roster"]
    warnings = [n for _, n in world.events if n.type == "Warning"]
    assert len(warnings) == 1 and "ConfigMap teams/a-roster" in warnings[0].message
    assert not [w for w in world.writes if w[1] == "ConfigMap"]


def tenant(name: str, namespace: str) -> Obj:
    return {"apiVersion": "example.com/v1", "kind": "Tenant",
            "metadata": {"name": name}, "spec": {"namespace": namespace}}


def tenants_controller(*elsewhere: Obj) -> Controller:
    """Each Tenant wants its Namespace (spec.namespace) and a ConfigMap ``access`` in it,
    and the ``elsewhere`` children; its status lists the conflicts with their reasons."""
    ctl = Controller("tenants", parent="example.com/v1/Tenant",
                     owns=["v1/Namespace", "v1/ConfigMap"], registry=Registry())

    @ctl.reconcile
    def desired(t: Obj, reads: Any) -> Desired:
        ns = t["spec"]["namespace"]
        return Desired(children=[
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
            {"apiVersion": "v1", "kind": "ConfigMap",
             "metadata": {"name": "access", "namespace": ns}, "data": {"who": "erin"}},
            *elsewhere],
            status=lambda outcome: {"conflicts": sorted(
                f"{c.kind} {c}: {c.reason}" for c in outcome.conflicts)})
    return ctl


def test_children_in_a_desired_namespace_someone_else_made_are_held_back_not_written() -> None:
    """A cluster-scoped parent naming a namespace another team made: the Namespace is a
    conflict, and so is every child that would go into it (a RoleBinding there would grant
    access to someone else's namespace); its own children elsewhere are still written."""
    ctl = tenants_controller({"apiVersion": "v1", "kind": "ConfigMap",
                              "metadata": {"name": "gamma-note", "namespace": "tenants"},
                              "data": {}})
    world = World([tenant("gamma", "team-gamma"), {"apiVersion": "v1", "kind": "Namespace",
                                                   "metadata": {"name": "team-gamma"}},
                   {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "tenants"}}])
    world.converge(ctl)
    assert world.get("v1/ConfigMap", "access", "team-gamma") is None
    assert world.get("v1/ConfigMap", "gamma-note", "tenants") is not None
    assert world.get("example.com/v1/Tenant", "gamma")["status"]["conflicts"] == [
        "ConfigMap team-gamma/access: held back: Namespace team-gamma is not this parent's",
        "Namespace team-gamma: exists and is not managed by Tenant gamma"]
    assert not [w for w in world.writes if w[2] == "team-gamma"]


def test_children_are_held_back_when_their_namespace_was_made_by_someone_else_meanwhile(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The cache did not show the namespace yet (a team made it a moment before, or another
    parent's run did): its create finds it there, and nothing goes into it."""
    from eventop.engine import testing

    ctl = tenants_controller()
    world = World([tenant("x", "team-x")])
    create = testing._WorldWriter.create

    def made_meanwhile(self: Any, obj: Obj) -> Obj:
        if obj["kind"] == "Namespace":  # someone else's create won the race
            world.put({"apiVersion": "v1", "kind": "Namespace",
                       "metadata": {"name": obj["metadata"]["name"]}})
        return create(self, obj)

    monkeypatch.setattr(testing._WorldWriter, "create", made_meanwhile)
    world.reconcile(ctl, "x", None)
    assert world.get("v1/ConfigMap", "access", "team-x") is None
    assert "ConfigMap team-x/access: held back: Namespace team-x was not made by this parent" \
        in world.get("example.com/v1/Tenant", "x")["status"]["conflicts"]


def test_adopts_decides_whether_a_foreign_object_is_taken_over() -> None:
    t = team("a", ["ann"])
    world = World([t, roster(t, data={"members": "old"},
                             metadata={"name": "a-roster", "namespace": "teams",
                                       "labels": {"team": "a"}})])
    ctl = teams_controller()
    ctl.adopts(lambda parent, obj: obj["metadata"].get("labels", {}).get("team") == "a")
    world.converge(ctl)
    cm = world.get("v1/ConfigMap", "a-roster", "teams")
    assert cm["data"] == {"members": "ann"} and cm["metadata"]["labels"] == {"team": "a"}
    assert cm["metadata"]["ownerReferences"][0]["name"] == "a"


def test_owned_child_no_longer_desired_is_deleted() -> None:
    world = World([team("a", ["ann"])])
    ctl = teams_controller()
    world.converge(ctl)
    world.put(team("a", []))
    world.converge(ctl)
    assert world.get("v1/ConfigMap", "a-roster", "teams") is None
    assert ("delete", "ConfigMap", "teams", "a-roster") in world.writes


def test_two_controllers_of_one_parent_owning_one_kind_keep_and_prune_only_their_own() -> None:
    """Every child of a Team has the Team's ownerReference, whichever controller wrote it:
    two controllers owning ConfigMaps of one Team deleted each other's on every run (on a real
    API server ~210 deletes and creates a second). Each now marks and prunes its own."""
    registry = Registry()
    rosters = Controller("rosters", parent=TEAM, owns=["v1/ConfigMap"], registry=registry)
    badges = Controller("badges", parent=TEAM, owns=["v1/ConfigMap"], registry=registry)
    loners = Controller("loners", parent=TEAM, owns=["v1/Secret"], registry=registry)

    @rosters.reconcile
    def want_roster(t: Obj, reads: Any) -> Desired:
        return Desired([roster(t)] if t["spec"]["members"] else [])

    @badges.reconcile
    def want_badge(t: Obj, reads: Any) -> Desired:
        return Desired([{**roster(t), "metadata": {"name": "badge", "namespace": "teams"}}])

    @loners.reconcile
    def want_nothing(t: Obj, reads: Any) -> Desired:
        return Desired([])

    world = World([team("a", ["ann"])])
    for _ in range(3):
        world.converge(rosters)
        world.converge(badges)
    assert [w[0] for w in world.writes] == ["create", "create"]
    annotations = world.get("v1/ConfigMap", "a-roster", "teams")["metadata"]["annotations"]
    assert annotations["eventop.dev/controller"] == "rosters"
    assert loners.shared == set()  # no other owner of Secrets: children as before
    world.put(team("a", []))
    world.converge(rosters)
    world.converge(badges)
    assert world.get("v1/ConfigMap", "a-roster", "teams") is None  # its own, pruned
    assert world.get("v1/ConfigMap", "badge", "teams") is not None


def test_a_controller_does_not_write_into_another_controllers_child_of_its_parent() -> None:
    registry = Registry()
    first = Controller("first", parent=TEAM, owns=["v1/ConfigMap"], registry=registry)
    second = Controller("second", parent=TEAM, owns=["v1/ConfigMap"], registry=registry)
    for ctl, value in ((first, "1"), (second, "2")):
        ctl.reconcile(lambda t, reads, value=value: Desired(
            [{**roster(t), "data": {"by": value}}],
            status=lambda outcome: {"conflicts": [c.reason for c in outcome.conflicts]}))
    world = World([team("a", ["ann"])])
    world.converge(first)
    world.converge(second)
    assert world.get("v1/ConfigMap", "a-roster", "teams")["data"] == {"by": "1"}
    assert world.get(TEAM, "a", "teams")["status"]["conflicts"] == [
        "is controller first's child of Team teams/a"]


def test_a_namespace_is_created_before_the_children_it_holds_whatever_their_order() -> None:
    """Written together, a ResourceQuota raced its Namespace and lost (404) on a real API
    server; a cluster-scoped Tenant wants both."""
    ctl = Controller("tenants", parent="example.com/v1/Tenant",
                     owns=["v1/ResourceQuota", "v1/Namespace"], registry=Registry())

    @ctl.reconcile
    def want(tenant: Obj, reads: Any) -> Desired:
        ns = f"tenant-{tenant['metadata']['name']}"
        return Desired([{"apiVersion": "v1", "kind": "ResourceQuota",
                         "metadata": {"name": "quota", "namespace": ns},
                         "spec": {"hard": {"cpu": "2"}}},
                        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}])

    world = World([{"apiVersion": "example.com/v1", "kind": "Tenant",
                    "metadata": {"name": "acme"}}])
    world.converge(ctl)
    assert world.writes == [("create", "Namespace", "", "tenant-acme"),
                            ("create", "ResourceQuota", "tenant-acme", "quota")]


def test_a_create_whose_namespace_does_not_exist_is_reported_and_tried_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from eventop.engine import testing
    from eventop.kube import errors

    def missing(self: Any, obj: Obj, **_: Any) -> Obj:
        raise errors.NotFound('namespaces "teams" not found', reason="NotFound")

    monkeypatch.setattr(testing._WorldWriter, "create", missing)
    world = World([team("a", ["ann"])])
    result = world.reconcile(teams_controller(), "a", "teams")
    assert result.outcome is not None and result.unsettled
    [error] = result.outcome.errors
    assert (error.status, error.message) == (404, 'namespaces "teams" not found')


def test_a_namespaced_parent_owning_a_cluster_scoped_child_is_refused_naming_the_ways_out(
        ) -> None:
    """Kubernetes' garbage collector ignores such an ownerReference: the Namespace would
    stay forever after its parent was deleted, with no word from eventop."""
    ctl = Controller("projects", parent=TEAM, owns=["v1/Namespace"], registry=Registry())
    ctl.reconcile(lambda t, reads: Desired([{"apiVersion": "v1", "kind": "Namespace",
                                             "metadata": {"name": "project-a"}}]))
    world = World([team("a", ["ann"])])
    with pytest.raises(ValueError, match=r"garbage collector ignores .* owned=False"):
        world.reconcile(ctl, "a", "teams")
    assert world.writes == []


def test_a_failing_reconcile_is_a_warning_event_on_the_parent_once_per_failure() -> None:
    """kubectl describe shows why a parent does not converge, not only the router's log."""
    ctl = Controller("fragile", parent=TEAM, owns=["v1/ConfigMap"], registry=Registry())
    broken = {"now": True}

    @ctl.reconcile
    def want(t: Obj, reads: Any) -> Desired:
        if broken["now"]:
            raise KeyError("spec.quota")
        return Desired([])

    world = World([team("a", ["ann"])])
    for _ in range(3):
        with pytest.raises(KeyError):
            world.reconcile(ctl, "a", "teams")
    broken["now"] = False
    world.reconcile(ctl, "a", "teams")
    broken["now"] = True
    with pytest.raises(KeyError):
        world.reconcile(ctl, "a", "teams")
    failed = [n for _name, n in world.events if n.reason == "ReconcileFailed"]
    assert [(n.type, n.message) for n in failed] == [(
        "Warning", "fragile failed: KeyError: 'spec.quota'; retried with backoff (the "
        "router's log has the details)")] * 2  # once, and again after it recovered


def test_an_optional_owned_kind_the_server_does_not_serve_is_not_pruned_or_read() -> None:
    """An add-on's kind (VolumeSnapshots) may be owned yet not served: nothing of it can
    exist, so there is nothing to prune, and the run goes on with the rest."""
    snapshots = Kind("snapshot.storage.k8s.io/v1/VolumeSnapshot", optional=True)
    ctl = Controller("teams", parent=TEAM, owns=["v1/ConfigMap", snapshots],
                     registry=Registry())

    @ctl.reconcile
    def desired(t: Obj, reads: Any) -> Desired:
        assert not reads.served(snapshots)
        return Desired(children=[roster(t)])
    world = World([team("a", ["ann"])], unserved=[snapshots])
    world.converge(ctl)
    assert world.get("v1/ConfigMap", "a-roster", "teams")["data"] == {"members": "ann"}


def test_nothing_is_created_in_a_terminating_namespace() -> None:
    world = World([team("a", ["ann"]),
                   {"apiVersion": "v1", "kind": "Namespace",
                    "metadata": {"name": "teams", "deletionTimestamp": "2026-01-01T00:00:00Z"}}])
    world.converge(teams_controller())
    assert world.get("v1/ConfigMap", "a-roster", "teams") is None


def test_create_mode_child_is_made_once_and_never_updated() -> None:
    ctl = Controller("pw", parent=TEAM, owns=["v1/Secret"], registry=Registry())
    calls = []

    @ctl.reconcile
    def desired(t: Obj, reads: Any) -> Desired:
        calls.append(1)
        return Desired([Child({"apiVersion": "v1", "kind": "Secret",
                               "metadata": {"name": "pw", "namespace": "teams"},
                               "stringData": {"password": f"generated-{len(calls)}"}},
                              mode="create")])
    world = World([team("a", ["ann"])])
    world.converge(ctl)
    world.converge(ctl)
    assert world.get("v1/Secret", "pw", "teams")["stringData"] == {"password": "generated-1"}
    assert [w[0] for w in world.writes] == ["create"]


def test_finalizer_holds_the_parent_until_finalize_says_done() -> None:
    ctl = Controller("backups", parent=TEAM, owns=["batch/v1/Job", "v1/ConfigMap"],
                     registry=Registry())
    done = {"now": False}

    @ctl.reconcile
    def desired(t: Obj, reads: Any) -> Desired:
        return Desired([roster(t)])

    @ctl.finalize
    def cleanup(t: Obj, reads: Any) -> Desired:
        job = {"apiVersion": "batch/v1", "kind": "Job",
               "metadata": {"name": "final-backup", "namespace": "teams"}, "spec": {}}
        return Desired([Child(job, mode="create", owned=False)], done=done["now"],
                       requeue_after=None if done["now"] else 5.0)

    world = World([team("a", ["ann"])])
    world.converge(ctl)
    assert world.get(TEAM, "a", "teams")["metadata"]["finalizers"] == ["eventop.dev/backups"]
    world.delete(TEAM, "a", "teams")
    result = world.reconcile(ctl, "a", "teams")
    assert result.requeue_after == 5.0
    job = world.get("batch/v1/Job", "final-backup", "teams")
    assert job["metadata"]["labels"][PARENT_UID_LABEL] and "ownerReferences" not in job["metadata"]
    assert world.get(TEAM, "a", "teams") is not None, "kept until finalize says done"
    done["now"] = True
    world.reconcile(ctl, "a", "teams")
    assert world.get(TEAM, "a", "teams") is None
    assert world.get("v1/ConfigMap", "a-roster", "teams") is None, "owned: collected"
    assert world.get("batch/v1/Job", "final-backup", "teams") is not None, "not owned: kept"


def test_reading_a_kind_not_declared_names_it_and_how_to_declare_it() -> None:
    ctl = Controller("nosy", parent=TEAM, registry=Registry())

    @ctl.reconcile
    def desired(t: Obj, reads: Any) -> Desired:
        reads.list("v1/Pod")
        return Desired()
    with pytest.raises(UndeclaredKind, match=r"'nosy' read v1/Pod, which it did not declare: "
                                             r"add 'v1/Pod' to its reads"):
        World([team("a", [])]).reconcile(ctl, "a", "teams")


def test_a_child_of_an_undeclared_kind_is_refused() -> None:
    ctl = Controller("sloppy", parent=TEAM, registry=Registry())
    ctl.reconcile(lambda t, reads: Desired([roster(t)]))
    with pytest.raises(ValueError, match="v1/ConfigMap, which it does not declare"):
        World([team("a", ["ann"])]).reconcile(ctl, "a", "teams")


def test_a_misspelt_child_kind_is_refused_with_the_declared_kind_it_resembles() -> None:
    """"add it to owns=[...]" sent a user who had misspelt the kind to declare the typo too."""
    ctl = Controller("sloppy", parent=TEAM, owns=["v1/ConfigMap"], registry=Registry())
    ctl.reconcile(lambda t, reads: Desired([{**roster(t), "kind": "ConfigMapp"}]))
    with pytest.raises(ValueError, match=r"v1/ConfigMapp, which it does not declare: did you "
                                         r"mean v1/ConfigMap\? Else add it to owns=\[...\]"):
        World([team("a", ["ann"])]).reconcile(ctl, "a", "teams")


@pytest.mark.parametrize(("namespace", "said"), [
    (None, "wants ConfigMap a-roster without metadata.namespace, but ConfigMap is namespaced: "
           "give it the namespace it belongs in"),
    ("teams", None)])
def test_a_child_without_the_namespace_its_kind_needs_is_refused_in_a_test_world_too(
        namespace: str | None, said: str | None) -> None:
    """The test world took a namespaced child without a namespace; the real API server then
    answered 405, "the server does not allow this method on the requested resource" (a
    user's trial)."""
    ctl = teams_controller()

    @ctl.reconcile
    def want(t: Obj, reads: Any) -> Desired:
        child = roster(t)
        child["metadata"].pop("namespace")
        if namespace:
            child["metadata"]["namespace"] = namespace
        return Desired([Child(child, owned=False)])

    world = World([team("a", ["ann"])])
    if said is None:
        world.reconcile(ctl, "a", "teams")
        assert world.writes == [("create", "ConfigMap", "teams", "a-roster")]
        return
    with pytest.raises(ValueError, match=re.escape(said)):
        world.reconcile(ctl, "a", "teams")
    assert world.writes == []


def test_changes_map_to_parents_through_owners_and_mapping_functions() -> None:
    ctl = teams_controller(reads=["v1/Namespace"])

    @ctl.maps("v1/Namespace")
    def teams_in(ns: Obj, reads: Any) -> list[Obj]:
        return reads.list(TEAM, ns["metadata"]["name"])

    world = World([team("a", ["ann"]), team("b", ["bob"])])
    world.converge(ctl)
    from eventop.engine.reads import Reads

    reads = Reads(world._lookup, ctl.kinds(), ctl.name)
    cm = world.get("v1/ConfigMap", "b-roster", "teams")
    assert ctl.keys_for(cm, reads, parent_namespaced=True) == {Key("teams", "b")}
    ns = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "teams"}}
    assert ctl.keys_for(ns, reads, parent_namespaced=True) == {Key("teams", "a"),
                                                               Key("teams", "b")}
    foreign = roster(team("c", []))
    assert ctl.keys_for(foreign, reads, parent_namespaced=True) == set()


def test_registry_refuses_two_controllers_of_one_name() -> None:
    registry = Registry()
    Controller("same", parent=TEAM, registry=registry)
    with pytest.raises(ValueError, match="two controllers are named 'same'"):
        Controller("same", parent=TEAM, registry=registry)


def strict_teams(**options: Any) -> Controller:
    """Teams whose members must be lower-case: an upper-case name is an invalid spec."""
    ctl = Controller("strict", parent=TEAM, owns=["v1/ConfigMap"], registry=Registry(),
                     **options)

    @ctl.reconcile
    def desired(t: Obj, reads: Any) -> Desired:
        bad = [m for m in t["spec"]["members"] if m != m.lower()]
        if bad:
            raise SpecError(f"spec.members: {', '.join(bad)} must be lower-case",
                            reason="InvalidMember")
        return Desired([Child(roster(t))], status={"members": len(t["spec"]["members"])})
    return ctl


def test_an_invalid_spec_is_reported_in_status_and_once_as_a_warning() -> None:
    world = World([team("a", ["ann", "BOB"])])
    ctl = strict_teams()
    for _ in range(3):
        world.reconcile(ctl, "a", "teams")
    status = world.get(TEAM, "a", "teams")["status"]
    assert status["observedGeneration"] == 1
    (ready,) = status["conditions"]
    assert (ready["type"], ready["status"], ready["reason"]) == ("Ready", "False",
                                                                 "InvalidMember")
    assert ready["message"] == "spec.members: BOB must be lower-case"
    assert ready["observedGeneration"] == 1
    assert [(n.type, n.reason, n.message) for _, n in world.events] == [
        ("Warning", "InvalidMember", "spec.members: BOB must be lower-case")]
    assert world.writes == [("status", "Team", "teams", "a")]


def test_an_invalid_spec_leaves_the_children_it_had() -> None:
    world = World([team("a", ["ann"])])
    ctl = strict_teams()
    world.converge(ctl)
    world.put({**team("a", ["ann", "BOB"]), "metadata": {
        **world.get(TEAM, "a", "teams")["metadata"], "generation": 2}})
    world.converge(ctl)
    assert world.get("v1/ConfigMap", "a-roster", "teams")["data"] == {"members": "ann"}
    assert world.get(TEAM, "a", "teams")["status"]["observedGeneration"] == 2


def test_spec_error_reason_defaults_to_invalid_spec_and_sets_a_declared_degraded_condition(
        ) -> None:
    ctl = Controller("plain", parent=TEAM, registry=Registry(), degraded_condition="Degraded")

    @ctl.reconcile
    def desired(t: Obj, reads: Any) -> Desired:
        raise SpecError("spec.members is required")
    world = World([team("a", [])])
    world.reconcile(ctl, "a", "teams")
    conditions = {c["type"]: c for c in world.get(TEAM, "a", "teams")["status"]["conditions"]}
    assert (conditions["Ready"]["status"], conditions["Ready"]["reason"]) == ("False",
                                                                              "InvalidSpec")
    assert (conditions["Degraded"]["status"], conditions["Degraded"]["reason"]) == (
        "True", "InvalidSpec")
    assert conditions["Degraded"]["message"] == "spec.members is required"


def test_a_parent_being_deleted_with_an_invalid_spec_keeps_its_finalizer() -> None:
    ctl = strict_teams()
    ctl.finalize(lambda t, reads: ctl.reconcile_fn(t, reads))  # type: ignore[misc]
    world = World([team("a", ["ann"])])
    world.converge(ctl)
    world.put({**team("a", ["BOB"]), "metadata": world.get(TEAM, "a", "teams")["metadata"]})
    world.delete(TEAM, "a", "teams")
    world.reconcile(ctl, "a", "teams")
    assert world.get(TEAM, "a", "teams") is not None
    assert world.get(TEAM, "a", "teams")["status"]["conditions"][0]["reason"] == "InvalidMember"


def test_every_run_notes_are_posted_even_when_the_status_is_unchanged() -> None:
    ctl = Controller("flaky", parent=TEAM, registry=Registry())

    @ctl.reconcile
    def desired(t: Obj, reads: Any) -> Desired:
        return Desired(status={"ready": False},
                       events=[Note("Warning", "Down", "the provider is down", every_run=True),
                               Note("Normal", "Once", "only with a status change")])
    world = World([team("a", [])])
    for _ in range(3):
        world.reconcile(ctl, "a", "teams")
    assert [n.reason for _, n in world.events] == ["Down", "Once", "Down", "Down"]
    assert [w[0] for w in world.writes] == ["status"]


def test_adopting_by_replace_drops_the_earlier_controller_keeps_other_owners() -> None:
    t = team("a", ["ann"])
    keeper = {"apiVersion": "v1", "kind": "ConfigMap", "name": "keeper", "uid": "u-keeper"}
    earlier = {"apiVersion": "example.com/v1", "kind": "Team", "name": "a", "uid": "u-earlier",
               "controller": True, "blockOwnerDeletion": True}
    world = World([t, roster(t, data={"members": "old"}, metadata={
        "name": "a-roster", "namespace": "teams", "ownerReferences": [keeper, earlier]})])
    ctl = teams_controller()
    ctl.adopts(lambda parent, obj: True)
    world.converge(ctl)
    cm = world.get("v1/ConfigMap", "a-roster", "teams")
    uid = world.get(TEAM, "a", "teams")["metadata"]["uid"]
    assert [(r["name"], r["uid"]) for r in cm["metadata"]["ownerReferences"]] == [
        ("keeper", "u-keeper"), ("a", uid)]
    assert cm["data"] == {"members": "ann"}


def test_an_orphan_adopted_is_made_again_only_when_its_content_differs() -> None:
    """``recreate=True`` (an immutable kind) adopts an orphan by deleting and creating it
    only if its content is not as desired: one already as desired keeps running (a
    reviewer's finding: every adopted orphan was made again, a Job's pods killed)."""
    for data, made_again in (({"members": "ann"}, False), ({"members": "old"}, True)):
        t = team("a", ["ann"])
        world = World([t, roster(t, data=data)])
        ctl = Controller("teams", parent=TEAM, owns=["v1/ConfigMap"], registry=Registry())
        ctl.reconcile(lambda t, reads: Desired(children=[Child(roster(t), recreate=True)]))
        ctl.adopts(lambda parent, obj: True)
        before = world.get("v1/ConfigMap", "a-roster", "teams")["metadata"]["uid"]
        world.converge(ctl)
        cm = world.get("v1/ConfigMap", "a-roster", "teams")
        assert cm["data"] == {"members": "ann"}
        assert [r["name"] for r in cm["metadata"]["ownerReferences"]] == ["a"]
        assert (cm["metadata"]["uid"] != before) == made_again, data


def test_a_refused_write_carries_the_servers_status_and_reason() -> None:
    from eventop.engine.plan import Action, Plan
    from eventop.engine.write import execute
    from eventop.kube import errors

    class Refusing:
        def apply(self, obj: Obj, *, force: bool, existing: Obj | None = None) -> Obj:
            raise errors.Invalid("spec: Forbidden: field is immutable\n  diff...", status=422,
                                 reason="Invalid")

    action = Action("apply", "ConfigMap", "teams", "a-roster", roster(team("a", ["ann"])),
                    roster(team("a", [])), Child(roster(team("a", ["ann"]))))
    parent = {**team("a", ["ann"]), "metadata": {**team("a", [])["metadata"], "uid": "uid"}}
    outcome = execute(Plan(actions=[action]), Refusing(), parent)  # type: ignore[arg-type]
    (error,) = outcome.errors
    assert (error.status, error.reason) == (422, "Invalid")
    assert error.message == "spec: Forbidden: field is immutable diff..."  # whole, one line


def test_a_refused_write_is_a_warning_event_with_the_servers_reason_once_not_per_run(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from eventop.engine import testing
    from eventop.kube import errors

    def refuse(self: Any, obj: Obj, **_: Any) -> Obj:
        raise errors.Invalid("ConfigMap \"a-roster\" is invalid: data: Too long", status=422,
                             reason="Invalid")

    monkeypatch.setattr(testing._WorldWriter, "create", refuse)
    world = World([team("a", ["ann"])])
    ctl = teams_controller()
    for _ in range(3):
        world.reconcile(ctl, "a", "teams")
    refusals = [n for _name, n in world.events if n.reason == "WriteRefused"]
    assert [(n.type, n.message) for n in refusals] == [(
        "Warning", 'the API server refused to create ConfigMap teams/a-roster: ConfigMap '
        '"a-roster" is invalid: data: Too long: fix what it names: in the spec, or in the '
        "object as edited by hand (server-side apply merges with it); tried again "
        "with backoff (at most every 5 minutes) and whenever something changes")]
    assert world.reconcile(ctl, "a", "teams").unsettled  # so the router tries it again


def refused_create(monkeypatch: pytest.MonkeyPatch, message: str) -> tuple[Any, Note]:
    """One run of Team ``a`` whose every create is refused 403 with ``message``: its result
    and the one WriteRefused Event it posted."""
    from eventop.engine import testing
    from eventop.kube import errors

    def refuse(self: Any, obj: Obj, **_: Any) -> Obj:
        raise errors.Forbidden(message, reason="Forbidden")

    monkeypatch.setattr(testing._WorldWriter, "create", refuse)
    world = World([team("a", ["ann"])])
    result = world.reconcile(teams_controller(), "a", "teams")
    (note,) = [n for _name, n in world.events if n.reason == "WriteRefused"]
    return result, note


def test_a_write_refused_by_authorization_says_it_is_tried_again_within_the_short_cap(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A 403 is retried at most every 30 s (REFUSED_RETRY_CAP), not 5 minutes: the Event
    says the interval the queue really keeps, and what to grant."""
    result, note = refused_create(
        monkeypatch, 'configmaps is forbidden: User "system:serviceaccount:eventop-system:'
        'eventop-router" cannot create resource "configmaps" in API group "" in the '
        'namespace "teams"')
    assert note.message.endswith(
        "grant the router's ServiceAccount what it names; "
        "tried again with backoff (at most every 30 s) and whenever something changes")
    assert result.unsettled and result.retry_cap == 30.0


def test_a_write_refused_by_admission_is_not_blamed_on_the_routers_permissions(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A claim a storage class can not resize is refused 403 by admission, not by RBAC: the
    Event sent the user to grant permissions the router already had."""
    _result, note = refused_create(
        monkeypatch, 'persistentvolumeclaims "backup" is forbidden: only dynamically '
        "provisioned pvc can be resized and the storageclass that provisions the pvc must "
        "support resize")
    assert "an admission check refused it" in note.message
    assert "ServiceAccount" not in note.message


def test_a_role_binding_refused_as_an_escalation_says_to_grant_bind(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """RBAC's privilege-escalation check words its 403 unlike an authorization refusal:
    it is not an admission check, and the README's remedy is bind on the role."""
    _result, note = refused_create(
        monkeypatch, 'rolebindings.rbac.authorization.k8s.io "team-edit" is forbidden: user '
        '"system:serviceaccount:eventop-system:eventop-router" (groups=[...]) is attempting '
        "to grant RBAC permissions not currently held: ...")
    assert "bind on the role it hands out" in note.message
    assert "admission" not in note.message


def test_a_delete_that_lost_a_race_is_run_again_without_a_warning_event(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Two router replicas: the other one changed (or deleted) the child since this run
    read it. That is no refusal to tell the user about (a reviewer saw "another field
    manager set those fields" for it): the run is repeated on a fresh read."""
    from eventop.engine import testing
    from eventop.kube import errors

    def lost(self: Any, obj: Obj) -> None:
        raise errors.Conflict("the object has been modified", reason="Conflict")

    world = World([team("a", ["ann"])])
    ctl = teams_controller()
    world.converge(ctl)
    world.put(team("a", []))
    monkeypatch.setattr(testing._WorldWriter, "delete", lost)
    result = world.reconcile(ctl, "a", "teams")
    assert result.retry and [e.reason for e in result.outcome.errors] == ["StaleWrite"]
    assert [n.reason for _name, n in world.events if n.type == "Warning"] == []


def test_world_hands_a_change_to_the_parents_it_maps_to() -> None:
    ctl = teams_controller(reads=["v1/Namespace"])
    ctl.maps("v1/Namespace")(lambda ns, reads: reads.list(TEAM, ns["metadata"]["name"]))
    world = World([team("a", ["ann"]), team("b", ["bob"])])
    ns = world.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "teams"}})
    runs = world.changed(ctl, ns)
    assert [str(r.key) for r in runs] == ["teams/a", "teams/b"]
    cm = world.get("v1/ConfigMap", "a-roster", "teams")
    world.delete("v1/ConfigMap", "a-roster", "teams")
    assert [str(r.key) for r in world.changed(ctl, cm)] == ["teams/a"]
    assert world.get("v1/ConfigMap", "a-roster", "teams") is not None, "created again"


def test_world_hands_a_refresh_to_the_parents_its_trigger_names() -> None:
    from eventop.handlers.events import Event

    ctl = teams_controller()
    ctl.triggers("example.refresh")(lambda event, reads: reads.list(TEAM))
    world = World([team("a", ["ann"]), team("b", ["bob"])])
    assert [str(r.key) for r in world.triggered(ctl, Event.simple("example.refresh"))] == [
        "teams/a", "teams/b"]
    assert world.triggered(ctl, Event.simple("example.other")) == []


def keyed_controller() -> Controller:
    """One ConfigMap key per member, by server-side apply (the default mode)."""
    ctl = Controller("keyed", parent=TEAM, owns=["v1/ConfigMap"], registry=Registry())

    @ctl.reconcile
    def desired(t: Obj, reads: Any) -> Desired:
        cm = roster(t)
        cm["data"] = {m: "member" for m in t["spec"]["members"]}
        return Desired(children=[Child(cm)])
    return ctl


def test_a_key_the_handler_no_longer_wants_is_applied_away() -> None:
    """What is left is still "contained" in the live object: the hash of the last applied
    body tells that the apply that removes the rest is due."""
    world = World([team("a", ["ann", "bob"])])
    ctl = keyed_controller()
    world.converge(ctl)
    world.put(team("a", ["ann"]))
    world.converge(ctl)
    assert [w[0] for w in world.writes] == ["create", "apply"]
    assert world.get("v1/ConfigMap", "a-roster", "teams")["data"] == {"ann": "member"}
    world.converge(ctl)
    assert len(world.writes) == 2  # and once applied, in sync


def test_an_empty_map_the_api_server_dropped_is_not_written_again() -> None:
    """The API server stores ``data: {}`` as no data at all: still what was asked for."""
    world = World([team("a", [])])
    ctl = keyed_controller()
    world.converge(ctl)
    cm = world.get("v1/ConfigMap", "a-roster", "teams")
    world.put({k: v for k, v in cm.items() if k != "data"})  # as the server keeps it
    world.converge(ctl)
    assert [w[0] for w in world.writes] == ["create"]


def test_a_finalizer_the_handler_no_longer_handles_is_removed_so_deletion_proceeds() -> None:
    """Its @finalize function was removed: nothing else would ever remove the finalizer."""
    held = team("a", ["ann"])
    held["metadata"]["finalizers"] = ["eventop.dev/teams", "example.com/other"]
    world = World([held])
    ctl = teams_controller()
    world.converge(ctl)
    assert world.get(TEAM, "a", "teams")["metadata"]["finalizers"] == ["example.com/other"]
    assert world.get("v1/ConfigMap", "a-roster", "teams") is not None  # and it runs on


def test_a_parent_held_by_a_finalizer_the_handler_no_longer_handles_can_be_deleted() -> None:
    held = team("b", ["bob"])
    held["metadata"].update(finalizers=["eventop.dev/teams"],
                            deletionTimestamp="2026-11-28T00:00:00Z")
    world = World([held])
    world.converge(teams_controller())
    assert not (world.get(TEAM, "b", "teams") or {}).get("metadata", {}).get("finalizers")


def volume(reclaim: str) -> Obj:
    return {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "pv-a"},
            "spec": {"persistentVolumeReclaimPolicy": reclaim, "capacity": {"storage": "1Gi"}}}


def retaining_controller(name: str = "pv-b", reads: tuple[str, ...] = ("v1/PersistentVolume",)
                         ) -> Controller:
    ctl = Controller("keeper", parent=TEAM, reads=list(reads), registry=Registry())

    @ctl.reconcile
    def desired(t: Obj, r: Any) -> Desired:
        return Desired(patch=[{"apiVersion": "v1", "kind": "PersistentVolume",
                               "metadata": {"name": pv},
                               "spec": {"persistentVolumeReclaimPolicy": "Retain"}}
                              for pv in ("pv-a", name)])
    return ctl


def test_a_patch_sets_only_its_fields_in_an_object_someone_else_made_and_only_once() -> None:
    world = World([team("a", ["ann"]), volume("Delete")])
    ctl = retaining_controller()
    world.converge(ctl)
    pv = world.get("v1/PersistentVolume", "pv-a")
    assert pv["spec"] == {"persistentVolumeReclaimPolicy": "Retain",
                          "capacity": {"storage": "1Gi"}}
    assert not (pv["metadata"].get("ownerReferences") or pv["metadata"].get("labels"))
    # patched once; the missing pv-b is not created
    assert [w for w in world.writes if w[1] == "PersistentVolume"] == \
        [("patch", "PersistentVolume", "", "pv-a")]
    assert world.get("v1/PersistentVolume", "pv-b") is None
    world.reconcile(ctl, "a", "teams")
    assert [w for w in world.writes if w[1] == "PersistentVolume"] == \
        [("patch", "PersistentVolume", "", "pv-a")]


def test_a_patch_of_a_kind_the_controller_does_not_read_is_a_clear_error() -> None:
    world = World([team("a", ["ann"]), volume("Delete")])
    ctl = retaining_controller(reads=("v1/Namespace",))
    with pytest.raises(ValueError, match="patches v1/PersistentVolume, which it does not "
                                         r"declare: add it to reads=\[...\]"):
        world.reconcile(ctl, "a", "teams")


def test_a_parent_deleted_before_it_held_the_finalizer_is_left_to_go_without_a_failure() -> None:
    """The run read the parent just before its deletion; the finalizer it then adds is
    refused (being deleted). Nothing was made for it yet: the run says it is going and
    neither reconciles nor reports a failure."""
    from eventop.engine.reads import Reads
    from eventop.engine.run import run
    from eventop.engine.testing import _WorldWriter

    ctl = teams_controller()
    ctl.finalize(lambda t, reads: Desired([], done=True))
    held = team("a", ["ann"])
    held["metadata"]["finalizers"] = ["example.com/other"]
    world = World([held])
    stale = world.get(TEAM, "a", "teams")
    world.delete(TEAM, "a", "teams")
    reads = Reads(world._lookup, ctl.kinds(), ctl.name, stale)
    result = run(ctl, Key("teams", "a"), stale, reads, _WorldWriter(world, ctl.field_manager))
    assert "is being deleted" in result.summary
    assert world.get("v1/ConfigMap", "a-roster", "teams") is None
    assert world.get(TEAM, "a", "teams")["metadata"]["finalizers"] == ["example.com/other"]
    assert world.events == []


def test_a_child_made_in_create_mode_then_applied_unchanged_costs_no_write() -> None:
    """The databases handler creates a credentials Secret it generated (create: a password
    another replica generated must not be overwritten), then applies it with the passwords
    it holds. Before, that first apply was a write (and, on a real API server, a read and a
    patch handing fields over) only because the created Secret carried no digest."""
    ctl = Controller("secrets", parent=TEAM, owns=["v1/Secret"], registry=Registry())

    @ctl.reconcile
    def desired(t: Obj, reads: Any) -> Desired:
        made = reads.get("v1/Secret", "a-credentials", "teams") is not None
        secret = {"apiVersion": "v1", "kind": "Secret",
                  "metadata": {"name": "a-credentials", "namespace": "teams"},
                  "data": {"password": "czNjcjN0"}}
        return Desired([Child(secret, mode="apply" if made else "create", force=True)])

    world = World([team("a", ["ann"])])
    world.converge(ctl)
    assert [w[:2] for w in world.writes if w[1] == "Secret"] == [("create", "Secret")]
    annotations = world.get("v1/Secret", "a-credentials", "teams")["metadata"]["annotations"]
    assert "eventop.dev/created-not-applied" in annotations  # a later change hands over first


def test_refusal_events_follow_conflict_events_unless_asked_for_on_their_own(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A handler that words its conflicts itself (conflict_events=False) may still want the
    engine's WriteRefused Events (copy rules do); by default it reports both itself."""
    from eventop.engine import testing
    from eventop.kube import errors

    def refuse(self: Any, obj: Obj, **_: Any) -> Obj:
        raise errors.Invalid("data: Too long", status=422, reason="Invalid")

    monkeypatch.setattr(testing._WorldWriter, "create", refuse)
    for options, posted in (({"conflict_events": False}, False),
                            ({"conflict_events": False, "refusal_events": True}, True),
                            ({"conflict_events": True, "refusal_events": False}, False),
                            ({}, True)):
        world = World([team("a", ["ann"])])
        world.reconcile(teams_controller(**options), "a", "teams")
        refusals = [n for _name, n in world.events if n.reason == "WriteRefused"]
        assert bool(refusals) == posted, options


def test_the_test_worlds_merge_patch_drops_nulls_as_the_api_server_does() -> None:
    """RFC 7386: null removes a key, also under a map the object did not have yet (a
    handler test could otherwise pass against a World holding what no server would)."""
    from eventop.engine.testing import _merge

    assert _merge({"metadata": {"annotations": {"a": "1"}}},
                  {"metadata": {"annotations": {"a": None, "b": "2"}}}) == \
        {"metadata": {"annotations": {"b": "2"}}}
    assert _merge({"metadata": {}}, {"metadata": {"annotations": {"a": None}}}) == \
        {"metadata": {"annotations": {}}}
    assert _merge({"spec": 1}, {"spec": {"x": None, "y": 2}}) == {"spec": {"y": 2}}


@pytest.mark.parametrize("namespaces", [None, "v1/Namespace", Kind.of("v1/Namespace",
                                                                       selector="fan=yes")],
                         ids=["not-read", "every-namespace", "label-selected"])
def test_a_child_in_a_namespace_the_cache_does_not_hold_is_kept_only_if_every_one_is_read(
        namespaces: Any) -> None:
    """A controller reading every Namespace decided without one its cache does not hold
    yet (another replica made the child there a moment ago): the child stays. One reading
    some Namespaces (a label selector), or none, can not tell a new namespace from one it
    does not see: its children there are pruned as any (a reviewer's finding: with a
    selector, a child in a namespace relabelled out of it stayed for good)."""
    world = World([team("a", ["ann"])])
    options = {"reads": [namespaces]} if namespaces else {}
    ctl = teams_controller(**options)
    world.converge(ctl)
    elsewhere = world.get("v1/ConfigMap", "a-roster", "teams")
    elsewhere = {**elsewhere, "metadata": {**elsewhere["metadata"], "namespace": "unseen"}}
    for volatile in ("uid", "resourceVersion"):
        elsewhere["metadata"].pop(volatile, None)
    world.put(elsewhere)
    world.converge(ctl)
    kept = world.get("v1/ConfigMap", "a-roster", "unseen") is not None
    assert kept == (namespaces == "v1/Namespace")
