"""Protobuf request bodies (what kubectl's typed commands send) decode to the JSON a client
would have sent, and what localkube cannot read is a 400 that says what to do instead."""

from __future__ import annotations

import pytest
import requests

from eventop.localkube import LocalKube
from eventop.localkube.errors import ApiError
from eventop.localkube.protobuf import decode_message, decode_request, wire_fields

# `kubectl create namespace foo` (kubectl 1.37.1), copied from its -v=9 request log.
KUBECTL_CREATE_NS = bytes.fromhex(
    "6b3873000a0f0a02763112094e616d657370616365121b0a130a03666f6f12001a0022002a0032003800"
    "420012001a020a001a002200")


def field(number: int, payload: bytes | int) -> bytes:
    """One protobuf field: length-delimited for bytes, varint for ints."""
    if isinstance(payload, int):
        return bytes([number << 3]) + varint(payload)
    return bytes([number << 3 | 2]) + varint(len(payload)) + payload


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def envelope(api_version: str, kind: str, raw: bytes) -> bytes:
    type_meta = field(1, api_version.encode()) + field(2, kind.encode())
    return b"k8s\x00" + field(1, type_meta) + field(2, raw) + field(3, b"") + field(4, b"")


def test_kubectls_create_namespace_body_decodes_to_the_namespace() -> None:
    assert decode_request(KUBECTL_CREATE_NS) == {
        "kind": "Namespace", "apiVersion": "v1", "metadata": {"name": "foo"},
        "spec": {}, "status": {}}


def test_maps_bytes_and_immutable_of_a_secret() -> None:
    meta = field(1, b"creds") + field(11, field(1, b"app") + field(2, b"web"))
    raw = (field(1, meta) + field(2, field(1, b"token") + field(2, b"\x00\xffbin"))
           + field(3, b"Opaque") + field(5, 0))
    assert decode_request(envelope("v1", "Secret", raw)) == {
        "kind": "Secret", "apiVersion": "v1",
        "metadata": {"name": "creds", "labels": {"app": "web"}},
        "data": {"token": "AP9iaW4="}, "type": "Opaque", "immutable": False}


def test_special_types_take_their_json_forms() -> None:
    port = field(1, b"http") + field(3, 80) + field(4, field(1, 1) + field(3, b"web"))
    assert decode_message("k8s.io.api.core.v1.ServicePort", port) == {
        "name": "http", "port": 80, "targetPort": "web"}
    numeric = field(3, 80) + field(4, field(1, 0) + field(2, 8080))
    assert decode_message("k8s.io.api.core.v1.ServicePort", numeric)["targetPort"] == 8080
    resources = field(1, field(1, b"memory") + field(2, field(1, b"64Mi")))
    assert decode_message("k8s.io.api.core.v1.ResourceRequirements", resources) == {
        "limits": {"memory": "64Mi"}}
    stamp = field(8, field(1, 1700000000))
    assert decode_message("k8s.io.apimachinery.pkg.apis.meta.v1.ObjectMeta", stamp) == {
        "creationTimestamp": "2023-11-14T22:13:20Z"}


def test_zero_replicas_survive_but_other_zero_scalars_are_omitted() -> None:
    spec = field(1, 0) + field(3, field(1, field(1, b"x") + field(2, b"")))
    decoded = decode_message("k8s.io.api.apps.v1.DeploymentSpec", spec)
    assert decoded == {"replicas": 0, "template": {"metadata": {"name": "x"}}}


@pytest.mark.parametrize("body,says", [
    (b"not protobuf", "k8s\\x00 magic"),
    (KUBECTL_CREATE_NS[:20], "past the end"),
    (envelope("batch/v1", "Job", b""), "no protobuf schema for Job in batch/v1"),
    (envelope("v1", "ConfigMap", field(9, b"x")), "ConfigMap has no field 9"),
])
def test_unreadable_bodies_are_a_400_saying_to_send_json(body: bytes, says: str) -> None:
    with pytest.raises(ApiError) as caught:
        decode_request(body)
    assert caught.value.code == 400
    assert says in caught.value.message and "send it as JSON" in caught.value.message


def test_wire_fields_reads_every_wire_type() -> None:
    data = field(1, 150) + bytes([2 << 3 | 1]) + (7).to_bytes(8, "little") + \
        bytes([3 << 3 | 5]) + (9).to_bytes(4, "little") + field(4, b"ab")
    assert wire_fields(data) == [(1, 0, 150), (2, 1, 7), (3, 5, 9), (4, 2, b"ab")]


def test_a_protobuf_create_over_http_stores_the_object(lk: LocalKube) -> None:
    resp = requests.post(lk.url + "/api/v1/namespaces", data=KUBECTL_CREATE_NS, timeout=10,
                         headers={"Content-Type": "application/vnd.kubernetes.protobuf",
                                  "Accept": "application/vnd.kubernetes.protobuf,"
                                            "application/json"})
    assert resp.status_code == 201, resp.text
    assert resp.headers["Content-Type"] == "application/json"
    stored = lk.get("v1", "Namespace", "foo")
    assert stored is not None and stored["status"] == {"phase": "Active"}
