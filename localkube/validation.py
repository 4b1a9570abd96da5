"""Admission for built-in kinds: the defaults the real registry fills in, and its checks.

Only what eventop's handlers can run into is modelled (names, labels, workload selectors,
StatefulSet and PVC immutability (claims: ``claims.py``), Secret data, immutable
ConfigMaps/Secrets, Service cluster IPs, Event namespaces, Namespace and PVC status).
Messages are the real ones, so a test written against localkube reads the same text as on a
cluster.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from typing import Any

from eventop.localkube import batch, claims, errors
from eventop.localkube.errors import ApiError, cause
from eventop.localkube.resources import ResourceType

Obj = dict[str, Any]

DNS1123_LABEL = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DNS1123_SUBDOMAIN = rf"{DNS1123_LABEL}(\.{DNS1123_LABEL})*"
DNS1035_LABEL = "[a-z]([-a-z0-9]*[a-z0-9])?"
LABEL_VALUE = "(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?"
QUALIFIED_NAME = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"

MSG_SUBDOMAIN = ("a lowercase RFC 1123 subdomain must consist of lower case alphanumeric "
                 "characters, '-' or '.', and must start and end with an alphanumeric "
                 "character (e.g. 'example.com', regex used for validation is "
                 f"'{DNS1123_SUBDOMAIN}')")
MSG_LABEL = ("a lowercase RFC 1123 label must consist of lower case alphanumeric characters "
             "or '-', and must start and end with an alphanumeric character (e.g. 'my-name',"
             f"  or '123-abc', regex used for validation is '{DNS1123_LABEL}')")
MSG_1035 = ("a DNS-1035 label must consist of lower case alphanumeric characters or '-', "
            "start with an alphabetic character, and end with an alphanumeric character "
            f"(e.g. 'my-name',  or 'abc-123', regex used for validation is '{DNS1035_LABEL}')")
MSG_LABEL_VALUE = ("a valid label must be an empty string or consist of alphanumeric "
                   "characters, '-', '_' or '.', and must start and end with an alphanumeric "
                   "character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for "
                   f"validation is '{LABEL_VALUE}')")
MSG_QUALIFIED = ("must consist of alphanumeric characters, '-', '_' or '.', and "
                 "must start and end with an alphanumeric character (e.g. 'MyName',  or "
                 "'my.name',  or '123-abc', regex used for validation is "
                 f"'{QUALIFIED_NAME}')")
STS_MUTABLE = ("spec: Forbidden: updates to statefulset spec for fields other than "
               "'replicas', 'template', 'updateStrategy', 'persistentVolumeClaimRetentionPolicy'"
               " and 'minReadySeconds' are forbidden")
IMMUTABLE_SET = "Forbidden: field is immutable when `immutable` is set"
MAX_DATA = 1024 * 1024
MAX_ANNOTATIONS = 256 * 1024


def _q(value: Any) -> str:
    return json.dumps(value)


def _format_errors(value: str, regex: str, msg: str, limit: int) -> list[str]:
    """apimachinery's IsDNS1123Label/-Subdomain, IsDNS1035Label, IsValidLabelValue: length,
    then format, each reported on its own."""
    out = []
    if len(value) > limit:
        out.append(f"must be no more than {limit} characters")
    if not re.fullmatch(regex, value):
        out.append(msg)
    return out


def _qualified_name_errors(key: str) -> list[str]:
    """apimachinery's IsQualifiedName: an optional DNS subdomain prefix, ``/``, a name part."""
    parts = key.split("/")
    if len(parts) > 2:
        return [f"a qualified name {MSG_QUALIFIED} with an optional DNS subdomain prefix and "
                "'/' (e.g. 'example.com/MyName')"]
    out = []
    if len(parts) == 2:
        prefix = parts[0]
        if not prefix:
            out.append("prefix part must be non-empty")
        else:
            out += [f"prefix part {m}"
                    for m in _format_errors(prefix, DNS1123_SUBDOMAIN, MSG_SUBDOMAIN, 253)]
    name = parts[-1]
    if not name:
        out.append("name part must be non-empty")
    elif len(name) > 63:
        out.append("name part must be no more than 63 characters")
    if not re.fullmatch(QUALIFIED_NAME, name):
        out.append(f"name part {MSG_QUALIFIED}")
    return out


