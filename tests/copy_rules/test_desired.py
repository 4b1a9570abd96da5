"""The pure functions that decide what a CopyRule asks for (no API server involved)."""

from __future__ import annotations

from typing import Any

import pytest

from eventop.engine.testing import World
from eventop.handlers.copy_rules import desired as d
from eventop.handlers.copy_rules.controller import rules
from eventop.handlers.copy_rules.desired import Slot
from eventop.kube.objects import LABEL_VALUE

Obj = dict[str, Any]


def rule(name: str = "main-rule", rule_type: str = "configmap", namespaces: Any = ("default",),
         selector: Obj | None = None, targets: Obj | None = None, uid: str = "rule-uid") -> Obj:
    spec: Obj = {"ruleType": rule_type, "namespaces": list(namespaces),
                 "selector": selector if selector is not None else
                 {"matchLabels": {"copyrator": "true"}}}
    if targets is not None:
        spec["targetNamespaces"] = targets
    return {"apiVersion": "eventop.dev/v1", "kind": "CopyRule",
            "metadata": {"name": name, "uid": uid, "generation": 1}, "spec": spec}


def ns(name: str, labels: Obj | None = None, phase: str = "Active") -> Obj:
    meta: Obj = {"name": name, "labels": {"kubernetes.io/metadata.name": name, **(labels or {})}}
    if phase == "Terminating":
        meta["deletionTimestamp"] = "2026-11-21T07:41:01Z"
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": meta, "status": {"phase": phase}}


def cm(name: str, namespace: str = "default", data: Obj | None = None,
       labels: Obj | None = None, **extra: Any) -> Obj:
    obj: Obj = {"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": name, "namespace": namespace, "uid": f"{namespace}-{name}",
                             "resourceVersion": "7", "creationTimestamp": "2026-11-21T07:40:58Z",
                             "labels": {"copyrator": "true"} if labels is None else labels,
                             "managedFields": [{"manager": "kubectl-create"}]},
                "data": {"mirror": "mirror.internal:5000"} if data is None else data}
    obj.update(extra)
    return obj


def secret(name: str, type_: str = "kubernetes.io/dockerconfigjson",
           namespace: str = "default") -> Obj:
    return {"apiVersion": "v1", "kind": "Secret", "type": type_,
            "metadata": {"name": name, "namespace": namespace, "labels": {"copyrator": "true"}},
            "data": {".dockerconfigjson": "e30="}}


CLUSTER = [ns("default"), ns("kube-system"), ns("kube-public"), ns("kube-node-lease"),
           ns("team-a", {"tier": "apps"}), ns("team-b"), ns("gone", phase="Terminating")]


def test_default_targets_are_active_non_system_namespaces_except_the_sources_own() -> None:
    wanted = d.desired_copies(rule(), [cm("registry-config")], CLUSTER)
    assert sorted(map(str, wanted)) == ["team-a/registry-config", "team-b/registry-config"]


def test_target_names_and_selector_each_add_namespaces() -> None:
    by_names = rule(targets={"names": ["team-b", "kube-system"]})
    by_selector = rule(targets={"selector": {"matchLabels": {"tier": "apps"}}})
    both = rule(targets={"names": ["team-b"], "selector": {"matchLabels": {"tier": "apps"}}})
    src = [cm("x")]
    assert {s.namespace for s in d.desired_copies(by_names, src, CLUSTER)} == \
        {"team-b", "kube-system"}  # a system namespace named explicitly is a target
    assert {s.namespace for s in d.desired_copies(by_selector, src, CLUSTER)} == {"team-a"}
    assert {s.namespace for s in d.desired_copies(both, src, CLUSTER)} == {"team-a", "team-b"}


def test_selector_matching_everything_still_skips_system_and_terminating_namespaces() -> None:
    everything = rule(targets={"selector": {}})
    assert {s.namespace for s in d.desired_copies(everything, [cm("x")], CLUSTER)} == \
        {"team-a", "team-b"}


