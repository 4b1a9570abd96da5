"""Small helpers over stored objects: canonical key order, timestamps, JSON encoding."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

Obj = dict[str, Any]

META_ORDER = ("name", "generateName", "namespace", "selfLink", "uid", "resourceVersion",
              "generation", "creationTimestamp", "deletionTimestamp",
              "deletionGracePeriodSeconds", "labels", "annotations", "ownerReferences",
              "finalizers", "managedFields")


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def canonical(obj: Obj) -> Obj:
    """Keys in the order the real server writes built-in objects (kind, apiVersion, metadata
    in ObjectMeta field order, the body, status last)."""
    meta = obj.get("metadata") or {}
    ordered_meta = {k: meta[k] for k in META_ORDER if k in meta}
    ordered_meta.update({k: v for k, v in meta.items() if k not in ordered_meta})
    out: Obj = {"kind": obj.get("kind"), "apiVersion": obj.get("apiVersion"),
                "metadata": ordered_meta}
    out.update({k: v for k, v in obj.items() if k not in ("kind", "apiVersion", "metadata",
                                                          "status")})
    if "status" in obj:
        out["status"] = obj["status"]
    return out


def dumps(obj: Any, custom: bool) -> str:
    """Compact JSON; custom resources are unstructured and come out with sorted keys."""
    return json.dumps(obj, separators=(",", ":"), sort_keys=custom, ensure_ascii=False)


def without_volatile(obj: Obj) -> Obj:
    """The object minus fields every write changes, to tell a real change from a no-op."""
    meta = {k: v for k, v in (obj.get("metadata") or {}).items()
            if k not in ("resourceVersion", "managedFields")}
    return {**obj, "metadata": meta}


def event_line(etype: str, obj: Obj, custom: bool) -> bytes:
    """One watch event line; the envelope is ``type`` then ``object`` even for custom kinds."""
    return f'{{"type":"{etype}","object":{dumps(obj, custom)}}}\n'.encode()