#: Kinds whose names are path segments (apimachinery's ValidatePathSegmentName), not DNS
#: names: RBAC's, whose built-in objects are named ``system:controller:...``.
PATH_SEGMENT_NAMED = frozenset({("rbac.authorization.k8s.io", "Role"),
                                ("rbac.authorization.k8s.io", "ClusterRole"),
                                ("rbac.authorization.k8s.io", "RoleBinding"),
                                ("rbac.authorization.k8s.io", "ClusterRoleBinding")})


def _path_segment_errors(name: str) -> list[str]:
    if name in (".", ".."):
        return [f"may not be '{name}'"]
    return [f"may not contain '{c}'" for c in ("/", "%") if c in name]


def validate_name(res: ResourceType, name: str) -> list[Obj]:
    """metadata.name rules of the kind (label, DNS-1035 label, subdomain or path segment)."""
    if (res.group, res.kind) in PATH_SEGMENT_NAMED:
        return [cause("FieldValueInvalid", "metadata.name", f"Invalid value: {_q(name)}: {m}")
                for m in _path_segment_errors(name)]
    if res.kind == "Namespace":
        regex, msg, limit = DNS1123_LABEL, MSG_LABEL, 63
    elif res.kind == "Service":
        regex, msg, limit = DNS1035_LABEL, MSG_1035, 63
    else:
        regex, msg, limit = DNS1123_SUBDOMAIN, MSG_SUBDOMAIN, 253
    return [cause("FieldValueInvalid", "metadata.name", f"Invalid value: {_q(name)}: {m}")
            for m in _format_errors(name, regex, msg, limit)]


def validate_labels(meta: Obj) -> list[Obj]:
    return label_errors(meta.get("labels") or {}, "metadata.labels")


def label_errors(labels: Obj, field: str) -> list[Obj]:
    """apimachinery's ValidateLabels: qualified-name keys, label values (``field`` names the
    map: metadata.labels, a pod template's, a selector's matchLabels)."""
    out = []
    for key, value in labels.items():
        out += [cause("FieldValueInvalid", field, f"Invalid value: {_q(key)}: {m}")
                for m in _qualified_name_errors(str(key))]
        if not isinstance(value, str):
            out.append(cause("FieldValueInvalid", f"{field}.{key}",
                             f"Invalid value: {_q(value)}: label values must be strings"))
            continue
        out += [cause("FieldValueInvalid", field, f"Invalid value: {_q(value)}: {m}")
                for m in _format_errors(value, LABEL_VALUE, MSG_LABEL_VALUE, 63)]
    return out


def validate_annotations(meta: Obj) -> list[Obj]:
    """apimachinery's ValidateAnnotations: keys are qualified names (checked lower-cased),
    and all keys and values together stay within 256 KiB."""
    annotations = meta.get("annotations") or {}
    out = [cause("FieldValueInvalid", "metadata.annotations", f"Invalid value: {_q(key)}: {m}")
           for key in annotations for m in _qualified_name_errors(str(key).lower())]
    size = sum(len(str(k)) + len(str(v)) for k, v in annotations.items())
    if size > MAX_ANNOTATIONS:
        out.append(cause("FieldValueTooLong", "metadata.annotations",
                         f"Too long: must have at most {MAX_ANNOTATIONS} bytes"))
    return out