def test_copy_keeps_payload_and_drops_source_metadata() -> None:
    source = cm("registry-config", binaryData={"blob": "AAE="}, immutable=True)
    source["metadata"]["ownerReferences"] = [{"kind": "Deployment", "uid": "x"}]
    source["metadata"]["annotations"] = {"team": "platform"}
    copy = d.desired_copy(rule(), source, "team-a")
    meta = copy["metadata"]
    assert copy["data"] == source["data"] and copy["binaryData"] == {"blob": "AAE="}
    assert copy["immutable"] is True
    assert set(meta) == {"name", "namespace", "labels", "annotations", "ownerReferences"}
    assert meta["ownerReferences"] == [{
        "apiVersion": "eventop.dev/v1", "kind": "CopyRule", "name": "main-rule",
        "uid": "rule-uid", "controller": True, "blockOwnerDeletion": True}]
    assert meta["labels"] == {"app.kubernetes.io/managed-by": "eventop",
                              "eventop.dev/copy-rule": "main-rule",
                              "eventop.dev/source-namespace": "default"}
    assert "copyrator" not in meta["labels"]  # a copy must never match the rule's selector
    assert meta["annotations"]["eventop.dev/source"] == "default/registry-config"
    assert meta["annotations"]["eventop.dev/content-hash"] == d.source_hash(source)


def test_secret_copy_keeps_its_type_and_token_secrets_are_never_sources() -> None:
    r = rule(rule_type="secret")
    assert d.desired_copy(r, secret("regcred"), "team-a")["type"] == \
        "kubernetes.io/dockerconfigjson"
    assert d.is_source(r, secret("regcred"))
    assert not d.is_source(r, secret("builder-token", "kubernetes.io/service-account-token"))


def test_the_root_ca_configmap_kubernetes_keeps_everywhere_is_never_a_source() -> None:
    """A rule with no selector matched kube-root-ca.crt and reported a CopyConflict in every
    namespace forever, advising to delete the cluster's own object (a reviewer's report)."""
    everything = rule(selector={})
    assert d.is_source(everything, cm("app-config", labels={}))
    assert not d.is_source(everything, cm("kube-root-ca.crt", labels={}))


def test_sources_must_match_kind_namespace_and_selector_and_not_be_copies() -> None:
    r = rule()
    assert d.is_source(r, cm("a"))
    assert not d.is_source(r, cm("a", labels={}))
    assert not d.is_source(r, cm("a", namespace="team-a"))
    assert not d.is_source(rule(rule_type="secret"), cm("a"))
    copy = d.desired_copy(rule(name="other", uid="other-uid"), cm("a"), "default")
    copy["metadata"]["labels"]["copyrator"] = "true"
    assert not d.is_source(r, copy)


def test_match_expressions_select_sources() -> None:
    r = rule(selector={"matchExpressions": [{"key": "env", "operator": "In",
                                             "values": ["prod", "stage"]}]})
    assert d.is_source(r, cm("a", labels={"env": "prod"}))
    assert not d.is_source(r, cm("a", labels={"env": "dev"}))


def test_first_listed_source_namespace_wins_a_name_clash() -> None:
    r = rule(namespaces=["shared", "default"])
    wanted = d.desired_copies(r, [cm("x", "default", {"v": "1"}), cm("x", "shared", {"v": "2"})],
                              [ns("shared"), ns("default"), ns("team-a")])
    assert wanted == {Slot("team-a", "x"): wanted[Slot("team-a", "x")]}
    assert wanted[Slot("team-a", "x")]["data"] == {"v": "2"}


def test_no_copy_goes_into_a_source_namespace_of_the_rule() -> None:
    """A copy there would stand in the way of that namespace's own source of the name: made
    while it was deleted, it could never be created again (found on a real cluster)."""
    r = rule(namespaces=["platform", "security"])
    wanted = d.desired_copies(r, [cm("ca", "security", {"v": "s"})],
                              [ns("platform"), ns("security"), ns("team-a")])
    assert set(wanted) == {Slot("team-a", "ca")}


