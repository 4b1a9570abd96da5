"""CopyRule behaviour against the local API server, events dispatched to the handlers."""

from __future__ import annotations

import base64
import logging
from collections.abc import Iterator
from typing import Any

import pytest

from eventop.engine import Key
from eventop.events import REF_PREFIX, kube_extensions
from eventop.handlers.copy_rules import desired
from eventop.handlers.events import Event
from tests.copy_rules.support import (
    Harness,
    config_map,
    copy_rule,
    deliver,
    namespace,
    secret,
    start_engine,
)

Obj = dict[str, Any]
COPYRATOR = {"copyrator": "true"}


@pytest.fixture
def h(local_kube: Any, kube: Any) -> Iterator[Harness]:
    with Harness(local_kube, kube) as harness:
        for name in ("team-a", "team-b"):
            harness.world_put(namespace(name))
        harness.world_put(config_map("default", "registry-config", {"mirror": "m:5000"},
                                     COPYRATOR))
        harness.world_put(copy_rule("main-rule"))
        harness.settle()
        yield harness


def data_of(h: Harness, kind: str = "ConfigMap") -> dict[str, Obj]:
    return {k: o.get("data") or {} for k, o in h.copies(kind).items()}


def writes(local_kube: Any, since: int) -> list[tuple[str, str]]:
    return [(r[0], r[1]) for r in local_kube.requests[since:] if r[0] not in ("GET",)]


def reads(local_kube: Any, since: int) -> list[tuple[str, str, str]]:
    """GETs other than the cache's own watches (its lists happen once, at start)."""
    return [(r[0], r[1], r[2]) for r in local_kube.requests[since:]
            if r[0] == "GET" and "watch=true" not in r[2]]


def test_rule_copies_matching_sources_into_every_active_namespace(h: Harness) -> None:
    assert data_of(h) == {"team-a/registry-config": {"mirror": "m:5000"},
                          "team-b/registry-config": {"mirror": "m:5000"}}
    copy_ = h.copies()["team-a/registry-config"]
    assert copy_["metadata"]["labels"]["eventop.dev/copy-rule"] == "main-rule"
    assert copy_["metadata"]["annotations"]["eventop.dev/source"] == "default/registry-config"
    assert copy_["metadata"]["ownerReferences"][0]["uid"] == h.rule("main-rule")["metadata"]["uid"]
    status = h.rule("main-rule")["status"]
    assert status["sources"] == 1 and status["copies"] == 2 and status["conflicts"] == 0
    assert status["observedGeneration"] == 1
    ready = {c["type"]: c for c in status["conditions"]}["Ready"]
    assert ready["status"] == "True" and ready["reason"] == "Synced"


def test_new_namespace_receives_copies_and_terminating_ones_are_skipped(h: Harness) -> None:
    h.world_put(namespace("team-c"))
    h.settle()
    assert data_of(h)["team-c/registry-config"] == {"mirror": "m:5000"}
    assert h.rule("main-rule")["status"]["copies"] == 3


def test_source_change_updates_every_copy_and_source_delete_removes_them(h: Harness) -> None:
    h.world_put(config_map("default", "registry-config", {"mirror": "m:5001"}, COPYRATOR))
    h.settle()
    assert set(map(str, (d["mirror"] for d in data_of(h).values()))) == {"m:5001"}
    h.world_remove("v1", "ConfigMap", "registry-config", "default")
    h.settle()
    assert data_of(h) == {}
    assert h.rule("main-rule")["status"]["sources"] == 0


def test_source_that_loses_its_label_is_no_longer_copied(h: Harness) -> None:
    h.world_put(config_map("default", "registry-config", {"mirror": "m:5000"}, {}))
    h.settle()
    assert data_of(h) == {}