def validate_owner_references(meta: Obj) -> list[Obj]:
    """apimachinery's ValidateOwnerReferences, for every kind: apiVersion (with a version),
    kind, name and uid set; no Event as owner; at most one ``controller: true``.

    A handler that built a reference from a Reference-mode event (no uid) is refused here as
    on a cluster. The all-references value of the "only one controller" error is shortened
    (the real one prints Go pointers).
    """
    out = []
    field = "metadata.ownerReferences"
    controller = ""
    for ref in meta.get("ownerReferences") or []:
        api_version, kind = str(ref.get("apiVersion") or ""), str(ref.get("kind") or "")
        name, uid = str(ref.get("name") or ""), str(ref.get("uid") or "")
        parts = api_version.split("/")
        has_version = len(parts) <= 2 and bool(parts[-1])
        for key, value, ok in (("apiVersion", api_version, has_version), ("kind", kind, kind),
                               ("name", name, name), ("uid", uid, uid)):
            if not ok:
                rule = "version" if key == "apiVersion" else key
                out.append(cause("FieldValueInvalid", f"{field}.{key}",
                                 f"Invalid value: {_q(value)}: {rule} must not be empty"))
        if api_version == "v1" and kind == "Event":
            out.append(cause("FieldValueInvalid", field, "Invalid value: v1.OwnerReference{...}:"
                                                         " /v1, Kind=Event is disallowed from "
                                                         "being an owner"))
        if ref.get("controller") is True:
            if controller:
                out.append(cause("FieldValueInvalid", field,
                                 "Invalid value: []v1.OwnerReference{...}: Only one reference "
                                 "can have Controller set to true. Found \"true\" in "
                                 f"references for {controller} and {kind}/{name}"))
            else:
                controller = f"{kind}/{name}"
    return out


def validate_meta(meta: Obj) -> list[Obj]:
    """What the API server checks in the metadata of every kind, custom resources included."""
    return validate_labels(meta) + validate_annotations(meta) + validate_owner_references(meta)


def _go_map(labels: dict[str, str]) -> str:
    inner = ", ".join(f"{_q(k)}:{_q(v)}" for k, v in sorted(labels.items()))
    return f"map[string]string{{{inner}}}"


def _selector_matches(selector: Obj, labels: dict[str, str]) -> bool:
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
        if (op == "In" and labels.get(key) not in values) or \
                (op == "NotIn" and key in labels and labels[key] in values) or \
                (op == "Exists" and key not in labels) or \
                (op == "DoesNotExist" and key in labels):
            return False
    return True


def _workload(obj: Obj) -> list[Obj]:
    spec = obj.get("spec") or {}
    selector = spec.get("selector")
    if not selector:
        return [cause("FieldValueRequired", "spec.selector", "Required value")]
    if not (selector.get("matchLabels") or selector.get("matchExpressions")):
        return [cause("FieldValueInvalid", "spec.selector",
                      "Invalid value: \"null\": empty selector is invalid for deployment")]
    out = label_errors(selector.get("matchLabels") or {}, "spec.selector.matchLabels")
    labels = ((spec.get("template") or {}).get("metadata") or {}).get("labels") or {}
    if not _selector_matches(selector, labels):
        out.append(cause("FieldValueInvalid", "spec.template.metadata.labels",
                         f"Invalid value: {_go_map(labels)}: `selector` does not match "
                         "template `labels`"))
    return out + label_errors(labels, "spec.template.metadata.labels")


# -- Event ----------------------------------------------------------------------------------

def _event(event: Obj) -> list[Obj]:
    """core/v1 Event: its namespace must be the involved object's (kube-apiserver's
    legacyValidateEvent, on create and update).

    Without ``eventTime`` (how eventop and client-go's legacy recorder write them) an Event
    about a cluster-scoped object (empty ``involvedObject.namespace``) must live in "default";
    with ``eventTime`` "kube-system" is also accepted (its other rules are not modelled).
    """
    ns = str((event.get("metadata") or {}).get("namespace") or "")
    involved = str((event.get("involvedObject") or {}).get("namespace") or "")
    if involved:
        ok = ns == involved
    elif event.get("eventTime"):
        ok = ns in ("default", "kube-system")
    else:
        ok = ns in ("", "default")
    if ok:
        return []
    return [cause("FieldValueInvalid", "involvedObject.namespace",
                  f"Invalid value: {_q(involved)}: does not match event.namespace")]


# -- entry points ---------------------------------------------------------------------------

