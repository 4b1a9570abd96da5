"""Server-side apply and field ownership (a simplified ``managedFields``).

A field set is a set of paths (tuples of keys). Maps are granular (each key is its own
field, the map node itself is also recorded, rendered as ``"."`` in FieldsV1); lists and
scalars are atomic leaves: a list is owned, replaced and compared as one value (the real
server merges lists with merge keys such as ``containers[name]``; we do not).

Rules implemented, as the real server does them:
* an apply sets the fields of the applied configuration and records them for its manager;
  fields that the same manager applied before and no longer applies are removed, unless
  another manager also owns them (or something beneath them);
* changing a leaf owned by another manager is a conflict unless ``force``; forcing takes
  the field over;
* an ordinary write (create, update, patch) takes ownership of the leaves it changed for its
  manager (operation ``Update``) and removes them from the others, never conflicting.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from eventop.localkube import errors
from eventop.localkube.patches import merge_patch

Obj = dict[str, Any]
Path = tuple[str, ...]
TRACKED_METADATA = ("labels", "annotations", "ownerReferences", "finalizers")
_MISSING = object()


@dataclass
class Manager:
    name: str
    operation: str  # "Apply" or "Update"
    api_version: str
    time: str
    subresource: str = ""
    fields: set[Path] = field(default_factory=set)

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.name, self.operation, self.subresource)

    def label(self) -> str:
        """How conflicts name a manager: ``"curl" using v1`` for Update, ``"x"`` for Apply."""
        text = json.dumps(self.name)
        if self.subresource:
            text += f' with subresource "{self.subresource}"'
        if self.operation == "Update":
            text += f" using {self.api_version}"
        return text


Managers = dict[tuple[str, str, str], Manager]


def _walk(value: Any, prefix: Path, out: set[Path], *, node: bool) -> None:
    if isinstance(value, dict) and value:
        if node:
            out.add(prefix)
        for key, sub in value.items():
            _walk(sub, (*prefix, str(key)), out, node=node)
    else:
        out.add(prefix)


def field_paths(obj: Obj, scope: str, has_status: bool, *, nodes: bool = True) -> set[Path]:
    """Fields an object sets in ``scope`` ("main" or "status").

    ``nodes``: include non-empty maps themselves (an Update that creates a map owns it, the
    ``"."`` of FieldsV1); an Apply owns only the leaves it sets.
    """
    out: set[Path] = set()
    if scope == "status":
        if "status" in obj:
            _walk(obj["status"], ("status",), out, node=nodes)
        return out
    for key, value in obj.items():
        if key in ("apiVersion", "kind") or (key == "status" and has_status):
            continue
        if key == "metadata":
            for mkey in TRACKED_METADATA:
                if isinstance(value, dict) and mkey in value:
                    _walk(value[mkey], ("metadata", mkey), out, node=nodes)
            continue
        _walk(value, (key,), out, node=nodes)
    return out


def get_path(obj: Any, path: Path) -> Any:
    cur = obj
    for key in path:
        if not isinstance(cur, dict) or key not in cur:
            return _MISSING
        cur = cur[key]
    return cur


def delete_path(obj: Obj, path: Path) -> None:
    cur: Any = obj
    for key in path[:-1]:
        if not isinstance(cur, dict) or key not in cur:
            return
        cur = cur[key]
    if isinstance(cur, dict):
        cur.pop(path[-1], None)


def _drop_empty_parents(obj: Obj, path: Path, others: Managers, keep: set[Path]) -> None:
    """Remove maps a removal left empty, unless someone still owns them."""
    while len(path) >= 1 and path != ("metadata",):
        value = get_path(obj, path)
        if value != {} or path in keep or any(path in m.fields for m in others.values()):
            return
        delete_path(obj, path)
        path = path[:-1]


def _is_leaf(value: Any) -> bool:
    return not (isinstance(value, dict) and value)


def _owns_at_or_below(fields: set[Path], path: Path) -> bool:
    n = len(path)
    return any(p[:n] == path for p in fields)


def scoped_config(applied: Obj, scope: str, has_status: bool) -> Obj:
    """The part of an applied configuration a request may change."""
    config = {k: v for k, v in applied.items() if k not in ("apiVersion", "kind")}
    meta = dict(config.get("metadata") or {})
    config["metadata"] = {k: meta[k] for k in TRACKED_METADATA if k in meta}
    if scope == "status":
        return {"metadata": {}, **({"status": config["status"]} if "status" in config else {})}
    if has_status:
        config.pop("status", None)
    return config


def apply(old: Obj, applied: Obj, managers: Managers, *, manager: str, api_version: str,
          now: str, force: bool, scope: str, has_status: bool) -> tuple[Obj, Managers]:
    """Merge ``applied`` into ``old`` for ``manager``; return the new object and ownership.

    ``old`` may be an empty dict (apply creates). Raises a 409 on unforced conflicts.
    """
    sub = "status" if scope == "status" else ""
    config = scoped_config(applied, scope, has_status)
    # Maps merge key by key, ``null`` removes, lists and scalars replace: RFC 7386 exactly.
    merged = merge_patch(old, config)
    new_fields = field_paths(config, scope, has_status, nodes=False)
    key = (manager, "Apply", sub)
    previous = managers[key].fields if key in managers else set()
    others = {k: m for k, m in managers.items() if k != key}

    for path in sorted(previous - new_fields, key=len, reverse=True):
        if _owns_at_or_below(new_fields, path):
            continue  # was an empty map, now applied with keys: keep it (and them)
        if not any(_owns_at_or_below(m.fields, path) for m in others.values()):
            delete_path(merged, path)
            _drop_empty_parents(merged, path[:-1], others, new_fields)

    conflicts: list[tuple[str, str]] = []
    taken: dict[tuple[str, str, str], set[Path]] = {}
    for okey, other in others.items():
        for path in sorted(other.fields):
            before, after = get_path(old, path), get_path(merged, path)
            if before is _MISSING or not _is_leaf(before) or before == after:
                continue
            if path in new_fields or after is _MISSING:
                if force:
                    taken.setdefault(okey, set()).add(path)
                else:
                    conflicts.append((other.label(), "." + ".".join(path)))
    if conflicts:
        raise errors.apply_conflict(conflicts)

    out: Managers = {}
    for okey, other in others.items():
        kept = other.fields - taken.get(okey, set())
        out[okey] = Manager(other.name, other.operation, other.api_version, other.time,
                            other.subresource, kept)
    prev_time = managers[key].time if key in managers else now
    out[key] = Manager(manager, "Apply", api_version,
                       prev_time if new_fields == previous else now, sub, new_fields)
    return merged, prune(merged, out)


def record_update(old: Obj | None, new: Obj, managers: Managers, *, manager: str,
                  api_version: str, now: str, scope: str, has_status: bool) -> Managers:
    """Ownership after an ordinary write: ``manager`` takes every field it changed."""
    before = field_paths(old or {}, scope, has_status)
    after = field_paths(new, scope, has_status)
    changed = {p for p in after
               if _is_leaf(get_path(new, p)) and get_path(old or {}, p) != get_path(new, p)}
    created_nodes = {p for p in after - before if not _is_leaf(get_path(new, p))}
    sub = "status" if scope == "status" else ""
    key = (manager, "Update", sub)
    out: Managers = {}
    for okey, other in managers.items():
        fields = other.fields if okey == key else other.fields - changed
        out[okey] = Manager(other.name, other.operation, other.api_version, other.time,
                            other.subresource, set(fields))
    mine = changed | created_nodes
    if mine:
        entry = out.get(key) or Manager(manager, "Update", api_version, now, sub)
        entry.fields |= mine
        entry.time = now
        out[key] = entry
    return prune(new, out)


def prune(obj: Obj, managers: Managers) -> Managers:
    """Drop ownership of fields that no longer exist, and managers left with nothing."""
    out: Managers = {}
    for key, mgr in managers.items():
        fields = {p for p in mgr.fields if get_path(obj, p) is not _MISSING}
        if fields:
            out[key] = Manager(mgr.name, mgr.operation, mgr.api_version, mgr.time,
                               mgr.subresource, fields)
    return out


def _render_fields(fields: set[Path]) -> Obj:
    root: Obj = {}
    for path in sorted(fields):
        node = root
        for key in path:
            node = node.setdefault(f"f:{key}", {})
    # A member that also has children is marked with "." (the node itself is owned).
    for path in fields:
        node = root
        for key in path:
            node = node[f"f:{key}"]
        if node and "." not in node:
            node["."] = {}
    return _sort(root)


def _sort(node: Obj) -> Obj:
    return {k: _sort(v) for k, v in sorted(node.items())}


def render(managers: Managers) -> list[Obj]:
    """``metadata.managedFields`` as the real server shows it."""
    out = []
    ordered = sorted(managers.values(),
                     key=lambda m: (m.operation, m.time, m.name, m.subresource))
    for mgr in ordered:
        entry: Obj = {"manager": mgr.name, "operation": mgr.operation,
                      "apiVersion": mgr.api_version, "time": mgr.time,
                      "fieldsType": "FieldsV1", "fieldsV1": _render_fields(mgr.fields)}
        if mgr.subresource:
            entry["subresource"] = mgr.subresource
        out.append(entry)
    return out


def _parse_fields(node: Obj, prefix: Path, out: set[Path]) -> None:
    for key, sub in node.items():
        if key == ".":
            out.add(prefix)
        elif key.startswith("f:"):
            path = (*prefix, key[2:])
            if isinstance(sub, dict) and sub:
                _parse_fields(sub, path, out)
            else:
                out.add(path)
        else:  # "k:{...}" / "v:..." list members: lists are atomic here, own the list.
            out.add(prefix)


def parse(entries: list[Obj] | None) -> Managers:
    """Managers from a ``managedFields`` list (used when an object is put verbatim)."""
    out: Managers = {}
    for entry in entries or []:
        if not isinstance(entry, dict) or not entry.get("manager"):
            continue
        fields: set[Path] = set()
        _parse_fields(entry.get("fieldsV1") or {}, (), fields)
        fields.discard(("metadata",))
        mgr = Manager(entry["manager"], entry.get("operation", "Update"),
                      entry.get("apiVersion", ""), entry.get("time", ""),
                      entry.get("subresource", ""), fields)
        out[mgr.key] = mgr
    return out