def test_copy_edited_or_deleted_by_hand_is_restored(h: Harness) -> None:
    edited = h.copies()["team-a/registry-config"]
    edited["data"] = {"mirror": "evil:1", "extra": "added by hand"}
    h.world_put(edited)
    h.world_remove("v1", "ConfigMap", "registry-config", "team-b")
    h.settle()
    assert data_of(h) == {"team-a/registry-config": {"mirror": "m:5000"},
                          "team-b/registry-config": {"mirror": "m:5000"}}


def test_unmanaged_object_is_left_alone_reported_and_replaced_only_once_gone(
        h: Harness, local_kube: Any) -> None:
    h.world_put(namespace("team-c"))
    mine = config_map("team-c", "registry-config", {"mirror": "mine"},
                      {"app.kubernetes.io/managed-by": "eventop"})  # forged: no owner reference
    h.world_put(mine)
    h.settle()
    assert local_kube.get("v1", "ConfigMap", "registry-config", "team-c")["data"] == \
        {"mirror": "mine"}
    status = h.rule("main-rule")["status"]
    assert status["conflicts"] == 1 and status["conflictList"] == ["team-c/registry-config"]
    ready = {c["type"]: c for c in status["conditions"]}["Ready"]
    assert ready["status"] == "False" and ready["reason"] == "Conflicts"
    warnings = [e for e in local_kube.list("v1", "Event")
                if e["reason"] == "CopyConflict" and e["involvedObject"]["name"] == "main-rule"]
    assert len(warnings) == 1 and "team-c/registry-config" in warnings[0]["message"]
    # a later resync neither touches the object nor posts the Warning again
    h.dispatch("update", h.rule("main-rule"))
    assert local_kube.get("v1", "ConfigMap", "registry-config", "team-c")["data"] == \
        {"mirror": "mine"}
    assert [e["count"] for e in local_kube.list("v1", "Event")
            if e["reason"] == "CopyConflict"] == [1]
    h.world_remove("v1", "ConfigMap", "registry-config", "team-c")
    h.settle()
    assert data_of(h)["team-c/registry-config"] == {"mirror": "m:5000"}
    assert h.rule("main-rule")["status"]["conflicts"] == 0


def test_copy_taken_over_by_removing_its_rule_label_belongs_to_the_user(h: Harness) -> None:
    taken = h.copies()["team-a/registry-config"]
    del taken["metadata"]["ownerReferences"]
    del taken["metadata"]["labels"]["eventop.dev/copy-rule"]
    taken["data"] = {"mirror": "team-a's own"}
    h.world_put(taken)
    h.settle()
    assert h.objects()["team-a/registry-config"]["data"] == {"mirror": "team-a's own"}
    assert h.rule("main-rule")["status"]["conflictList"] == ["team-a/registry-config"]


def test_copy_with_only_its_owner_reference_stripped_is_adopted_again(h: Harness) -> None:
    stripped = h.copies()["team-a/registry-config"]
    del stripped["metadata"]["ownerReferences"]
    stripped["data"] = {"mirror": "edited"}
    h.world_put(stripped)
    h.settle()
    copy_ = h.objects()["team-a/registry-config"]
    assert copy_["data"] == {"mirror": "m:5000"}
    assert [r["name"] for r in copy_["metadata"]["ownerReferences"]] == ["main-rule"]


def test_copies_orphaned_with_the_rule_are_adopted_when_it_is_applied_again(
        h: Harness, kube: Any) -> None:
    kube.delete(desired.API_VERSION, desired.KIND, "main-rule", propagation="Orphan")
    h.settle()
    orphans = h.objects()
    assert {k for k, o in orphans.items() if o["metadata"]["name"] == "registry-config"} == \
        {"default/registry-config", "team-a/registry-config", "team-b/registry-config"}
    assert not orphans["team-a/registry-config"]["metadata"].get("ownerReferences")
    h.world_put(copy_rule("main-rule"))
    h.settle()
    new_uid = h.rule("main-rule")["metadata"]["uid"]
    for key in ("team-a/registry-config", "team-b/registry-config"):
        assert [r["uid"] for r in h.objects()[key]["metadata"]["ownerReferences"]] == [new_uid]
    status = h.rule("main-rule")["status"]
    assert (status["copies"], status["conflicts"]) == (2, 0)


