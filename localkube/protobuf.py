"""Kubernetes protobuf request bodies (``application/vnd.kubernetes.protobuf``) to JSON objects.

kubectl's typed commands (``create namespace|configmap|secret|serviceaccount|service|
deployment``, ...) send protobuf whatever the server, and client-go does not fall back to
JSON on a 415 (it only does for CBOR), so localkube reads it. A body is the magic
``k8s\\x00`` then a ``runtime.Unknown`` (apiVersion, kind, raw bytes of the typed message).

The typed messages are decoded with the field tables of ``proto_schema.py``, extracted from
the descriptors compiled into kube-apiserver v1.24 (``tests/localkube/extract_proto_schema.py``),
and turned into the JSON the same client would have sent: zero scalars dropped (Go's
``omitempty``; the few pointer fields where zero means something are kept), empty structs
kept (``"spec": {}``), ``bytes`` base64, Time as RFC 3339, IntOrString, Quantity, FieldsV1
and RawExtension in their JSON forms. No protobuf library on PyPI ships the Kubernetes
messages for current protobuf runtimes (``k8s-proto`` stops at core/v1 of 2019 and needs
protobuf<4), hence this small decoder.
"""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime
from typing import Any

from eventop.localkube.errors import ApiError
from eventop.localkube.proto_schema import MESSAGES, PACKAGES

MAGIC = b"k8s\x00"
CONTENT_TYPE = "application/vnd.kubernetes.protobuf"
META = "k8s.io.apimachinery.pkg.apis.meta.v1."
# Pointer fields whose zero value differs from unset (``replicas: 0``, ``automount...: false``).
KEEP_ZERO = frozenset({"replicas", "automountServiceAccountToken", "enableServiceLinks",
                       "allowPrivilegeEscalation", "readOnlyRootFilesystem", "runAsNonRoot",
                       "privileged", "hostUsers", "setHostnameAsFQDN", "shareProcessNamespace",
                       "immutable", "paused", "optional", "minReadySeconds",
                       "terminationGracePeriodSeconds", "activeDeadlineSeconds"})


class ProtobufError(ValueError):
    """The body is not a Kubernetes protobuf message localkube can read."""


def wire_fields(data: bytes) -> list[tuple[int, int, Any]]:
    """The (field number, wire type, value) triples of one protobuf message."""
    out: list[tuple[int, int, Any]] = []
    pos, end = 0, len(data)
    while pos < end:
        key, pos = _varint(data, pos)
        number, wtype = key >> 3, key & 7
        if wtype == 0:
            value, pos = _varint(data, pos)
        elif wtype == 2:
            size, pos = _varint(data, pos)
            if pos + size > end:
                raise ProtobufError("a length-delimited field runs past the end of the body")
            value, pos = data[pos:pos + size], pos + size
        elif wtype == 1:
            value, pos = int.from_bytes(data[pos:pos + 8], "little"), pos + 8
        elif wtype == 5:
            value, pos = int.from_bytes(data[pos:pos + 4], "little"), pos + 4
        else:
            raise ProtobufError(f"wire type {wtype} (groups) is not used by Kubernetes")
        if number == 0 or pos > end:
            raise ProtobufError("truncated or corrupt protobuf message")
        out.append((number, wtype, value))
    return out


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data):
            raise ProtobufError("truncated varint")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise ProtobufError("varint longer than 64 bits")


def decode_request(body: bytes) -> dict[str, Any]:
    """The JSON object a ``k8s\\x00`` protobuf request body carries (400 if unreadable)."""
    try:
        return _decode_envelope(body)
    except ProtobufError as exc:
        raise ApiError(400, "BadRequest",
                       f"the request body is not a Kubernetes protobuf object localkube can "
                       f"read: {exc}; send it as JSON instead (for kubectl: write it with "
                       f"-o yaml --dry-run=client and apply the file)") from exc


def _decode_envelope(body: bytes) -> dict[str, Any]:
    if not body.startswith(MAGIC):
        raise ProtobufError("it does not start with the k8s\\x00 magic")
    api_version = kind = ""
    raw = b""
    for number, _, value in wire_fields(body[len(MAGIC):]):
        if number == 1:  # typeMeta
            for sub, _, text in wire_fields(value):
                if sub == 1:
                    api_version = text.decode()
                elif sub == 2:
                    kind = text.decode()
        elif number == 2:
            raw = value
    group = api_version.rpartition("/")[0]
    package = PACKAGES.get(group if "/" in api_version else "")
    name = f"{package}.{kind}" if package else ""
    if name not in MESSAGES:
        name = META + kind  # DeleteOptions and other meta.k8s.io types
    if name not in MESSAGES:
        raise ProtobufError(f"no protobuf schema for {kind} in {api_version or 'no apiVersion'}")
    obj = decode_message(name, raw)
    return {"kind": kind, "apiVersion": api_version, **obj}


