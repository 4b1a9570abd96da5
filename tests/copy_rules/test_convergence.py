"""Convergence property: whatever happens to namespaces, sources, rules and copies, once the
events are delivered the cluster holds exactly what a simple model of the rules asks for;
objects eventop does not own are never changed; once a resync has passed, delivering every
event again changes nothing.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eventop.handlers.copy_rules import desired
from tests.copy_rules.support import Harness, config_map, copy_rule, namespace, secret

REPO = Path(__file__).resolve().parents[2]
Obj = dict[str, Any]
TEAMS = ("t1", "t2", "t3")
SA_TOKEN = "kubernetes.io/service-account-token"

# r1: the Copyrator rule. r2: two source namespaces (shared first), into tier=apps only.
# r3: Secrets into two named namespaces. Their source names are disjoint (a/b, x/y, s) so the
# model needs no rule-vs-rule tie break.
RULES = {
    "r1": copy_rule("r1", match_labels={"copy": "true"}),
    "r2": copy_rule("r2", namespaces=["shared", "default"], match_labels={"copy2": "true"},
                    targets={"selector": {"matchLabels": {"tier": "apps"}}}),
    "r3": copy_rule("r3", "secret", match_labels={"copy": "true"},
                    targets={"names": ["t1", "t2"]}),
}


def label_for(name: str) -> str:
    return "copy" if name in ("a", "b") else "copy2"


@dataclass
class Model:
    """What the world has done; the copies it implies are computed by :meth:`expected`."""
    namespaces: dict[str, str | None] = field(default_factory=dict)  # team ns -> tier label
    world: dict[tuple[str, str], Obj] = field(default_factory=dict)  # (ns, name) -> object
    secrets: dict[str, tuple[bool, str, str]] = field(default_factory=dict)  # labelled, type, v
    rules: set[str] = field(default_factory=set)

    def active(self) -> list[str]:
        return ["default", "shared", *self.namespaces]

    def expected(self) -> dict[tuple[str, str, str], Obj]:
        """(kind, ns, name) -> data of every copy the rules ask for, written independently of
        handlers.copy_rules.desired (a second, simpler statement of the rules)."""
        out: dict[tuple[str, str, str], Obj] = {}
        if "r1" in self.rules:
            for name in ("a", "b"):
                src = self.world.get(("default", name))
                if src and src["metadata"]["labels"].get("copy") == "true":
                    for ns in self.active():
                        if ns != "default" and (ns, name) not in self.world:
                            out[("ConfigMap", ns, name)] = src["data"]
        if "r2" in self.rules:
            for name in ("x", "y"):
                srcs = [self.world.get((ns, name)) for ns in ("shared", "default")]
                live = [s for s in srcs if s and s["metadata"]["labels"].get("copy2") == "true"]
                if live:
                    src = live[0]
                    for ns, tier in self.namespaces.items():
                        if tier == "apps" and (ns, name) not in self.world:
                            out[("ConfigMap", ns, name)] = src["data"]
        if "r3" in self.rules and "s" in self.secrets:
            labelled, type_, value = self.secrets["s"]
            if labelled and type_ != SA_TOKEN:
                for ns in ("t1", "t2"):
                    if ns in self.namespaces:
                        out[("Secret", ns, "s")] = {"v": value}
        return out


names = st.sampled_from(("a", "b", "x", "y"))
teams = st.sampled_from(TEAMS)
copied = st.sampled_from(("a", "x"))  # the names the seed world has copies of
values = st.sampled_from(("1", "2"))
operation = st.one_of(
    st.tuples(st.just("ns_put"), teams, st.sampled_from((None, "apps"))),
    st.tuples(st.just("ns_del"), teams),
    st.tuples(st.just("src_put"), st.sampled_from(("default", "shared")), names, st.booleans(),
              values),
    st.tuples(st.just("src_del"), st.sampled_from(("default", "shared")), names),
    st.tuples(st.just("secret_put"), st.booleans(), st.sampled_from(("Opaque", SA_TOKEN)),
              values),
    st.tuples(st.just("rule_put"), st.sampled_from(sorted(RULES))),
    st.tuples(st.just("rule_del"), st.sampled_from(sorted(RULES))),
    st.tuples(st.just("hand_make"), teams, st.sampled_from(("a", "x"))),
    st.tuples(st.just("copy_edit"), teams, copied),
    st.tuples(st.just("copy_del"), teams, copied),
    st.tuples(st.just("copy_takeover"), teams, copied),
)


# A world where every rule has work to do, so random operations start from real copies
# (from an empty cluster most short random sequences never create a rule *and* its source).
SEED: list[tuple[Any, ...]] = [
    ("ns_put", "t1", "apps"), ("ns_put", "t2", None), ("ns_put", "t3", "apps"),
    ("src_put", "default", "a", True, "1"), ("src_put", "default", "x", True, "1"),
    ("src_put", "shared", "x", True, "2"), ("secret_put", True, "Opaque", "1"),
    ("rule_put", "r1"), ("rule_put", "r2"), ("rule_put", "r3"),
]


def apply_op(h: Harness, model: Model, op: tuple[Any, ...]) -> None:
    kind = op[0]
    if kind == "ns_put":
        _, ns, tier = op
        h.world_put(namespace(ns, {"tier": tier} if tier else {}))
        model.namespaces[ns] = tier
    elif kind == "ns_del" and op[1] in model.namespaces:
        h.world_remove("v1", "Namespace", op[1])
        del model.namespaces[op[1]]
        model.world = {k: v for k, v in model.world.items() if k[0] != op[1]}
    elif kind == "src_put":
        _, ns, name, labelled, value = op
        obj = config_map(ns, name, {"v": value}, {label_for(name): "true"} if labelled else {})
        h.world_put(obj)
        model.world[(ns, name)] = obj
    elif kind == "src_del" and (op[1], op[2]) in model.world:
        h.world_remove("v1", "ConfigMap", op[2], op[1])
        del model.world[(op[1], op[2])]
    elif kind == "secret_put":
        _, labelled, type_, value = op
        existing = h.local_kube.get("v1", "Secret", "s", "default")
        if existing is not None and existing.get("type") != type_:
            h.world_remove("v1", "Secret", "s", "default")  # a Secret's type is immutable
        data = {"v": base64.b64encode(value.encode()).decode()}
        if type_ == SA_TOKEN:
            h.world_put(namespace_sa_token(data, labelled))
        else:
            h.world_put(secret("default", "s", data, {"copy": "true"} if labelled else {}))
        model.secrets["s"] = (labelled, type_, data["v"])
    elif kind == "rule_put":
        h.world_put(RULES[op[1]])
        model.rules.add(op[1])
    elif kind == "rule_del" and op[1] in model.rules:
        h.world_remove(desired.API_VERSION, desired.KIND, op[1])
        model.rules.discard(op[1])
    elif kind == "hand_make" and op[1] in model.namespaces:
        _, ns, name = op
        obj = config_map(ns, name, {"v": "hand"}, {"app.kubernetes.io/managed-by": "eventop"})
        h.world_put(obj)
        model.world[(ns, name)] = obj
    elif kind == "copy_takeover":  # the user strips label and ownerReference: now theirs
        _, ns, name = op
        current = h.local_kube.get("v1", "ConfigMap", name, ns)
        if current is None or not desired.is_copy(current):
            return
        current["metadata"].pop("ownerReferences", None)
        current["metadata"]["labels"].pop(desired.RULE_LABEL, None)
        current["data"] = {"v": "taken"}
        model.world[(ns, name)] = h.world_put(current)
    elif kind in ("copy_edit", "copy_del"):
        _, ns, name = op
        current = h.local_kube.get("v1", "ConfigMap", name, ns)
        if current is None or not desired.is_copy(current):
            return
        if kind == "copy_del":
            h.world_remove("v1", "ConfigMap", name, ns)
        else:
            current["data"] = {"v": "edited", "extra": "by hand"}
            h.world_put(current)


def namespace_sa_token(data: Obj, labelled: bool) -> Obj:
    obj = secret("default", "s", data, {"copy": "true"} if labelled else {}, SA_TOKEN)
    obj["metadata"]["annotations"] = {"kubernetes.io/service-account.name": "default"}
    return obj


def actual_copies(h: Harness) -> dict[tuple[str, str, str], Obj]:
    out: dict[tuple[str, str, str], Obj] = {}
    for kind in ("ConfigMap", "Secret"):
        for obj in h.local_kube.list("v1", kind):
            if desired.is_copy(obj):
                meta = obj["metadata"]
                out[(kind, meta["namespace"], meta["name"])] = obj.get("data") or {}
    return out


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(st.tuples(operation, st.booleans()), max_size=14),
       deliver_twice=st.booleans(), seeded=st.booleans())
def test_cluster_converges_to_what_the_rules_ask_for(ops: list[tuple[Any, bool]],
                                                     deliver_twice: bool, seeded: bool) -> None:
    from eventop.kube import Kube
    from eventop.localkube import LocalKube

    # gc_dangling: as on a real cluster, a copy a run made for a rule deleted meanwhile (its
    # owner gone) is collected.
    with LocalKube(crd_dir=str(REPO / "crds"), gc_dangling=True) as server, \
            Harness(server, Kube.connect(url=server.url), deliver_twice=deliver_twice) as h:
        model = Model()
        h.world_put(namespace("shared"))
        if seeded:
            for op in SEED:
                apply_op(h, model, op)
            h.settle()
        for op, settle_now in ops:
            apply_op(h, model, op)
            if settle_now:
                h.settle()
        h.settle()

        assert actual_copies(h) == model.expected()
        for (ns, name), obj in model.world.items():  # never overwritten, never deleted
            assert server.get("v1", "ConfigMap", name, ns)["data"] == obj["data"]

        # Counts in a rule's status may lag behind a race that changed copies without any
        # write of ours (a copy replaced by hand while its namespace was relabelled) until
        # the watcher's periodic resync: do one, then nothing may change any more.
        h.resync()
        assert actual_copies(h) == model.expected()
        before = h.versions()
        h.redeliver_history()
        assert h.versions() == before