def test_immutable_copies_orphaned_with_the_rule_are_made_again_when_their_source_changed(
        h: Harness, kube: Any) -> None:
    """An orphaned immutable copy of a source made again with other data can not be adopted
    by an update (the API server refuses it: field is immutable). The rule applied again
    used to retry that update forever, the copies keeping the old data and no owner; they
    are made again, as an owned copy would be (found on a real API server)."""
    source = config_map("default", "registry-config", {"mirror": "m:5000"}, COPYRATOR)
    h.world_put({**source, "immutable": True})
    h.settle()
    kube.delete(desired.API_VERSION, desired.KIND, "main-rule", propagation="Orphan")
    h.settle()
    h.world_remove("v1", "ConfigMap", "registry-config", "default")
    h.world_put({**source, "immutable": True, "data": {"mirror": "m:5001"}})
    h.world_put(copy_rule("main-rule"))
    h.settle()
    new_uid = h.rule("main-rule")["metadata"]["uid"]
    for key in ("team-a/registry-config", "team-b/registry-config"):
        copy_ = h.objects()[key]
        assert copy_["data"] == {"mirror": "m:5001"} and copy_.get("immutable") is True
        assert [r["uid"] for r in copy_["metadata"]["ownerReferences"]] == [new_uid]
    status = h.rule("main-rule")["status"]
    assert (status["copies"], status["conflicts"], status.get("errors", 0)) == (2, 0, 0)


def test_namespace_relabelled_out_of_the_targets_loses_its_copies(h: Harness) -> None:
    h.world_put(copy_rule("main-rule", targets={"selector": {"matchLabels": {"tier": "apps"}}}))
    h.settle()
    assert data_of(h) == {}
    h.world_put(namespace("team-a", {"tier": "apps"}))
    h.settle()
    assert set(data_of(h)) == {"team-a/registry-config"}
    h.world_put(namespace("team-a", {"tier": "batch"}))
    h.settle()
    assert data_of(h) == {}


def test_deleting_the_rule_garbage_collects_its_copies(h: Harness) -> None:
    h.world_remove(desired.API_VERSION, desired.KIND, "main-rule")
    h.settle()
    assert data_of(h) == {}
    assert "registry-config" in {o["metadata"]["name"]
                                 for o in h.local_kube.list("v1", "ConfigMap", "default")}


