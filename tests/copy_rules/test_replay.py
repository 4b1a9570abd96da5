"""The recorded copy-rules session (real kube-apiserver traffic) through the whole pipeline:
recorded changes are made to the local API server and their CloudEvents posted over HTTP to
the router under gunicorn, which runs the handlers against the API server.

The recording (tests/recordings/README.md): namespaces team-a, team-b; ConfigMap
default/registry-config and Secret default/regcred labelled copyrator=true; CopyRules
main-rule (configmap) and registry-credentials (secret); the source changed; team-a labelled;
team-c created; a hand-made team-a/registry-config labelled managed-by=eventop (and nothing
else); main-rule's status patched by hand; then the source, team-b and registry-credentials
deleted.
"""

from __future__ import annotations

from typing import Any

from watcher.recording import load_initial, load_recording

Obj = dict[str, Any]
RECORDING = "copy-rules"
SOURCE_DATA = {"insecure": "false", "mirror": "mirror.internal:5001"}
HAND_MADE_DATA = {"mirror": "mirror.internal:5001"}


def replay_events(pipeline: Any, events: list[tuple[str, Obj]]) -> None:
    """What ``pipeline.replay`` does, for a slice of the recording."""
    for change, obj in events:
        meta = obj["metadata"]
        if change == "delete":
            pipeline.world_remove(obj["apiVersion"], obj["kind"], meta["name"],
                                  meta.get("namespace"))
        elif obj["kind"] == "Namespace" and meta.get("deletionTimestamp"):
            pipeline.world_remove("v1", "Namespace", meta["name"])
        else:
            pipeline.world_put(obj)
        assert pipeline.post(change, obj) in (200, 202), f"{change} {meta['name']}"
    pipeline.settle()


def objects(local_kube: Any, kind: str, name: str) -> dict[str, Obj]:
    return {o["metadata"]["namespace"]: o for o in local_kube.list("v1", kind)
            if o["metadata"]["name"] == name}


def owners(obj: Obj) -> list[str]:
    return [r["name"] for r in obj["metadata"].get("ownerReferences") or []]


def state(local_kube: Any) -> dict[str, Any]:
    """The cluster as a user sees it (no uids, resourceVersions or timestamps)."""
    out: dict[str, Any] = {}
    for kind in ("ConfigMap", "Secret"):
        for o in local_kube.list("v1", kind):
            meta = o["metadata"]
            out[f"{kind} {meta['namespace']}/{meta['name']}"] = (
                o.get("data"), o.get("type"), meta.get("labels"), owners(o))
    for o in local_kube.list("v1", "Namespace"):
        out[f"Namespace {o['metadata']['name']}"] = o["metadata"].get("labels")
    for o in local_kube.list("eventop.dev/v1", "CopyRule"):
        status = dict(o.get("status") or {})
        status["conditions"] = [(c["type"], c["status"], c["reason"])
                                for c in status.get("conditions") or []]
        out[f"CopyRule {o['metadata']['name']}"] = status
    return out


def test_recorded_session_leaves_exactly_the_copies_the_rules_ask_for(pipeline: Any) -> None:
    lk = pipeline.local_kube
    events = load_recording(pipeline_paths())
    cut = next(i for i, (change, obj) in enumerate(events)
               if change == "delete" and obj["metadata"]["name"] == "registry-config")
    replay_events(pipeline, [("add", o) for o in load_initial(pipeline_paths())])
    replay_events(pipeline, events[:cut])

    # Before the deletions: every Active non-system namespace but default holds both copies,
    # team-c too (created after the rules); the hand-made object in team-a is left alone.
    configs = objects(lk, "ConfigMap", "registry-config")
    assert set(configs) == {"default", "demo", "team-a", "team-b", "team-c"}
    for ns in ("demo", "team-b", "team-c"):
        assert configs[ns]["data"] == SOURCE_DATA and owners(configs[ns]) == ["main-rule"]
    hand_made = configs["team-a"]
    assert hand_made["data"] == HAND_MADE_DATA and owners(hand_made) == []
    assert hand_made["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "eventop"}
    creds = objects(lk, "Secret", "regcred")
    source = creds.pop("default")
    assert set(creds) == {"demo", "team-a", "team-b", "team-c"}
    for copy in creds.values():
        assert copy["data"] == source["data"] and copy["type"] == "kubernetes.io/dockerconfigjson"
        assert owners(copy) == ["registry-credentials"]
    status = lk.get("eventop.dev/v1", "CopyRule", "main-rule")["status"]
    assert (status["sources"], status["copies"], status["conflicts"]) == (1, 3, 1)
    assert status["conflictList"] == ["team-a/registry-config"]  # the hand-patched copies=1 fixed
    warnings = [e for e in lk.list("v1", "Event") if e["reason"] == "CopyConflict"]
    assert len(warnings) == 1 and "team-a/registry-config" in warnings[0]["message"]

    replay_events(pipeline, events[cut:])

    # After: the source is gone so are its copies (the hand-made object stays as it was),
    # team-b is gone, and registry-credentials' copies went with the rule.
    configs = objects(lk, "ConfigMap", "registry-config")
    assert set(configs) == {"team-a"} and configs["team-a"]["data"] == HAND_MADE_DATA
    assert set(objects(lk, "Secret", "regcred")) == {"default"}
    assert lk.get("v1", "Namespace", "team-b") is None
    assert lk.get("eventop.dev/v1", "CopyRule", "registry-credentials") is None
    status = lk.get("eventop.dev/v1", "CopyRule", "main-rule")["status"]
    assert (status["sources"], status["copies"], status["conflicts"]) == (0, 0, 0)
    assert {c["type"]: c["status"] for c in status["conditions"]} == {"Ready": "True"}


def test_replaying_the_recording_twice_leaves_the_cluster_as_once(pipeline: Any) -> None:
    assert set(pipeline.replay(RECORDING)) <= {200, 202}
    once = state(pipeline.local_kube)
    assert set(pipeline.replay(RECORDING)) <= {200, 202}
    assert state(pipeline.local_kube) == once


def pipeline_paths() -> Any:
    from tests.support.pipeline import _recording_paths

    return _recording_paths(RECORDING)
