"""Who owns which fields of an object: ``metadata.managedFields``, as server-side apply keeps it.

Pure functions; :meth:`eventop.kube.Kube.upgrade_managed_fields` sends what they compute.
"""

from __future__ import annotations

from typing import Any

Obj = dict[str, Any]


def upgrade_patch(managed: list[Obj], manager: str) -> list[Obj] | None:
    """The JSON patch that moves ``manager``'s Update entries (not a subresource's) into
    its Apply entry (made from the first of them if it has none), or None if it has no
    Update entry. Each rewritten entry is tested first: another writer may have changed
    the list since it was read."""
    def mine(entry: Obj, operation: str) -> bool:
        return (entry.get("manager") == manager and entry.get("operation") == operation
                and not entry.get("subresource"))

    updates = [i for i, e in enumerate(managed) if mine(e, "Update")]
    if not updates:
        return None
    applies = [i for i, e in enumerate(managed) if mine(e, "Apply")]
    target = applies[0] if applies else updates[0]
    merged = managed[target].get("fieldsV1") or {}
    for i in updates:
        merged = _union_fields(merged, managed[i].get("fieldsV1") or {})
    ops: list[Obj] = []
    for i in sorted({target, *updates}):
        ops += [{"op": "test", "path": f"/metadata/managedFields/{i}/manager", "value": manager},
                {"op": "test", "path": f"/metadata/managedFields/{i}/operation",
                 "value": managed[i]["operation"]}]
    ops += [{"op": "replace", "path": f"/metadata/managedFields/{target}/operation",
             "value": "Apply"},
            {"op": "replace", "path": f"/metadata/managedFields/{target}/fieldsV1",
             "value": merged}]
    # highest index first, so that each removal leaves the others' indices as they were
    ops += [{"op": "remove", "path": f"/metadata/managedFields/{i}"}
            for i in sorted(set(updates) - {target}, reverse=True)]
    return ops


def _union_fields(a: Obj, b: Obj) -> Obj:
    """Two FieldsV1 trees together (a field set by either is in the result)."""
    out = dict(a)
    for key, value in b.items():
        out[key] = _union_fields(out[key], value) if key in out else value
    return out
