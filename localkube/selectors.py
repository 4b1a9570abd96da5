"""Label and field selectors, parsed once per request and matched per object.

Grammar as in apimachinery: comma-separated requirements ``k=v``, ``k==v``, ``k!=v``,
``k in (a,b)``, ``k notin (a,b)``, ``k`` (exists), ``!k`` (does not exist).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from eventop.localkube.errors import ApiError, bad_request

Obj = dict[str, Any]
Matcher = Callable[[Obj], bool]

_SET_RE = re.compile(r"^\s*([^\s!=()]+)\s+(in|notin)\s*\(([^)]*)\)\s*$")


def _split_top(text: str) -> list[str]:
    """Split on commas that are not inside parentheses."""
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return [p.strip() for p in parts if p.strip()]


def _requirement(req: str) -> Callable[[dict[str, str]], bool]:
    m = _SET_RE.match(req)
    if m:
        key, op, raw = m.group(1), m.group(2), m.group(3)
        values = {v.strip() for v in raw.split(",") if v.strip()}
        if not values:  # as apimachinery's labels.Parse refuses it
            raise bad_request(f"unable to parse requirement: for 'in', 'notin' operators, "
                              f"values set can't be empty: {req!r}")
        if op == "in":
            return lambda labels: labels.get(key) in values
        return lambda labels: labels.get(key) not in values
    for op in ("!=", "==", "="):
        if op in req:
            key, _, value = req.partition(op)
            key, value = key.strip(), value.strip()
            if not key:
                break
            if op == "!=":
                return lambda labels: labels.get(key) != value
            return lambda labels: labels.get(key) == value
    else:
        if req.startswith("!"):
            key = req[1:].strip()
            if key and re.fullmatch(r"[^\s=!(),]+", key):
                return lambda labels: key not in labels
        elif re.fullmatch(r"[^\s=!(),]+", req):
            return lambda labels: req in labels
    raise bad_request(f'unable to parse requirement: invalid label selector "{req}"')


def parse_label_selector(text: str | None) -> Matcher | None:
    """A predicate over objects, or None when the selector selects everything."""
    if not text or not text.strip():
        return None
    reqs = [_requirement(r) for r in _split_top(text)]

    def match(obj: Obj) -> bool:
        labels = (obj.get("metadata") or {}).get("labels") or {}
        return all(r(labels) for r in reqs)
    return match


def _field_value(obj: Obj, path: str) -> str:
    cur: Any = obj
    for part in path.split("."):
        if not isinstance(cur, dict):
            return ""
        cur = cur.get(part)
    if cur is None:
        return ""
    if isinstance(cur, bool):
        return "true" if cur else "false"
    return str(cur)


# Field labels each kind supports beyond metadata.name / metadata.namespace.
FIELD_LABELS: dict[str, set[str]] = {
    "Namespace": {"status.phase"},
    "Secret": {"type"},
    "Pod": {"spec.nodeName", "spec.restartPolicy", "spec.schedulerName",
            "spec.serviceAccountName", "status.phase", "status.podIP", "status.nominatedNodeName"},
    "Event": {"involvedObject.kind", "involvedObject.namespace", "involvedObject.name",
              "involvedObject.uid", "involvedObject.apiVersion",
              "involvedObject.resourceVersion", "involvedObject.fieldPath", "reason",
              "reportingComponent", "source", "type"},
    "PersistentVolumeClaim": {"status.phase"},
}


def parse_field_selector(text: str | None, kind: str) -> Matcher | None:
    """Equality-based field selector; unsupported field labels are a 400 like the real one.

    Values are escaped as apimachinery's ``fields.EscapeValue`` writes them (``\\,``,
    ``\\=``, ``\\\\``): a name containing a comma is still one requirement."""
    if not text or not text.strip():
        return None
    allowed = {"metadata.name", "metadata.namespace"} | FIELD_LABELS.get(kind, set())
    checks: list[tuple[str, bool, str]] = []
    for req in _split_unescaped(text):
        key, positive, value = _field_term(req)
        if key not in allowed:
            raise ApiError(400, "BadRequest",
                           f'"{key}" is not a known field selector: only '
                           f'"metadata.name", "metadata.namespace"')
        checks.append((key, positive, value))

    def match(obj: Obj) -> bool:
        return all((_field_value(obj, k) == v) == pos for k, pos, v in checks)
    return match


def _split_unescaped(text: str) -> list[str]:
    """Split at commas not escaped by a backslash (apimachinery's splitTerms)."""
    terms, current, escaped = [], "", False
    for c in text:
        if escaped:
            current += "\\" + c
            escaped = False
        elif c == "\\":
            escaped = True
        elif c == ",":
            terms.append(current)
            current = ""
        else:
            current += c
    terms.append(current + ("\\" if escaped else ""))
    return terms


def _field_term(req: str) -> tuple[str, bool, str]:
    """(key, positive, unescaped value) of ``key=value``, ``key==value`` or ``key!=value``."""
    i = 0
    while i < len(req):
        if req[i] == "\\":
            i += 2
            continue
        for op, positive in (("!=", False), ("==", True), ("=", True)):
            if req.startswith(op, i):
                return req[:i].strip(), positive, _unescape(req[i + len(op):].strip(), req)
        i += 1
    raise bad_request(f'invalid field selector: "{req}": expected key=value')


def _unescape(value: str, req: str) -> str:
    out, i = "", 0
    while i < len(value):
        if value[i] == "\\":
            if i + 1 >= len(value) or value[i + 1] not in "\\,=":
                raise bad_request(f'invalid field selector: "{req}": invalid escape sequence')
            out += value[i + 1]
            i += 2
        else:
            out += value[i]
            i += 1
    return out


def parse_selectors(kind: str, query: dict[str, str]) -> Matcher | None:
    """``labelSelector`` and ``fieldSelector`` of a request as one predicate (None: all)."""
    label = parse_label_selector(query.get("labelSelector"))
    field = parse_field_selector(query.get("fieldSelector"), kind)
    if label is None:
        return field
    if field is None:
        return label
    return lambda obj: label(obj) and field(obj)
