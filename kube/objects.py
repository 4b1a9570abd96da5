"""Pure helpers over Kubernetes objects as plain dicts: references, labels, conditions."""

from __future__ import annotations

import hashlib
import json
import re
from datetime import UTC, datetime
from typing import Any

from eventop.names import is_dns_subdomain

Obj = dict[str, Any]

MANAGED_BY = "eventop"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
#: A valid label value: at most 63 characters of this shape (the API server's rule).
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def now_rfc3339() -> str:
    """Now, as Kubernetes writes times (RFC 3339, seconds, UTC)."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_rfc3339(text: str | None) -> datetime | None:
    """A time as Kubernetes writes it (``2026-11-29T17:00:00Z``), in UTC; None for none.
    Raises ``ValueError`` for text that is not one."""
    if not text:
        return None
    return datetime.fromisoformat(str(text).replace("Z", "+00:00")).astimezone(UTC)


def kube_event(involved: Obj, event_type: str, reason: str, message: str, now: str, *,
               component: str, instance: str) -> Obj:
    """A core/v1 Event about ``involved``. Its name is derived from what it says, so the
    same Event posted again finds the first one (and bumps its ``count``)."""
    meta = involved.get("metadata") or {}
    key = f"{meta.get('uid')}/{event_type}/{reason}/{message}".encode()
    # A name of 253 characters at most (the object's own may be that long), and still a
    # DNS subdomain where it is cut: no "-" or "." before the suffix's dot.
    prefix = str(meta.get("name"))[:253 - 17].rstrip("-.")
    return {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": f"{prefix}.{hashlib.sha256(key).hexdigest()[:16]}",
                     "namespace": meta.get("namespace") or "default"},
        "involvedObject": {
            "apiVersion": involved.get("apiVersion"), "kind": involved.get("kind"),
            "name": meta.get("name"), "namespace": meta.get("namespace"),
            "uid": meta.get("uid"), "resourceVersion": meta.get("resourceVersion"),
        },
        "type": event_type, "reason": reason, "message": message[:1024],
        "source": {"component": component}, "reportingComponent": component,
        "reportingInstance": instance,
        "firstTimestamp": now, "lastTimestamp": now, "count": 1,
    }


def owner_reference(owner: Obj, *, controller: bool = True) -> Obj:
    """An ownerReference to ``owner`` so the garbage collector deletes dependents with it.

    ``blockOwnerDeletion`` makes foreground deletion wait for dependents; on a real API
    server it requires ``update`` on the owner's ``finalizers`` subresource (granted in RBAC).
    """
    meta = owner["metadata"]
    return {
        "apiVersion": owner["apiVersion"], "kind": owner["kind"],
        "name": meta["name"], "uid": meta["uid"],
        "controller": controller, "blockOwnerDeletion": True,
    }


def is_owned_by(obj: Obj, owner_uid: str) -> bool:
    return any(ref.get("uid") == owner_uid
               for ref in (obj.get("metadata") or {}).get("ownerReferences") or [])


def label_value(value: str, *, prefix_chars: int = 46, hash_chars: int = 16) -> str:
    """``value`` as a label value: itself if valid, else a readable prefix and a hash.

    Object names may be 253 characters, label values only 63; the hash keeps two long names
    from colliding. The lengths are parameters because a shortened value is stored in objects
    and in immutable workload selectors: a handler that has shipped one form must keep it.
    """
    if len(value) <= 63 and LABEL_VALUE.match(value):
        return value
    digest = hashlib.sha256(value.encode()).hexdigest()[:hash_chars]
    prefix = re.sub(r"[^-A-Za-z0-9_.]", "-", value)[:prefix_chars].strip("-_.")
    return f"{prefix}-{digest}" if prefix else digest


def dns_label(value: str, max_len: int = 63, *, fallback: str = "x",
              fragment: bool = False) -> str:
    """``value`` as a DNS-1035 label (what Service names must be) of at most ``max_len``.

    A value that already is one is kept. Any other (dots, upper case, a leading digit, too
    long) becomes its cleaned prefix and a hash of the original, so ``a.b`` and ``a-b`` never
    share a name; ``fallback`` starts it when nothing usable is left. A ``fragment`` goes
    after a prefix of the caller's, so it may start with a digit (none is added then).
    """
    if len(value) <= max_len and _DNS1035.match(value):
        return value
    digest = hashlib.sha256(value.encode()).hexdigest()[:6]
    cleaned = re.sub(r"[^a-z0-9-]", "-", value.lower()).strip("-")
    if cleaned and not cleaned[0].isalpha() and not fragment:
        cleaned = f"{fallback}-{cleaned}"
    cleaned = cleaned[: max_len - 7].rstrip("-")
    return f"{cleaned}-{digest}" if cleaned else f"{fallback}-{digest}"


def standard_labels(name: str, instance: str, component: str) -> dict[str, str]:
    """The ``app.kubernetes.io/*`` labels every object eventop creates carries.

    ``instance`` is usually an object name; one too long for a label value is shortened with
    :func:`label_value` (a value that is already valid is kept as it is).
    """
    return {
        "app.kubernetes.io/name": name,
        "app.kubernetes.io/instance": label_value(instance),
        "app.kubernetes.io/component": component,
        MANAGED_BY_LABEL: MANAGED_BY,
    }


def content_hash(value: Any) -> str:
    """A stable sha256 of a JSON-able value (dict key order does not matter)."""
    blob = json.dumps(value, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()


def get_condition(status: Obj | None, type_: str) -> Obj | None:
    """The condition of type ``type_`` in a status, or None."""
    return next((c for c in (status or {}).get("conditions") or [] if c.get("type") == type_),
                None)


def set_condition(conditions: list[Obj] | None, type_: str, status: bool | str, reason: str,
                  message: str, now: str, observed_generation: int | None = None) -> list[Obj]:
    """Return ``conditions`` with ``type_`` set; lastTransitionTime moves only on a change."""
    status_s = status if isinstance(status, str) else ("True" if status else "False")
    result = [dict(c) for c in conditions or [] if c.get("type") != type_]
    previous = next((c for c in conditions or [] if c.get("type") == type_), None)
    changed = previous is None or previous.get("status") != status_s
    cond: Obj = {
        "type": type_, "status": status_s, "reason": reason, "message": message,
        "lastTransitionTime": now if changed else previous.get("lastTransitionTime", now),
    }
    if observed_generation is not None:
        cond["observedGeneration"] = observed_generation
    result.append(cond)
    return sorted(result, key=lambda c: str(c.get("type")))


def status_changed(old: Obj, new: Obj) -> bool:
    """Would merge-patching ``new`` into a status ``old`` change anything?"""
    return any(old.get(key) != value for key, value in new.items())


def is_terminating(namespace: Obj | None) -> bool:
    """A Namespace being deleted (nothing can be created in it any more). Also asked of an
    event's body, which a sender may have shaped wrongly (``status: 0``): not a mapping
    where one belongs reads as not terminating, never as a crash of the event."""
    if not isinstance(namespace, dict):
        return False
    meta, status = namespace.get("metadata"), namespace.get("status")
    return bool((isinstance(meta, dict) and meta.get("deletionTimestamp"))
                or (isinstance(status, dict) and status.get("phase") == "Terminating"))


def name_selector(name: str) -> str:
    """The field selector of one name, its value escaped as apimachinery's
    ``fields.EscapeValue`` does: a name from an event body (``a,b``) stays one name."""
    escaped = name.replace("\\", "\\\\").replace(",", "\\,").replace("=", "\\=")
    return f"metadata.name={escaped}"


def label_selector_string(selector: Obj | None) -> str:
    """A metav1.LabelSelector as the query string the API server understands.

    Raises ValueError for an operator it does not know (the API server would too).
    """
    if not selector:
        return ""
    parts = [f"{k}={v}" for k, v in sorted((selector.get("matchLabels") or {}).items())]
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        if op == "In":
            parts.append(f"{key} in ({','.join(values)})")
        elif op == "NotIn":
            parts.append(f"{key} notin ({','.join(values)})")
        elif op == "Exists":
            parts.append(key)
        elif op == "DoesNotExist":
            parts.append(f"!{key}")
        else:
            raise ValueError(f"unknown label selector operator {op!r} for key {key!r}")
    return ",".join(parts)


def selector_matches(selector: Obj | None, labels: dict[str, str] | None) -> bool:
    """Evaluate a metav1.LabelSelector locally. An empty selector matches everything."""
    labels = labels or {}
    if not selector:
        return True
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        present = key in labels
        if op == "In" and not (present and labels[key] in values):
            return False
        if op == "NotIn" and present and labels[key] in values:
            return False
        if op == "Exists" and not present:
            return False
        if op == "DoesNotExist" and present:
            return False
        if op not in ("In", "NotIn", "Exists", "DoesNotExist"):
            raise ValueError(f"unknown label selector operator {op!r} for key {key!r}")
    return True


def label_selector_problems(selector: Obj | None) -> list[str]:
    """What the API server's label selector parser would refuse in a metav1.LabelSelector
    (a key or value no label can have, ``In`` without values, ``Exists`` with values, an
    unknown operator); a CRD's schema lets all of these through."""
    problems: list[str] = []
    selector = selector or {}
    for key, value in (selector.get("matchLabels") or {}).items():
        problems += _label_key_problems(str(key)) + _label_value_problems(key, value)
    for expr in selector.get("matchExpressions") or []:
        key, op, values = str(expr.get("key", "")), expr.get("operator"), expr.get("values") or []
        problems += _label_key_problems(key)
        if op in ("In", "NotIn"):
            if not values:
                problems.append(f"operator {op} on key {key!r} needs at least one value")
            for value in values:
                problems += _label_value_problems(key, value)
        elif op in ("Exists", "DoesNotExist"):
            if values:
                problems.append(f"operator {op} on key {key!r} takes no values")
        else:
            problems.append(f"unknown operator {op!r} on key {key!r}")
    return problems


def _label_key_problems(key: str) -> list[str]:
    prefix, _, name = key.rpartition("/")
    if not name or len(name) > 63 or not LABEL_VALUE.match(name) or (
            prefix and not is_dns_subdomain(prefix)) \
            or key.startswith("/"):
        return [f"{key!r} is not a label key (an optional DNS prefix and '/', then at most 63 "
                "letters, digits, '-', '_' or '.', starting and ending with a letter or digit)"]
    return []


def _label_value_problems(key: Any, value: Any) -> list[str]:
    if not isinstance(value, str) or len(value) > 63 or not LABEL_VALUE.match(value):
        return [f"{value!r} (key {key!r}) is not a label value (at most 63 letters, digits, "
                "'-', '_' or '.', starting and ending with a letter or digit, or empty)"]
    return []
