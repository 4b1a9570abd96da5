"""OpenAPI v3 (``/openapi/v3``) and server-side field validation (``fieldValidation``).

kubectl reads ``/openapi/v3`` for ``explain`` and, before ``apply``/``create -f``, to learn
whether the server validates fields itself: when the PATCH operation of a kind lists the
``fieldValidation`` parameter, kubectl sends ``fieldValidation=Strict`` and leaves the
check to the server (as with every server since v1.25); otherwise it validates against
``/openapi/v2`` in protobuf, which localkube does not serve. So localkube advertises the
parameter and refuses unknown fields itself, with the message of the v1.24 server run with
its (alpha, off by default) ServerSideFieldValidation gate on (recorded in
``tests/recordings/kubectl/validation/``). A real v1.24 ignores the parameter and kubectl
validates client-side: the same typo is refused, worded differently.

Schemas: the built-in kinds' are the real v1.24 ones (``openapi-v1.24.json.gz``, recorded by
``tests/localkube/record_kubectl.py``); a custom resource's come from its CRD, shaped as the
apiextensions server publishes them.
"""

from __future__ import annotations

import copy
import gzip
import hashlib
import json
from functools import cache
from pathlib import Path
from typing import Any

from eventop.localkube.errors import ApiError
from eventop.localkube.resources import ResourceType

Obj = dict[str, Any]
DATA = Path(__file__).with_name("openapi-v1.24.json.gz")
META = "io.k8s.apimachinery.pkg.apis.meta.v1."
DIRECTIVES = ("Strict", "Warn", "Ignore")
API_VERSION_DOC = (
    "APIVersion defines the versioned schema of this representation of an object. Servers "
    "should convert recognized schemas to the latest internal value, and may reject "
    "unrecognized values. More info: https://git.k8s.io/community/contributors/devel/"
    "sig-architecture/api-conventions.md#resources")
KIND_DOC = (
    "Kind is a string value representing the REST resource this object represents. Servers "
    "may infer this from the endpoint the client submits requests to. Cannot be updated. In "
    "CamelCase. More info: https://git.k8s.io/community/contributors/devel/"
    "sig-architecture/api-conventions.md#types-kinds")
METADATA_DOC = ("Standard object's metadata. More info: https://git.k8s.io/community/"
                "contributors/devel/sig-architecture/api-conventions.md#metadata")
QUERY = {"dryRun": "When present, indicates that modifications should not be persisted.",
         "fieldManager": "fieldManager is a name associated with the actor or entity that is "
                         "making these changes.",
         "fieldValidation": "fieldValidation instructs the server on how to handle objects "
                            "in the request containing unknown or duplicate fields: Ignore, "
                            "Warn or Strict.",
         "force": "Force is going to \"force\" Apply requests."}


@cache
def builtin_schemas() -> dict[str, Obj]:
    """The recorded component schemas ({} if the data file was not installed)."""
    if not DATA.exists():
        return {}
    return json.loads(gzip.decompress(DATA.read_bytes()))


def schema_name(res: ResourceType) -> str:
    """The component name of ``res``: io.k8s.api.core.v1.ConfigMap, dev.eventop.v1.CopyRule."""
    if res.custom:
        return ".".join([*reversed(res.group.split(".")), res.version, res.kind])
    for name, schema in builtin_schemas().items():
        for gvk in schema.get("x-kubernetes-group-version-kind", []):
            if (gvk["group"], gvk["version"], gvk["kind"]) == (res.group, res.version,
                                                               res.kind):
                return name
    return ""


def custom_schema(res: ResourceType) -> Obj:
    """A CRD version's schema as the apiextensions server publishes it."""
    schema = copy.deepcopy(res.schema or {"type": "object",
                                           "x-kubernetes-preserve-unknown-fields": True})
    props = schema.setdefault("properties", {})
    props["apiVersion"] = {"description": API_VERSION_DOC, "type": "string"}
    props["kind"] = {"description": KIND_DOC, "type": "string"}
    props["metadata"] = {"description": METADATA_DOC,
                         "allOf": [{"$ref": f"#/components/schemas/{META}ObjectMeta"}]} \
        if builtin_schemas() else {"description": METADATA_DOC, "type": "object"}
    schema["x-kubernetes-group-version-kind"] = [
        {"group": res.group, "kind": res.kind, "version": res.version}]
    return schema


def components(resources: list[ResourceType]) -> dict[str, Obj]:
    """The schemas of ``resources`` and every schema they refer to."""
    known = builtin_schemas()
    out: dict[str, Obj] = {}
    todo: list[str] = []
    for res in resources:
        name = schema_name(res)
        if res.custom:
            out[name] = custom_schema(res)
            todo += _refs(out[name])
        elif name:
            todo.append(name)
    while todo:
        name = todo.pop()
        if name not in out and name in known:
            out[name] = known[name]
            todo += _refs(known[name])
    return dict(sorted(out.items()))


def group_version_path(group: str, version: str) -> str:
    return f"apis/{group}/{version}" if group else f"api/{version}"


