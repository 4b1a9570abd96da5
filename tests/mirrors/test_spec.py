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
])
def test_invalid_upstreams_are_refused_with_a_hint(upstream: str, hint: str) -> None:
    with pytest.raises(SpecError, match=hint) as info:
        validate_upstream(upstream)
    assert info.value.reason == "InvalidUpstream"


@pytest.mark.parametrize(("spec", "reason"), [
    ({"upstream": "https://quay.io", "ttl": "7d"}, "InvalidTTL"),
    ({"upstream": "https://quay.io", "hostPort": 0}, "InvalidHostPort"),
    ({"upstream": "https://quay.io", "hostPort": "5000"}, "InvalidHostPort"),
    ({"upstream": "https://quay.io", "storage": {"size": "lots"}}, "InvalidStorageSize"),
    ({"upstream": "https://quay.io", "storage": {"size": "0"}}, "InvalidStorageSize"),
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