def test_secrets_keep_their_type_tokens_are_never_copied_and_contents_never_logged(
        h: Harness, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    token = base64.b64encode(b"s3cret-value").decode()
    h.world_put(secret("default", "regcred", {".dockerconfigjson": token}, COPYRATOR,
                       "kubernetes.io/dockerconfigjson"))
    h.world_put(secret("default", "builder-token", {"token": token}, COPYRATOR,
                       "kubernetes.io/service-account-token"))
    h.world_put(copy_rule("registry-credentials", "secret"))
    h.settle()
    copies = h.copies("Secret")
    assert set(copies) == {"team-a/regcred", "team-b/regcred"}
    assert {c["type"] for c in copies.values()} == {"kubernetes.io/dockerconfigjson"}
    assert {c["data"][".dockerconfigjson"] for c in copies.values()} == {token}
    assert token not in caplog.text and "s3cret" not in caplog.text
    content_hash = copies["team-a/regcred"]["metadata"]["annotations"]["eventop.dev/content-hash"]
    assert content_hash[:8] not in caplog.text
    assert "created Secret team-a/regcred from default/regcred" in caplog.text


def test_secret_contents_come_from_the_api_server_not_the_event(h: Harness) -> None:
    real = base64.b64encode(b"real").decode()
    h.world_put(secret("default", "regcred", {"k": real}, COPYRATOR))
    h.world_put(copy_rule("registry-credentials", "secret"))
    h.settle()
    forged = secret("default", "regcred", {"k": base64.b64encode(b"forged").decode()}, COPYRATOR)
    h.dispatch("update", forged)
    assert {c["data"]["k"] for c in h.copies("Secret").values()} == {real}


#: What a Reference-mode event of the Secret below carries: its name, not its data.
REGCRED_REF = {"apiVersion": "v1", "kind": "Secret", "name": "regcred", "namespace": "default"}


def secret_source_changed(h: Harness) -> Obj:
    """A Secret source copied by a rule, then changed (v1 -> v2) with the watcher's own
    event of the change left undelivered: what a test delivers instead decides."""
    h.world_put(secret("default", "regcred", {"k": base64.b64encode(b"v1").decode()},
                       COPYRATOR))
    h.world_put(copy_rule("registry-credentials", "secret"))
    h.settle()
    changed = h.world_put(secret("default", "regcred", {"k": base64.b64encode(b"v2").decode()},
                                 COPYRATOR))
    h.changes()
    return changed


def test_a_reference_mode_secret_event_names_the_source_and_its_copies_follow(
        h: Harness) -> None:
    """Knative mode sends Secrets in Reference mode (their data never crosses the Broker):
    the event names the Secret only, and the run reads it from the API server's side."""
    changed = secret_source_changed(h)
    outcomes = h.deliver(Event(id="s1", type=REF_PREFIX + "update", source="test",
                               data=REGCRED_REF, extensions=kube_extensions(changed)))
    assert outcomes and all(o.ok for o in outcomes)
    copies = h.copies("Secret")
    assert set(copies) == {"team-a/regcred", "team-b/regcred"}
    assert {c["data"]["k"] for c in copies.values()} == {base64.b64encode(b"v2").decode()}


def test_a_late_reference_mode_delete_of_a_source_made_again_is_one_lookup_not_a_wait(
        h: Harness, local_kube: Any) -> None:
    """Knative delivers out of order: the delete of a Secret deleted and made again at once
    may come after it. Its name is there: the router waited the whole cache wait for its
    cache to drop it (10 s of a request slot, a Knative user's trial), then looked again."""
    again = secret_source_changed(h)
    start = len(local_kube.requests)
    h.deliver(Event(id="late-delete", type=REF_PREFIX + "delete", source="test",
                    data=REGCRED_REF, extensions=kube_extensions(again)))
    lookups = [r for r in reads(local_kube, start) if r[1].endswith("/secrets")]
    assert len(lookups) == 1, lookups  # the list by name a Reference-mode event costs
    assert {c["data"]["k"] for c in h.copies("Secret").values()} == {
        base64.b64encode(b"v2").decode()}


def test_immutable_copy_is_recreated_when_its_source_is_replaced(h: Harness) -> None:
    h.world_put(config_map("default", "frozen", {"v": "1"}, COPYRATOR, immutable=True))
    h.settle()
    old_uid = h.copies()["team-a/frozen"]["metadata"]["uid"]
    h.world_remove("v1", "ConfigMap", "frozen", "default")
    h.world_put(config_map("default", "frozen", {"v": "2"}, COPYRATOR, immutable=True))
    h.settle()
    copy_ = h.copies()["team-a/frozen"]
    assert copy_["data"] == {"v": "2"} and copy_["immutable"] is True
    assert copy_["metadata"]["uid"] != old_uid


def test_resync_with_nothing_changed_writes_nothing(h: Harness, local_kube: Any) -> None:
    before = h.versions()
    start = len(local_kube.requests)
    h.dispatch("update", h.rule("main-rule"))
    for obj in h.snapshot().values():
        h.dispatch("update", obj)
    assert writes(local_kube, start) == []
    assert h.versions() == before


def test_reference_mode_events_reconcile_too(h: Harness) -> None:
    ns = h.world_put(namespace("team-c"))
    h.changes()  # the watcher's own event for it is not delivered: only the reference below
    ref = {"apiVersion": "v1", "kind": "Namespace", "name": "team-c",
           "uid": ns["metadata"]["uid"]}
    h.deliver(Event(id="r1", type=REF_PREFIX + "add", source="test", data=ref,
                    extensions=kube_extensions(ns)))
    assert "team-c/registry-config" in h.copies()


def test_two_source_namespaces_first_listed_wins_and_rule_change_prunes(h: Harness) -> None:
    h.world_put(namespace("shared"))
    h.world_put(config_map("shared", "registry-config", {"mirror": "shared"}, COPYRATOR))
    h.world_put(copy_rule("main-rule", namespaces=["shared", "default"]))
    h.settle()
    assert data_of(h)["team-a/registry-config"] == {"mirror": "shared"}
    # default's own registry-config is a source of the rule: no copy is wanted there
    assert h.objects()["default/registry-config"]["data"] == {"mirror": "m:5000"}
    assert h.rule("main-rule")["status"]["conflictList"] == []
    h.world_put(copy_rule("main-rule", namespaces=["default"], targets={"names": ["team-b"]}))
    h.settle()
    assert data_of(h) == {"team-b/registry-config": {"mirror": "m:5000"}}


def test_status_is_written_only_when_it_changes(h: Harness) -> None:
    version = h.rule("main-rule")["metadata"]["resourceVersion"]
    h.dispatch("update", h.rule("main-rule"))
    h.dispatch("add", namespace("team-a"))
    assert h.rule("main-rule")["metadata"]["resourceVersion"] == version


def _served(local_kube: Any, since: int) -> list[tuple[str, str, str]]:
    return [(r[0], r[1], r[2]) for r in local_kube.requests[since:]]


def test_source_event_writes_once_per_target_and_reads_nothing(
        h: Harness, local_kube: Any) -> None:
    for i in range(20):
        h.world_put(namespace(f"fan-{i:02d}"))
    h.settle()
    source = h.world_put(config_map("default", "fan-out", {"k": "v"}, COPYRATOR))
    start = len(local_kube.requests)
    h.dispatch("add", source)
    served = _served(local_kube, start)
    copy_writes = [r for r in served if r[0] == "POST" and r[1].endswith("/configmaps")]
    assert len(copy_writes) == 22  # team-a, team-b and fan-00..19: one create each
    assert len({r[1] for r in copy_writes}) == 22
    assert reads(local_kube, start) == []  # sources and namespaces come from the cache
    assert not [r for r in served if r[0] in ("PUT", "DELETE")]
    assert not [r for r in served if r[0] == "PATCH" and "/configmaps/" in r[1]]


def test_namespace_event_reads_nothing_and_writes_only_that_namespace(
        h: Harness, local_kube: Any) -> None:
    ns = h.world_put(namespace("team-c"))
    start = len(local_kube.requests)
    h.dispatch("add", ns)
    assert reads(local_kube, start) == []
    assert [w for w in writes(local_kube, start) if "/configmaps" in w[1]] == [
        ("POST", "/api/v1/namespaces/team-c/configmaps")]
    assert "team-c/registry-config" in h.copies()


def test_two_replicas_handling_the_same_events_at_once_converge(h: Harness) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from eventop.kube import Kube

    for i in range(6):
        h.world_put(namespace(f"par-{i}"))
    source = h.world_put(config_map("default", "registry-config", {"mirror": "m:6000"},
                                    COPYRATOR))
    replicas = [start_engine(Kube.connect(url=h.local_kube.url)) for _ in range(2)]
    events = [Event.for_object("update", source), Event.for_object("update", h.rule("main-rule"))]

    def run(engine: Any) -> list[bool]:
        return [o.ok for e in events for o in deliver(engine, e)]

    try:
        with ThreadPoolExecutor(2) as pool:
            results = list(pool.map(run, replicas))
    finally:
        for engine in replicas:
            engine.stop()
    assert all(all(r) for r in results), results
    h.settle()
    assert {d["mirror"] for d in data_of(h).values()} == {"m:6000"}
    assert len(data_of(h)) == 8
    assert h.rule("main-rule")["status"]["copies"] == 8


def test_kube_system_chatter_costs_no_request_and_no_run(h: Harness, local_kube: Any) -> None:
    lease = h.world_put(config_map("kube-system", "leader-election", {"holder": "a"}))
    start, runs = len(local_kube.requests), h.engine.queue.started
    assert h.dispatch("update", lease) == []
    assert [r for r in _served(local_kube, start) if "watch=true" not in r[2]] == []
    assert h.engine.queue.started == runs


def test_copy_deleted_by_hand_where_no_longer_wanted_is_recounted(h: Harness) -> None:
    h.world_put(copy_rule("main-rule", targets={"selector": {"matchLabels": {"tier": "apps"}}}))
    h.world_put(namespace("team-a", {"tier": "apps"}))
    h.settle()
    assert h.rule("main-rule")["status"]["copies"] == 1
    # relabel and delete at once: the namespace event finds nothing of ours left to delete
    h.world_put(namespace("team-a", {"tier": "batch"}))
    h.world_remove("v1", "ConfigMap", "registry-config", "team-a")
    h.settle()
    assert data_of(h) == {}
    assert h.rule("main-rule")["status"]["copies"] == 0


def test_object_created_at_a_copys_name_after_the_read_is_never_merged_into(
        h: Harness, local_kube: Any, kube: Any) -> None:
    """Server-side apply without force conflicts only on fields another manager owns with a
    different value: an object with no field in common with the copy would be merged into,
    gaining the rule's ownerReference (and so be deleted with the rule). A copy is therefore
    created with POST, which fails when anything already sits at the name."""
    from eventop.engine.apiserver import Echoes, KubeWriter
    from eventop.engine.reads import Reads
    from eventop.engine.run import run
    from eventop.kube.store import Store

    h.world_put(namespace("team-c"))
    rule = h.rule("main-rule")
    # The run reads a cache taken before someone else's write: team-c has no ConfigMap yet.
    frozen: dict[tuple[str, str], Store] = {}
    for api_version, kind in (("v1", "Namespace"), ("v1", "ConfigMap"), ("v1", "Secret")):
        frozen[(api_version, kind)] = store = Store(api_version, kind)
        store.replace_all(local_kube.list(api_version, kind), "")
    theirs = h.world_put(config_map("team-c", "registry-config", {"unrelated": "value"}))
    ctl = h.registry.controllers[0]
    writer = KubeWriter(kube.for_manager(ctl.field_manager), h.engine.cache, Echoes())

    result = run(ctl, Key("", "main-rule"), rule,
                 Reads(lambda av, k: frozen.get((av, k)), ctl.kinds(), ctl.name, rule), writer)

    after = local_kube.get("v1", "ConfigMap", "registry-config", "team-c")
    assert after["data"] == {"unrelated": "value"}
    assert not after["metadata"].get("ownerReferences")
    assert after["metadata"]["uid"] == theirs["metadata"]["uid"]
    assert result.outcome is not None and result.outcome.created == []
    assert [str(c) for c in result.outcome.conflicts] == ["team-c/registry-config"]
    assert h.rule("main-rule")["status"]["conflictList"] == ["team-c/registry-config"]


def test_key_removed_from_the_source_is_removed_from_every_copy(h: Harness) -> None:
    """The create owns the copy's first keys (operation Update), which a later apply alone can
    not remove: the replace fallback must."""
    h.world_put(config_map("default", "two-keys", {"keep": "1", "drop": "2"}, COPYRATOR))
    h.settle()
    assert data_of(h)["team-a/two-keys"] == {"keep": "1", "drop": "2"}
    h.world_put(config_map("default", "two-keys", {"keep": "1"}, COPYRATOR))
    h.settle()
    assert data_of(h)["team-a/two-keys"] == {"keep": "1"}
    assert data_of(h)["team-b/two-keys"] == {"keep": "1"}


@pytest.mark.parametrize(("field", "selector", "says"), [
    ("selector", {"matchLabels": {"bad key!": "v"}}, "'bad key!' is not a label key"),
    ("selector", {"matchLabels": {"copyrator": "v@lue"}}, "'v@lue' (key 'copyrator') is not"),
    ("targetNamespaces", {"selector": {"matchExpressions": [
        {"key": "team", "operator": "In", "values": []}]}},
     "spec.targetNamespaces.selector: operator In on key 'team' needs at least one value"),
])
def test_a_selector_no_label_can_match_is_an_invalid_spec_with_one_warning(
        h: Harness, field: str, selector: dict[str, Any], says: str) -> None:
    bad = copy_rule("bad-rule")
    bad["spec"][field] = selector
    h.world_put(bad)
    h.settle()
    h.resync()
    h.settle()
    ready = next(c for c in h.rule("bad-rule")["status"]["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "InvalidSpec")
    assert says in ready["message"]
    warnings = [e for e in h.local_kube.list("v1", "Event")
                if e["involvedObject"]["name"] == "bad-rule" and e["reason"] == "InvalidSpec"]
    assert len(warnings) == 1 and warnings[0]["type"] == "Warning"
    assert warnings[0].get("count", 1) == 1  # not again at the resync
    assert says in warnings[0]["message"]


def test_rule_whose_selector_the_api_server_refuses_reports_invalid_spec(h: Harness) -> None:
    """``In`` with no values passes the CRD schema but not the API server's selector parser:
    the rule says so in its status, makes no copy, and the other rules still converge."""
    bad = copy_rule("bad-rule")
    bad["spec"]["selector"] = {"matchExpressions": [
        {"key": "copyrator", "operator": "In", "values": []}]}
    h.world_put(bad)
    h.settle()
    status = h.rule("bad-rule")["status"]
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "InvalidSpec")
    assert "spec.selector" in status["lastError"]
    assert {o["metadata"]["annotations"][desired.RULE_ANNOTATION]
            for o in h.copies().values()} == {"main-rule"}
    assert h.rule("main-rule")["status"]["copies"] == 2


def test_copies_taken_by_their_namespaces_deletion_cost_no_lookup_of_their_rule() -> None:
    """A copy deleted by hand is restored only once the API server says its rule is still
    there (it may be going); a copy deleted with its namespace can not be restored, and the
    lookup was one LIST per copy and rule (15 namespaces, 3 rules: 45, a user's trial)."""
    from eventop.kube import Kube
    from eventop.localkube import LocalKube
    from eventop.testing.waiting import wait_until
    from tests.support.apiserver import CRDS

    # the namespace controller a moment after the deletion, as on a real cluster
    with LocalKube(crd_dir=str(CRDS), namespace_delay=0.3) as server, \
            Harness(server, Kube.connect(url=server.url)) as h:
        for name in ("team-a", "team-b"):
            h.world_put(namespace(name))
        h.world_put(config_map("default", "registry-config", {"mirror": "m:5000"}, COPYRATOR))
        h.world_put(copy_rule("main-rule"))
        h.settle()
        assert set(h.copies()) == {"team-a/registry-config", "team-b/registry-config"}
        start = len(server.requests)
        server.remove("v1", "Namespace", "team-a")
        h.settle()
        assert wait_until(lambda: server.get("v1", "Namespace", "team-a") is None, 10)
        h.settle()
        assert set(h.copies()) == {"team-b/registry-config"}
        lookups = [r for r in reads(server, start) if "copyrules" in r[1]]
        assert lookups == []
        h.world_remove("v1", "ConfigMap", "registry-config", "team-b")  # by hand: verified
        start = len(server.requests)
        h.settle()
        assert "team-b/registry-config" in h.copies()
        assert [r for r in reads(server, start) if "copyrules" in r[1]] != []