def test_only_an_owner_reference_to_the_rule_makes_an_object_ours() -> None:
    r = rule()
    forged = cm("registry-config", "team-a",
                labels={"app.kubernetes.io/managed-by": "eventop",
                        "eventop.dev/copy-rule": "main-rule"})
    assert not d.owned_by(forged, r)
    ours = d.desired_copy(r, cm("registry-config"), "team-a")
    assert d.owned_by(ours, r)
    assert not d.owned_by(ours, rule(uid="recreated-rule-uid"))


def test_orphans_naming_the_rule_are_adoptable_a_bare_managed_by_label_is_not() -> None:
    r = rule()
    recorded_hand_made = cm("registry-config", "team-a",
                            labels={"app.kubernetes.io/managed-by": "eventop"})
    assert not d.adoptable(recorded_hand_made, r)
    orphan = d.desired_copy(r, cm("registry-config"), "team-a")
    del orphan["metadata"]["ownerReferences"]
    assert d.adoptable(orphan, r)
    assert not d.adoptable(orphan, rule(name="other-rule"))
    label_only = {**orphan, "metadata": {**orphan["metadata"], "annotations": {}}}
    assert not d.adoptable(label_only, r)
    # still owned by a controller (e.g. a deleted rule's copy awaiting the garbage collector)
    assert not d.adoptable(d.desired_copy(rule(uid="old-uid"), cm("registry-config"), "team-a"),
                           r)
    world = World([r, ns("default"), ns("team-a"), cm("registry-config"), orphan,
                   {**orphan, "metadata": {**orphan["metadata"], "name": "retired",
                                           "uid": "o"}}])
    world.reconcile(rules, "main-rule")
    adopted = world.get("v1/ConfigMap", "registry-config", "team-a")
    assert [o["uid"] for o in adopted["metadata"]["ownerReferences"]] == ["rule-uid"]
    assert world.get("eventop.dev/v1/CopyRule", "main-rule")["status"]["conflicts"] == 0
    assert world.get("v1/ConfigMap", "retired", "team-a") is not None  # adoption never deletes


def test_run_creates_updates_prunes_and_never_touches_unowned_objects() -> None:
    r = rule()
    stale = d.desired_copy(r, cm("registry-config", data={"mirror": "old"}), "team-b")
    hand_made = cm("registry-config", "team-c", labels={"app.kubernetes.io/managed-by": "eventop"})
    retired = d.desired_copy(r, cm("retired"), "team-a")
    not_ours = d.desired_copy(rule(name="other", uid="other-uid"), cm("retired"), "team-b")
    for i, obj in enumerate([stale, retired, not_ours]):
        obj["metadata"]["uid"] = f"u{i}"
    world = World([r, ns("default"), ns("team-a"), ns("team-b"), ns("team-c"),
                   cm("registry-config", data={"mirror": "new"}), stale, hand_made, retired,
                   not_ours])
    result = world.reconcile(rules, "main-rule")
    assert [w for w in world.writes if w[1] == "ConfigMap"] == [
        ("create", "ConfigMap", "team-a", "registry-config"),
        ("replace", "ConfigMap", "team-b", "registry-config"),
        ("delete", "ConfigMap", "team-a", "retired")]
    assert result.outcome is not None
    assert [str(c) for c in result.outcome.conflicts] == ["team-c/registry-config"]
    assert world.get("v1/ConfigMap", "registry-config", "team-b")["data"] == {"mirror": "new"}
    assert world.get("v1/ConfigMap", "registry-config", "team-c")["data"] == \
        hand_made["data"]
    assert world.get("v1/ConfigMap", "retired", "team-b") is not None


def test_run_writes_nothing_when_every_copy_is_in_sync_even_with_server_metadata() -> None:
    r = rule()
    source = cm("a")
    copy_ = d.desired_copy(r, source, "team-a")
    server_view = {**copy_, "metadata": {**copy_["metadata"], "uid": "x",
                                         "resourceVersion": "9",
                                         "managedFields": [{"manager": "eventop"}],
                                         "labels": {**copy_["metadata"]["labels"], "mine": "1"}}}
    world = World([r, ns("default"), ns("team-a"), source, server_view])
    result = world.reconcile(rules, "main-rule")
    assert [w for w in world.writes if w[1] == "ConfigMap"] == []
    assert result.outcome is not None and len(result.outcome.unchanged) == 1


