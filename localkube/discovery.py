"""What the local API server says about itself: version, health, discovery and OpenAPI.

The documents clients read before they touch an object: ``/version``, the probes, the
discovery lists (``/api``, ``/apis``, a group, a group version's resources) and the OpenAPI v3
index and documents, all derived from the kinds the store serves at the moment of the request
(a CRD installed a moment ago is listed at once, as on a real server).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from eventop.localkube import openapi
from eventop.localkube.errors import ApiError
from eventop.localkube.resources import ResourceType

if TYPE_CHECKING:
    from eventop.localkube.store import Obj, Store

VERSION = {"major": "1", "minor": "24", "gitVersion": "v1.24.0-localkube",
           "gitCommit": "localkube", "gitTreeState": "clean", "buildDate": "2022-05-03T13:38:19Z",
           "goVersion": "go1.18.1", "compiler": "gc", "platform": "linux/amd64"}


def document(store: Store, parts: list[str], address: str) -> Any:
    """The document at the path ``/<parts>`` (``address``: the server's, as discovery names
    it), or None when the path is not one of these (an object path, say)."""
    if parts in (["healthz"], ["readyz"], ["livez"]):
        return b"ok"
    if parts == ["version"]:
        return VERSION
    if parts[:2] == ["openapi", "v3"]:
        return _openapi(store, parts[2:])
    if parts[:2] == ["openapi", "v2"]:
        raise ApiError(404, "NotFound", "localkube serves OpenAPI v3 only (/openapi/v3), "
                       "and validates fields itself (fieldValidation)", {})
    if parts == ["api"]:
        return {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [
            {"clientCIDR": "0.0.0.0/0", "serverAddress": address}]}
    if parts == ["apis"]:
        groups = []
        with store.lock:
            served = store.table.group_versions()
        for group, versions in sorted(served.items()):
            if group:
                groups.append(_group(group, versions))
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}
    if len(parts) == 2 and parts[0] == "apis":
        with store.lock:
            versions = store.table.group_versions().get(parts[1])
        if versions:
            return {"kind": "APIGroup", "apiVersion": "v1", **_group(parts[1], versions)}
    gv = None
    if len(parts) == 2 and parts[0] == "api":
        gv = ("", parts[1])
    elif len(parts) == 3 and parts[0] == "apis":
        gv = (parts[1], parts[2])
    if gv is not None:
        with store.lock:
            resources = [r for r in store.table.all() if (r.group, r.version) == gv]
        if not resources:
            raise ApiError(404, "NotFound",
                           "the server could not find the requested resource", {})
        return {"kind": "APIResourceList", "apiVersion": "v1",
                "groupVersion": f"{gv[0]}/{gv[1]}" if gv[0] else gv[1],
                "resources": [e for r in sorted(resources, key=lambda r: r.plural)
                              for e in r.discovery()]}
    return None


def _openapi(store: Store, rest: list[str]) -> Obj:
    with store.lock:
        served: dict[tuple[str, str], list[ResourceType]] = {}
        for res in store.table.all():
            served.setdefault((res.group, res.version), []).append(res)
    if not rest:
        return openapi.index(served)
    for (group, version), resources in served.items():
        if rest == openapi.group_version_path(group, version).split("/"):
            return openapi.document(resources)
    raise ApiError(404, "NotFound", "the server could not find the requested resource", {})


def _group(group: str, versions: list[str]) -> Obj:
    gvs = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
    return {"name": group, "versions": gvs, "preferredVersion": gvs[0]}