def decode_message(name: str, data: bytes) -> Any:
    """One message as JSON (special Kubernetes types become their JSON forms)."""
    special = SPECIAL.get(name)
    if special is not None:
        return special(wire_fields(data))
    fields = MESSAGES[name]
    out: dict[str, Any] = {}
    for number, wtype, value in wire_fields(data):
        spec = fields.get(number)
        if spec is None:
            if value in (0, b""):
                continue  # a zero field this version does not know: nothing lost
            raise ProtobufError(f"{name.rsplit('.', 1)[-1]} has no field {number} in "
                                "Kubernetes v1.24")
        json_name, ftype, repeated = spec
        if ftype.startswith("map:"):
            key, item = _map_entry(ftype[4:], value)
            out.setdefault(json_name, {})[key] = item
            continue
        decoded = _scalar(ftype, wtype, value, name, json_name)
        if repeated:
            out.setdefault(json_name, []).append(decoded)
        elif decoded is not None:
            out[json_name] = decoded
        else:
            out.pop(json_name, None)
    return {k: v for k, v in out.items()
            if not _is_zero(v) or k in KEEP_ZERO or isinstance(v, dict | list)}


def _map_entry(value_type: str, data: bytes) -> tuple[str, Any]:
    key, item = "", _zero(value_type)
    for number, wtype, value in wire_fields(data):
        if number == 1:
            key = value.decode()
        elif number == 2:
            item = _scalar(value_type, wtype, value, "map", key)
    return key, item


def _scalar(ftype: str, wtype: int, value: Any, message: str, field: str) -> Any:
    expected = 2 if ftype in ("string", "bytes") or ftype.startswith("msg:") else \
        1 if ftype == "double" else 5 if ftype == "float" else 0
    if wtype != expected:
        raise ProtobufError(f"field {field} of {message.rsplit('.', 1)[-1]} has wire type "
                            f"{wtype}, expected {expected}")
    if ftype == "string":
        return value.decode()
    if ftype == "bytes":
        return base64.b64encode(value).decode()
    if ftype == "bool":
        return bool(value)
    if ftype == "int":
        return value - (1 << 64) if value >= 1 << 63 else value
    if ftype in ("double", "float"):
        import struct

        return struct.unpack("<d" if ftype == "double" else "<f",
                             value.to_bytes(8 if ftype == "double" else 4, "little"))[0]
    return decode_message(ftype[4:], value)


def _zero(ftype: str) -> Any:
    return {"string": "", "bytes": "", "bool": False, "int": 0}.get(ftype)


def _is_zero(value: Any) -> bool:
    return value in ("", 0, False) and not isinstance(value, dict | list)


def _time(fields: list[tuple[int, int, Any]], micro: bool = False) -> str | None:
    values = {n: v for n, _, v in fields}
    seconds, nanos = values.get(1, 0), values.get(2, 0)
    if not seconds and not nanos:
        return None
    when = datetime.fromtimestamp(seconds, UTC)
    if micro:
        return when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{nanos // 1000:06d}Z"
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def _int_or_string(fields: list[tuple[int, int, Any]]) -> int | str:
    values = {n: v for n, _, v in fields}
    if values.get(1, 0) == 1:
        return bytes(values.get(3, b"")).decode()
    return int(values.get(2, 0))


def _raw_json(fields: list[tuple[int, int, Any]]) -> Any:
    raw = next((v for n, _, v in fields if n == 1), b"")
    return json.loads(raw) if raw else None


def _quantity(fields: list[tuple[int, int, Any]]) -> str:
    return next((v.decode() for n, _, v in fields if n == 1), "0")


def _duration(fields: list[tuple[int, int, Any]]) -> str:
    nanos = next((v for n, _, v in fields if n == 1), 0)
    return f"{nanos / 1e9:g}s"


SPECIAL = {
    META + "Time": _time,
    META + "MicroTime": lambda f: _time(f, micro=True),
    META + "FieldsV1": _raw_json,
    META + "Duration": _duration,
    "k8s.io.apimachinery.pkg.runtime.RawExtension": _raw_json,
    "k8s.io.apimachinery.pkg.util.intstr.IntOrString": _int_or_string,
    "k8s.io.apimachinery.pkg.api.resource.Quantity": _quantity,
}
