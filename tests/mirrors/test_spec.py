"""What a RegistryMirror asks for: defaults applied, every field checked, and what is invalid
refused with the engine's SpecError naming the field (so the user sees what to fix)."""

from __future__ import annotations

from typing import Any

import pytest

from eventop.engine import SpecError
from eventop.handlers.mirrors.spec import parse_quantity, parse_spec, validate_upstream

Obj = dict[str, Any]


@pytest.mark.parametrize(("upstream", "expected"), [
    ("https://registry-1.docker.io", "https://registry-1.docker.io"),
    ("https://quay.io/", "https://quay.io"),
    ("http://registry.local:5000", "http://registry.local:5000"),
    ("https://[fd00::1]:443", "https://[fd00::1]:443"),
])
def test_valid_upstreams_are_normalised(upstream: str, expected: str) -> None:
    assert validate_upstream(upstream) == expected


@pytest.mark.parametrize(("upstream", "hint"), [
    ("registry-1.docker.io", "https://"),
    ("ftp://quay.io", "https://"),
    ("https://", "host"),
    ("https://user:secret@quay.io", "credentialsSecretRef"),
    ("https://quay.io/some/path", "path"),
    ("https://quay.io:notaport", "not a URL"),
    ("", "required"),
    ("https://quay.io:0", "port 0"),
])
def test_invalid_upstreams_are_refused_with_a_hint(upstream: str, hint: str) -> None:
    with pytest.raises(SpecError, match=hint) as info:
        validate_upstream(upstream)
    assert info.value.reason == "InvalidUpstream"


@pytest.mark.parametrize(("spec", "reason"), [
    ({"upstream": "https://quay.io", "ttl": "7d"}, "InvalidTTL"),
    ({"upstream": "https://quay.io", "ttl": "99999999999h"}, "InvalidTTL"),  # Go overflows
    ({"upstream": "https://quay.io", "storage": {"size": "999999999999999999999999999Ei"}},
     "InvalidStorageSize"),  # the API server would cut it down to 2**63-1
    ({"upstream": "https://quay.io", "hostPort": 0}, "InvalidHostPort"),
    ({"upstream": "https://quay.io", "hostPort": "5000"}, "InvalidHostPort"),
    ({"upstream": "https://quay.io", "storage": {"size": "lots"}}, "InvalidStorageSize"),
    ({"upstream": "https://quay.io", "storage": {"size": "0"}}, "InvalidStorageSize"),
    ({"upstream": "https://quay.io", "storage": {"size": "1.5"}}, "InvalidStorageSize"),
    ({"upstream": "https://quay.io", "storage": {"size": "1500m"}}, "InvalidStorageSize"),
    ({"upstream": "https://quay.io", "credentialsSecretRef": {"name": "Bad_Name"}},
     "InvalidCredentialsSecretRef"),
    ({"upstream": "https://quay.io", "credentialsSecretRef": {"name": "a" * 254}},
     "InvalidCredentialsSecretRef"),
])
def test_invalid_specs_name_the_field(spec: Obj, reason: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_spec({"metadata": {"name": "x", "namespace": "y"}, "spec": spec})
    assert info.value.reason == reason


@pytest.mark.parametrize(("a", "b"), [("20Gi", "50Gi"), ("1G", "1Gi"), ("500Mi", "1Gi"),
                                      ("1.5Gi", "2Gi"), ("1e9", "1Gi")])
def test_quantities_compare_by_amount(a: str, b: str) -> None:
    assert parse_quantity(a) < parse_quantity(b)
    assert parse_quantity("1Gi") == parse_quantity("1024Mi")


@pytest.mark.parametrize(("field", "image"), [
    ("registry", "docker.io/library/registry:3.0.0 "),
    ("proxy", " nginx:1.28 "),
    ("proxy", "nginx :1.28"),
    ("registry", "docker.io/Library/registry:3.0.0"),
    ("registry", "registry:3.0.0:extra"),
    ("proxy", 28),
])
def test_images_kubernetes_or_a_runtime_would_refuse_are_an_invalid_spec(
        field: str, image: Any) -> None:
    """Refused before anything is applied: with whitespace the API server takes the
    StatefulSet, whose controller then deletes the running pod and can not create one."""
    with pytest.raises(SpecError, match=f"spec.image.{field}") as info:
        parse_spec({"metadata": {"name": "x", "namespace": "y"},
                    "spec": {"upstream": "https://quay.io", "image": {field: image}}})
    assert info.value.reason == "InvalidImage"


@pytest.mark.parametrize("image", [
    "nginx", "nginx:1.28", "localhost:5000/team/nginx:1.28-alpine",
    "registry.example.com/a/b@sha256:" + "0" * 64, "quay.io/x/y:v1.2.3_rc.1",
])
def test_ordinary_image_references_are_accepted_as_written(image: str) -> None:
    spec = parse_spec({"metadata": {"name": "x", "namespace": "y"},
                       "spec": {"upstream": "https://quay.io",
                                "image": {"registry": image, "proxy": image}}})
    assert (spec.registry_image, spec.proxy_image) == (image, image)


@pytest.mark.parametrize(("size", "amount"), [("1.5Gi", 1610612736), ("1.5k", 1500),
                                              ("20Gi", 21474836480)])
def test_a_fractional_size_is_fine_when_it_is_a_whole_number_of_bytes(
        size: str, amount: int) -> None:
    spec = parse_spec({"metadata": {"name": "x", "namespace": "y"},
                       "spec": {"upstream": "https://quay.io", "storage": {"size": size}}})
    assert parse_quantity(spec.size) == amount


@pytest.mark.parametrize(("ttl", "zero"), [("2562047h", False), ("0s", True), ("0h0m", True),
                                          ("9223372036854775807ns", False), ("1h30m", False)])
def test_the_longest_go_duration_is_still_a_ttl(ttl: str, zero: bool) -> None:
    spec = parse_spec({"metadata": {"name": "x", "namespace": "y"},
                       "spec": {"upstream": "https://quay.io", "ttl": ttl}})
    assert spec.ttl == ttl and spec.expiry_enabled == (not zero)