def test_hand_edit_that_keeps_the_hash_annotation_is_still_detected() -> None:
    r = rule()
    want = d.desired_copy(r, cm("a"), "team-a")
    edited = {**want, "data": {"mirror": "evil"}}
    assert not d.in_sync(edited, want)


def test_immutable_copy_or_changed_secret_type_is_recreated() -> None:
    r = rule()
    old = d.desired_copy(r, cm("a", data={"v": "1"}, immutable=True), "team-a")
    new = d.desired_copy(r, cm("a", data={"v": "2"}, immutable=True), "team-a")
    assert d.needs_recreate(old, new)
    assert not d.needs_recreate(old, old)
    rs = rule(rule_type="secret")
    opaque = d.desired_copy(rs, secret("s", "Opaque"), "team-a")
    docker = d.desired_copy(rs, secret("s"), "team-a")
    assert d.needs_recreate(opaque, docker)
    mutable = d.desired_copy(r, cm("a", data={"v": "1"}), "team-a")
    assert not d.needs_recreate(mutable, d.desired_copy(r, cm("a", data={"v": "2"}), "team-a"))


def test_opaque_type_reads_back_equal_to_an_omitted_type() -> None:
    assert d.payload({"type": "Opaque", "data": {"a": "b"}}) == d.payload({"data": {"a": "b"}})


@pytest.mark.parametrize("name", ["a" * 63, "a" * 64, "x." * 100])
def test_long_names_become_valid_distinct_label_values(name: str) -> None:
    value = d.label_value(name)
    assert len(value) <= 63 and LABEL_VALUE.match(value)
    assert value != d.label_value(name + "b")


def test_invalid_rule_type_is_a_spec_error_that_says_what_to_fix() -> None:
    with pytest.raises(d.SpecError, match="configmap"):
        d.rule_kind(rule(rule_type="pod"))


def test_may_target_rules_out_namespaces_whatever_their_labels() -> None:
    assert not d.may_target(rule(), "kube-system")
    assert d.may_target(rule(), "team-a")
    assert d.may_target(rule(targets={"names": ["kube-system"]}), "kube-system")
    assert not d.may_target(rule(targets={"names": ["team-b"]}), "team-a")
    assert d.may_target(rule(targets={"names": ["team-b"], "selector": {}}), "team-a")
    for name in ("kube-system", "team-a", "team-b"):  # never stricter than is_target
        for r in (rule(), rule(targets={"names": ["team-b"]})):
            if d.is_target(r, ns(name)):
                assert d.may_target(r, name)


def test_an_empty_list_of_target_names_names_no_namespace_and_never_widens_the_rule() -> None:
    """``names: []`` (stored before the CRD refused it) used to read as "not given": a
    Secret rule narrowed to two namespaces went into every namespace of the cluster."""
    empty = rule(targets={"names": []})
    for name in ("team-a", "default", "kube-system"):
        assert not d.is_target(empty, ns(name))
        assert not d.may_target(empty, name)
    with_selector = rule(targets={"names": [], "selector": {"matchLabels": {"tier": "apps"}}})
    assert d.is_target(with_selector, ns("team-a", labels={"tier": "apps"}))
    assert not d.is_target(with_selector, ns("team-b"))
    assert d.is_target(rule(targets={}), ns("team-a"))  # nothing given: every namespace


def test_a_write_that_lost_a_race_is_no_error_in_the_rules_status() -> None:
    """With two router replicas a copy is sometimes changed by the other between this run's
    read and its write: the run is repeated, nothing was refused. It used to show as
    ``errors: 1`` and a ``lastError`` beside ``Ready=True`` (a reviewer's report)."""
    from eventop.engine.desired import Outcome, WriteError
    from eventop.handlers.copy_rules.controller import rule_status

    lost = WriteError("update", "ConfigMap", "app-5", "settings", "changed since it was read",
                      409, "StaleWrite")
    refused = WriteError("update", "ConfigMap", "app-6", "settings", "secrets is forbidden",
                         403, "Forbidden")
    quiet = rule_status(rule(), 1, Outcome(errors=[lost], retry=True))
    assert quiet["errors"] == 0 and "lastError" not in quiet
    loud = rule_status(rule(), 1, Outcome(errors=[lost, refused]))
    assert loud["errors"] == 1 and "forbidden" in loud["lastError"]


