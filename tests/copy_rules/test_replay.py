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

import json
import shutil
from pathlib import Path
from typing import Any

from eventop.watcher.recording import load_recording

Obj = dict[str, Any]
RECORDINGS = Path(__file__).resolve().parents[1] / "recordings" / "copy-rules"
SOURCE_DATA = {"insecure": "false", "mirror": "mirror.internal:5001"}
HAND_MADE_DATA = {"mirror": "mirror.internal:5001"}


def split_recording(tmp_path: Path, before_rv: int) -> tuple[Path, Path]:
    """The recording cut in two at a resourceVersion: the listed state and the watch events
    before it, and the watch events from it on (replayed by ``pipeline.replay`` in turn)."""
    first, second = tmp_path / "before", tmp_path / "after"
    first.mkdir()
    second.mkdir()
    for f in sorted(RECORDINGS.iterdir()):
        if f.name.endswith(".list.json"):
            shutil.copy(f, first / f.name)
            continue
        lines = [line for line in f.read_text().splitlines() if line.strip()]
        rv = [int(json.loads(line)["object"]["metadata"]["resourceVersion"]) for line in lines]
        (first / f.name).write_text("".join(f"{ln}\n" for ln, v in zip(lines, rv, strict=True)
                                            if v < before_rv))
        (second / f.name).write_text("".join(f"{ln}\n" for ln, v in zip(lines, rv, strict=True)
                                             if v >= before_rv))
    return first, second


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


def test_recorded_session_leaves_exactly_the_copies_the_rules_ask_for(
        pipeline: Any, tmp_path: Path) -> None:
    lk = pipeline.cluster.local
    deletion = next(obj for change, obj in load_recording(RECORDINGS)
                    if change == "delete" and obj["metadata"]["name"] == "registry-config")
    before, after = split_recording(tmp_path, int(deletion["metadata"]["resourceVersion"]))
    assert set(pipeline.replay(before)) <= {200, 202}

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

    assert set(pipeline.replay(after)) <= {200, 202}

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
    assert set(pipeline.replay(RECORDINGS)) <= {200, 202}
    once = state(pipeline.cluster.local)
    assert set(pipeline.replay(RECORDINGS)) <= {200, 202}
    assert state(pipeline.cluster.local) == once