def document(resources: list[ResourceType]) -> Obj:
    """The OpenAPI v3 document of one group version."""
    paths: Obj = {}
    for res in sorted(resources, key=lambda r: r.plural):
        base = "/" + group_version_path(res.group, res.version)
        scope = f"{base}/namespaces/{{namespace}}" if res.namespaced else base
        gvk = {"group": res.group, "version": res.version, "kind": res.kind}
        ref = {"$ref": f"#/components/schemas/{schema_name(res)}"}
        content = {"application/json": {"schema": ref}}
        patch_types = ["application/apply-patch+yaml", "application/json-patch+json",
                       "application/merge-patch+json"]
        if not res.custom:
            patch_types.append("application/strategic-merge-patch+json")
        paths[f"{scope}/{res.plural}/{{name}}"] = {
            "get": {"responses": {"200": {"description": "OK", "content": content}},
                    "x-kubernetes-action": "get", "x-kubernetes-group-version-kind": gvk},
            "patch": {"parameters": [_param(p) for p in QUERY],
                      "requestBody": {"content": {t: {"schema": {"type": "object"}}
                                                  for t in patch_types}},
                      "responses": {"200": {"description": "OK", "content": content}},
                      "x-kubernetes-action": "patch", "x-kubernetes-group-version-kind": gvk},
        }
        paths[f"{scope}/{res.plural}"] = {
            "post": {"parameters": [_param(p) for p in ("dryRun", "fieldManager",
                                                        "fieldValidation")],
                     "requestBody": {"content": content},
                     "responses": {"201": {"description": "Created", "content": content}},
                     "x-kubernetes-action": "post", "x-kubernetes-group-version-kind": gvk}}
    return {"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": "v1.24.0"},
            "paths": paths, "components": {"schemas": components(resources)}}


def index(served: dict[tuple[str, str], list[ResourceType]]) -> Obj:
    """``/openapi/v3``: one entry per group version, its URL carrying the document's hash."""
    paths = {}
    for (group, version), resources in sorted(served.items()):
        path = group_version_path(group, version)
        digest = hashlib.sha512(json.dumps(document(resources), sort_keys=True).encode())
        paths[path] = {"serverRelativeURL": f"/openapi/v3/{path}?hash="
                                            f"{digest.hexdigest().upper()}"}
    return {"paths": paths}


def _param(name: str) -> Obj:
    return {"name": name, "in": "query", "description": QUERY[name],
            "schema": {"type": "string", "uniqueItems": True}}


def _refs(schema: Any) -> list[str]:
    if isinstance(schema, dict):
        ref = schema.get("$ref")
        found = [ref.rsplit("/", 1)[-1]] if isinstance(ref, str) else []
        return found + [r for k, v in schema.items() if k != "$ref" for r in _refs(v)]
    if isinstance(schema, list):
        return [r for v in schema for r in _refs(v)]
    return []


# -- server-side field validation -------------------------------------------------------


def check_fields(res: ResourceType, body: Any, directive: str | None) -> list[str]:
    """Apply ``fieldValidation``: 400 under Strict, the Warning texts under Warn."""
    if not directive or directive == "Ignore" or not isinstance(body, dict):
        return []
    if directive not in DIRECTIVES:
        raise ApiError(400, "BadRequest",
                       f'fieldValidation must be one of "Ignore", "Warn" or "Strict", '
                       f'not "{directive}"')
    schema = custom_schema(res) if res.custom else builtin_schemas().get(schema_name(res))
    if schema is None:
        return []
    unknown = unknown_fields(schema, body, builtin_schemas(), "")
    if not unknown:
        return []
    if directive == "Strict":
        listed = ", ".join(f'unknown field "{p}"' for p in unknown)
        raise ApiError(400, "BadRequest",
                       f'{res.kind} in version "{res.version}" cannot be handled as a '
                       f"{res.kind}: strict decoding error: {listed}")
    return [f'unknown field "{p}"' for p in unknown]


def unknown_fields(schema: Obj, value: Any, known: dict[str, Obj], path: str) -> list[str]:
    """Paths of ``value`` that ``schema`` does not declare, in document order."""
    schema = _resolve(schema, known)
    if schema.get("x-kubernetes-preserve-unknown-fields") or value is None:
        return []
    if isinstance(value, dict):
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        found: list[str] = []
        for key, item in value.items():
            sub = f"{path}.{key}" if path else key
            if props is not None and key in props:
                found += unknown_fields(props[key], item, known, sub)
            elif isinstance(extra, dict):
                found += unknown_fields(extra, item, known, sub)
            elif props is not None or extra is False:
                found.append(sub)
        return found
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [p for i, item in enumerate(value)
                for p in unknown_fields(schema["items"], item, known, f"{path}[{i}]")]
    return []


def _resolve(schema: Obj, known: dict[str, Obj]) -> Obj:
    for _ in range(20):
        ref = schema.get("$ref") or next(
            (s.get("$ref") for s in schema.get("allOf") or [] if isinstance(s, dict)), None)
        if not isinstance(ref, str):
            return schema
        target = known.get(ref.rsplit("/", 1)[-1])
        if target is None:
            return {"x-kubernetes-preserve-unknown-fields": True}
        schema = target
    return schema