def test_a_copy_the_api_server_refuses_is_a_warning_event_on_the_rule(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A quota or an immutable field refusing a copy showed only in the rule's status: its
    own conflict wording had turned off the engine's WriteRefused Events too, so `kubectl
    describe copyrule` said nothing (found on a real API server)."""
    from eventop.engine import testing
    from eventop.kube import errors

    def refuse(self: Any, obj: Obj, **_: Any) -> Obj:
        raise errors.Forbidden('configmaps "registry-config" is forbidden: exceeded quota: '
                               "cmq, requested: count/configmaps=1, used: "
                               "count/configmaps=1, limited: count/configmaps=1",
                               reason="Forbidden")

    monkeypatch.setattr(testing._WorldWriter, "create", refuse)
    world = World([rule(), ns("default"), ns("team-a"), cm("registry-config")])
    world.reconcile(rules, "main-rule")
    (note,) = [n for _name, n in world.events if n.reason == "WriteRefused"]
    assert note.type == "Warning" and "exceeded quota: cmq" in note.message
    status = world.get("eventop.dev/v1/CopyRule", "main-rule")["status"]
    assert status["errors"] == 1


def test_a_namespace_named_in_the_rule_that_does_not_exist_is_named_in_its_status() -> None:
    """A typo in a source or target namespace read as "0 copies of 0 sources in sync"."""
    typo = rule(namespaces=("defualt",), targets={"names": ["team-a", "team-z"]})
    world = World([typo, ns("default"), ns("team-a"), cm("registry-config")])
    world.reconcile(rules, "main-rule")
    (ready,) = world.get("eventop.dev/v1/CopyRule", "main-rule")["status"]["conditions"]
    assert ready["status"] == "True"
    assert ready["message"].endswith(
        "namespace(s) named in the spec do not exist: defualt, team-z")
    world = World([rule(), ns("default"), ns("team-a"), cm("registry-config")])
    world.reconcile(rules, "main-rule")
    (ready,) = world.get("eventop.dev/v1/CopyRule", "main-rule")["status"]["conditions"]
    assert ready["message"] == "1 copies of 1 sources in sync"


def test_a_conflict_with_another_rules_copy_says_to_narrow_a_rule_not_to_delete_it() -> None:
    """Deleting the other rule's copy, as the Warning advised, only started a race between
    the two rules (a reviewer's report)."""
    first, second = rule("first", uid="first-uid"), rule("second", uid="second-uid")
    world = World([first, second, ns("default"), ns("team-a"), cm("registry-config")])
    world.reconcile(rules, "first")
    world.reconcile(rules, "second")
    (note,) = [n for name, n in world.events if n.reason == "CopyConflict"]
    assert note.message.startswith("ConfigMap team-a/registry-config is a copy made by "
                                   "CopyRule first, which copies a source of that name")
    assert "Narrow one of the two rules" in note.message
    world = World([first, ns("default"), ns("team-a"), cm("registry-config"),
                   cm("registry-config", namespace="team-a", labels={})])
    world.reconcile(rules, "first")
    (note,) = [n for name, n in world.events if n.reason == "CopyConflict"]
    assert "Delete or rename it" in note.message


def test_a_namespace_created_runs_the_rules_that_read_sources_there() -> None:
    """A rule naming a source namespace not there yet said so in its status, and creating
    it ran nothing (not a target), leaving the message stale (a reviewer's finding)."""
    from eventop.handlers.copy_rules.controller import rules_of_namespace

    reader = rule("reader", namespaces=("shared",), targets={"names": ["team-a"]})
    other = rule("other", namespaces=("default",), targets={"names": ["team-a"]})

    class Rules:
        def list(self, kind: Any, *args: Any, **kwargs: Any) -> list[Obj]:
            return [reader, other]

    mapped = rules_of_namespace(ns("shared"), Rules())  # type: ignore[arg-type]
    assert [r["metadata"]["name"] for r in mapped] == ["reader"]


def ready_of(world: World, name: str) -> Obj:
    status = world.get("eventop.dev/v1/CopyRule", name)["status"]
    [ready] = [c for c in status["conditions"] if c["type"] == "Ready"]
    return ready


def test_ready_says_to_narrow_a_rule_when_the_slot_is_another_rules_copy() -> None:
    """The Warning said to narrow a rule, the condition to delete the copy: deleting it
    only handed the slot to the other rule, and this one stayed not Ready (a user's trial)."""
    first, second = rule("first", uid="first-uid"), rule("second", uid="second-uid")
    world = World([first, second, ns("default"), ns("team-a"), cm("registry-config"),
                   ns("team-b"), cm("registry-config", namespace="team-b", labels={})])
    world.reconcile(rules, "first")
    world.reconcile(rules, "second")
    ready = ready_of(world, "second")
    assert (ready["status"], ready["reason"]) == ("False", "Conflicts")
    assert ready["message"] == (
        "1 target objects exist and are not managed by this rule (left unchanged): "
        "team-b/registry-config. Delete or rename them to let the rule create its copies; "
        "1 target objects are copies made by CopyRule first, which copies a source of the "
        "same name there (left unchanged): team-a/registry-config. Narrow one of the rules "
        "(its selector or targetNamespaces) so that only one copies each.")


def test_what_in_the_spec_copies_nothing_is_said_whatever_else_ready_says() -> None:
    """A namespace named that does not exist was said only while the rule was in sync (a
    conflict's message hid it); a target name that is a source namespace, never."""
    spec_targets = {"names": ["default", "ghost-ns", "team-a"]}
    world = World([rule(targets=spec_targets), ns("default"), ns("team-a"),
                   cm("registry-config"), cm("registry-config", namespace="team-a", labels={})])
    world.reconcile(rules, "main-rule")
    message = ready_of(world, "main-rule")["message"]
    assert message.startswith("1 target objects exist and are not managed by this rule")
    assert message.endswith(
        "; namespace(s) named in the spec do not exist: ghost-ns; targetNamespaces.names "
        "names the source namespace(s) default: no copy goes into a source namespace")


def test_an_empty_list_of_target_names_is_said_in_ready() -> None:
    """The CRD accepts ``names: []`` (stored rules must stay writable), so the rule says
    what it means: no target at all."""
    world = World([rule(targets={"names": []}), ns("default"), ns("team-a"),
                   cm("registry-config")])
    world.reconcile(rules, "main-rule")
    assert world.get("v1/ConfigMap", "registry-config", "team-a") is None
    assert ready_of(world, "main-rule")["message"].endswith(
        "; targetNamespaces.names is empty, which names no namespace: omit it for the default "
        "targets")


def test_a_rule_with_no_source_says_what_it_looks_for() -> None:
    world = World([rule(namespaces=("platform",)), ns("platform"), ns("team-a")])
    world.reconcile(rules, "main-rule")
    ready = ready_of(world, "main-rule")
    assert (ready["status"], ready["reason"]) == ("True", "Synced")
    assert ready["message"] == ("no source: no ConfigMap in platform matches the selector, "
                                "so there is nothing to copy")


def test_copies_deleted_because_their_source_went_are_one_normal_event() -> None:
    """Deleting a source removed its copies from every namespace at once, without a word."""
    world = World([rule(), ns("default"), ns("team-a"), ns("team-b"), cm("registry-config")])
    world.reconcile(rules, "main-rule")
    world.delete("v1/ConfigMap", "registry-config", "default")
    world.events.clear()
    world.reconcile(rules, "main-rule")
    assert world.get("v1/ConfigMap", "registry-config", "team-a") is None
    [note] = [n for _, n in world.events if n.reason == "CopiesDeleted"]
    assert note.type == "Normal"
    assert note.message == (
        "deleted 2 ConfigMap(s) no longer wanted (their source is gone or no longer selected, "
        "or their namespace is no longer a target): team-a/registry-config, "
        "team-b/registry-config")


def test_a_copy_deleted_because_its_namespace_became_a_source_namespace_says_so() -> None:
    """A copy in a namespace that is (now) one of the rule's source namespaces is deleted:
    the Event named only a source gone or a target dropped, neither of which had happened
    (an upgrade trial: a copy an earlier version had made there)."""
    world = World([rule(), ns("default"), ns("platform"), cm("registry-config")])
    world.reconcile(rules, "main-rule")
    assert world.get("v1/ConfigMap", "registry-config", "platform") is not None
    world.put(rule(namespaces=("default", "platform")))
    world.events.clear()
    world.reconcile(rules, "main-rule")
    assert world.get("v1/ConfigMap", "registry-config", "platform") is None
    [note] = [n for _, n in world.events if n.reason == "CopiesDeleted"]
    assert note.message == (
        "deleted 1 ConfigMap(s) no longer wanted (their source is gone or no longer selected, "
        "or their namespace is no longer a target; platform is a source namespace of this "
        "rule, and a source namespace gets no copies): platform/registry-config")


def test_copies_deleted_by_a_rule_type_change_are_named_by_their_own_kind() -> None:
    """After configmap -> secret the Event said Secrets were deleted, about ConfigMaps (a
    reviewer's finding)."""
    world = World([rule(), ns("default"), ns("team-a"), cm("registry-config")])
    world.reconcile(rules, "main-rule")
    world.put(rule(rule_type="secret"))
    world.events.clear()
    world.reconcile(rules, "main-rule")
    [note] = [n for _, n in world.events if n.reason == "CopiesDeleted"]
    assert note.message == ("deleted 1 ConfigMap(s) no longer wanted (the rule's ruleType "
                            "changed): team-a/registry-config")


def test_a_copy_in_a_namespace_the_cache_does_not_hold_yet_is_not_pruned() -> None:
    """Two replicas: one made a copy in a namespace created a moment ago; the other's
    Namespace cache did not hold it yet while its ConfigMap cache held the copy, and it
    deleted the copy, made again 0.1 s later (a user's trial, 2 bursts of 3)."""
    import copy as copying

    world = World([rule(), ns("default"), ns("team-a"), cm("registry-config")])
    world.reconcile(rules, "main-rule")
    made = copying.deepcopy(world.get("v1/ConfigMap", "registry-config", "team-a"))
    made["metadata"]["namespace"] = "team-new"
    for volatile in ("uid", "resourceVersion"):
        made["metadata"].pop(volatile, None)
    world.put(made)  # the other replica's copy; no Namespace team-new in this cache yet
    world.reconcile(rules, "main-rule")
    assert world.get("v1/ConfigMap", "registry-config", "team-new") is not None
    # once the namespace is known and not a target, the copy goes as any other
    world.put(ns("team-new"))
    world.put(rule(targets={"names": ["team-a"]}))
    world.reconcile(rules, "main-rule")
    assert world.get("v1/ConfigMap", "registry-config", "team-new") is None


def test_copies_deleted_are_said_even_when_another_replica_wrote_the_status_first() -> None:
    """Two replicas: the one whose deletes found the copies gone wrote the new status; the
    one whose deletes did it found the status unchanged, and notes ride on a status change:
    961 copies deleted, Events for 1 rule of 3 (a user's trial)."""
    import copy as copying

    def world_after_source_deleted() -> World:
        world = World([rule(), ns("default"), ns("team-a"), cm("registry-config")])
        world.reconcile(rules, "main-rule")
        world.delete("v1/ConfigMap", "registry-config", "default")
        return world

    first = world_after_source_deleted()
    first.reconcile(rules, "main-rule")  # the other replica: its status is the new one
    second = world_after_source_deleted()
    done = copying.deepcopy(second.get("eventop.dev/v1/CopyRule", "main-rule"))
    done["status"] = first.get("eventop.dev/v1/CopyRule", "main-rule")["status"]
    second.put(done)
    second.events.clear()
    second.reconcile(rules, "main-rule")
    assert second.get("v1/ConfigMap", "registry-config", "team-a") is None
    assert [n.reason for _, n in second.events] == ["CopiesDeleted"]
