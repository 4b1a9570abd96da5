"""PartialObjectMetadata(List): objects cut down to their metadata, as the real server does.

Metadata-only informers (client-go's metadata client, eventop's informer cache) ask for
them with ``Accept: application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1`` on
lists and ``as=PartialObjectMetadata`` on gets and watches. The metadata is written as the
typed ObjectMeta (field order, ``creationTimestamp: null`` when unset), also for custom
resources, and an empty list has ``"items": null`` (all recorded in
``tests/recordings/kubectl/metadata/``).
"""

from __future__ import annotations

from typing import Any

from eventop.localkube.errors import ApiError
from eventop.localkube.objects import META_ORDER
from eventop.localkube.resources import ResourceType

Obj = dict[str, Any]

MANAGED_FIELDS_ORDER = ("manager", "operation", "apiVersion", "time", "fieldsType", "fieldsV1",
                        "subresource")
OWNER_REFERENCE_ORDER = ("apiVersion", "kind", "name", "uid", "controller",
                         "blockOwnerDeletion")
# The Go package of each group's internal types, as the real server names them in a 406.
INTERNAL_PACKAGES = {"": "core", "apps": "apps", "coordination.k8s.io": "coordination",
                     "apiextensions.k8s.io": "apiextensions"}


def typed_meta(meta: Obj) -> Obj:
    """``meta`` with the key order (and null creationTimestamp) of the typed ObjectMeta."""
    out: Obj = {}
    for key in META_ORDER:
        if key == "creationTimestamp":
            out[key] = meta.get(key)
        elif key == "managedFields" and key in meta:
            out[key] = [_ordered(e, MANAGED_FIELDS_ORDER) for e in meta[key]]
        elif key == "ownerReferences" and key in meta:
            out[key] = [_ordered(r, OWNER_REFERENCE_ORDER) for r in meta[key]]
        elif key in meta:
            out[key] = meta[key]
    return out


def partial(obj: Obj, api_version: str = "meta.k8s.io/v1") -> Obj:
    return {"kind": "PartialObjectMetadata", "apiVersion": api_version,
            "metadata": typed_meta(obj.get("metadata") or {})}


def partial_list(items: list[Obj], list_meta: Obj, api_version: str = "meta.k8s.io/v1") -> Obj:
    meta = {k: v for k, v in list_meta.items() if v != ""}  # typed ListMeta: omitempty
    return {"kind": "PartialObjectMetadataList", "apiVersion": api_version, "metadata": meta,
            "items": [partial(i, api_version) for i in items] or None}


def go_type(res: ResourceType, is_list: bool) -> str:
    """How the real server names the Go type behind ``res`` in its 406 messages."""
    if res.custom:
        return "*unstructured.UnstructuredList" if is_list else "*unstructured.Unstructured"
    package = INTERNAL_PACKAGES.get(res.group, res.group.split(".")[0])
    return f"*{package}.{res.list_kind if is_list else res.kind}"


def wrong_shape(wanted: str, res: ResourceType, *, is_list: bool) -> ApiError:
    """406 for a list asked for as an object, or an object asked for as a list."""
    shape = "is a list" if is_list else "is not a list"
    return ApiError(406, "NotAcceptable",
                    f"you requested {wanted}, but the requested object {shape} "
                    f"({go_type(res, is_list)})")


def _ordered(entry: Obj, order: tuple[str, ...]) -> Obj:
    out = {k: entry[k] for k in order if k in entry}
    out.update({k: v for k, v in entry.items() if k not in out})
    return out