def _immutable_data(old: Obj, new: Obj) -> list[Obj]:
    if not old.get("immutable"):
        return []
    out = []
    if not new.get("immutable"):
        out.append(cause("FieldValueForbidden", "immutable", IMMUTABLE_SET))
    for key in ("data", "binaryData"):
        if (old.get(key) or {}) != (new.get(key) or {}):
            out.append(cause("FieldValueForbidden", key, IMMUTABLE_SET))
    return out


def _data_size(obj: Obj) -> list[Obj]:
    size = sum(len(k) + len(str(v)) for key in ("data", "binaryData")
               for k, v in (obj.get(key) or {}).items())
    if size > MAX_DATA:
        return [cause("FieldValueTooLong", "", f"Too long: must have at most {MAX_DATA} bytes")]
    return []


def prepare_secret(obj: Obj) -> None:
    """Fold ``stringData`` into ``data`` and refuse values that are not base64.

    The real server fails to decode such a body at all: 400 BadRequest.
    """
    obj.setdefault("type", "Opaque")
    for key, value in (obj.get("data") or {}).items():
        try:
            base64.b64decode(str(value), validate=True)
        except (binascii.Error, ValueError) as exc:
            raise ApiError(400, "BadRequest",
                           f'Secret in version "v1" cannot be handled as a Secret: illegal '
                           f'base64 data in data["{key}"]: {exc}') from exc
    string_data = obj.pop("stringData", None)
    if string_data:
        data = obj.setdefault("data", {})
        for key, value in string_data.items():
            data[key] = base64.b64encode(str(value).encode()).decode()


def _new_finalizers(old: Obj, meta: Obj) -> list[Obj]:
    """An object being deleted takes no new finalizer (it could then never go)."""
    old_meta = old.get("metadata") or {}
    if not old_meta.get("deletionTimestamp"):
        return []
    added = [f for f in meta.get("finalizers") or [] if f not in (old_meta.get("finalizers") or [])]
    if not added:
        return []
    found = "[]string{" + ", ".join(_q(f) for f in added) + "}"
    return [cause("FieldValueForbidden", "metadata.finalizers",
                  "Forbidden: no new finalizers can be added if the object is being deleted, "
                  f"found new finalizers {found}")]


def admit(res: ResourceType, new: Obj, old: Obj | None) -> None:
    """Raise 422 Invalid if ``new`` (replacing ``old``, None on create) breaks a rule."""
    meta = new.get("metadata") or {}
    causes: list[Obj] = []
    if old is None:
        causes += validate_name(res, str(meta.get("name", "")))
    causes += validate_meta(meta)
    if old is not None:
        causes += _new_finalizers(old, meta)
    kind = res.kind if res.group in ("", "apps", "batch") else ""
    if kind == "Job":
        causes += batch.job_causes(new, old)
    if kind == "CronJob":
        causes += batch.cronjob_causes(new)
    if kind in ("StatefulSet", "DaemonSet", "Deployment"):
        causes += _workload(new)
    if kind == "StatefulSet" and old is not None:
        mutable = ("replicas", "template", "updateStrategy",
                   "persistentVolumeClaimRetentionPolicy", "minReadySeconds")
        strip = lambda s: {k: v for k, v in (s or {}).items() if k not in mutable}  # noqa: E731
        if strip(old.get("spec")) != strip(new.get("spec")):
            causes.append(cause("FieldValueForbidden", "spec", STS_MUTABLE[len("spec: "):]))
    if kind == "PersistentVolumeClaim" and old is not None:
        causes += claims.pvc_update(old, new)
    if kind in ("ConfigMap", "Secret"):
        causes += _data_size(new)
        if old is not None:
            causes += _immutable_data(old, new)
    if kind == "Event":
        causes += _event(new)
    if kind == "Service" and old is not None:
        old_ip = (old.get("spec") or {}).get("clusterIP")
        new_ip = (new.get("spec") or {}).get("clusterIP")
        if old_ip and new_ip != old_ip:
            causes.append(cause("FieldValueInvalid", "spec.clusterIP",
                                f"Invalid value: {_q(new_ip)}: field is immutable"))
    if causes:
        raise errors.invalid(res.kind, res.group, str(meta.get("name", "")), causes)
