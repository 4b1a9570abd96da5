"""What a RegistryMirror asks for: its spec with the CRD's defaults applied and every field
checked, as a :class:`MirrorSpec` (pure; no I/O).

The API server validates the CRD schema too, but the handler does not rely on it: the CRD
may be an older version, and what a schema can not say is checked here (an upstream URL
the registry would silently cut down to its host, a TTL Go would refuse). Anything invalid
raises :class:`eventop.engine.SpecError` with a reason naming the field (``InvalidUpstream``,
``InvalidHostPort``, ``InvalidStorageSize``, ``InvalidTTL``, ``InvalidImage``,
``InvalidCredentialsSecretRef``); the engine reports it on the mirror (``Ready=False``,
``Degraded=True``, one Warning Event) and touches none of its objects. Whatever the API
server or the kubelet would refuse only once a workload exists is refused here: an image
name with whitespace is accepted into a StatefulSet's template, and its controller then
deletes the running pod before it finds it can not create the new one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal
from typing import Any
from urllib.parse import urlsplit

from kubernetes.utils import parse_quantity as k8s_parse_quantity

from eventop.engine import SpecError

Obj = dict[str, Any]

API_VERSION = "eventop.dev/v1"
KIND = "RegistryMirror"

# Pinned defaults; ``spec.image.registry`` / ``spec.image.proxy`` override them.
# distribution 3.0.0 is the first release with a configurable proxy TTL (``proxy.ttl``);
# 2.8.x hard-codes seven days.
REGISTRY_IMAGE = "docker.io/library/registry:3.0.0"
# nginx built by nginx.org (stream module included), running as uid 101 out of the box.
PROXY_IMAGE = "docker.io/nginxinc/nginx-unprivileged:1.28.0-alpine"

DEFAULT_HOST_PORT = 5000
DEFAULT_SIZE = "10Gi"
# distribution's own default proxy TTL; written out explicitly so the object says what runs.
DEFAULT_TTL = "168h"

_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ns|us|µs|ms|s|m|h)")
_NANOSECONDS = {"ns": 1, "us": 10**3, "µs": 10**3, "ms": 10**6, "s": 10**9, "m": 60 * 10**9,
                "h": 3600 * 10**9}
#: Go's time.Duration (nanoseconds) and a Kubernetes quantity's value are int64s: the
#: registry refuses a longer TTL, the API server cuts a larger size down to this.
MAX_INT64 = 2**63 - 1

# An image reference as the container runtimes parse it (distribution's reference grammar:
# [domain[:port]/]path[:tag][@digest], path components lower case).
_DOMAIN = r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*" \
          r"[a-zA-Z0-9])?)*(?::[0-9]+)?/)"
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_IMAGE = re.compile(rf"{_DOMAIN}?{_COMPONENT}(?:/{_COMPONENT})*(?::[A-Za-z0-9_][A-Za-z0-9_.-]"
                    r"{0,127})?(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:"
                    r"[0-9a-fA-F]{32,})?")
# A Secret's name: a DNS subdomain (RFC 1123), at most 253 characters.
_SUBDOMAIN = re.compile(r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*")


def host_port_of(mirror: Obj) -> Any:
    """The hostPort a mirror claims, as written (the default when unset); not validated."""
    return (mirror.get("spec") or {}).get("hostPort", DEFAULT_HOST_PORT)


def parse_quantity(value: str) -> Decimal:
    """A Kubernetes resource quantity (``20Gi``, ``1.5G``, ``500M``) as a number of units,
    parsed by the official client's ``parse_quantity`` (as the Database handler does)."""
    try:
        return Decimal(k8s_parse_quantity(str(value).strip()))
    except (ValueError, TypeError, ArithmeticError):
        raise SpecError(f"storage size {value!r} is not a Kubernetes quantity such as 20Gi",
                        reason="InvalidStorageSize") from None


def duration_is_zero(ttl: str) -> bool:
    """Whether a Go duration string (``0``, ``0s``, ``168h``, ``1h30m``) is zero.

    Raises :class:`SpecError` for anything ``time.ParseDuration`` would refuse, since the
    registry would then refuse to start.
    """
    text = ttl.strip()
    if text == "0":
        return True
    pos, total = 0, Decimal(0)
    for match in _DURATION_PART.finditer(text):
        if match.start() != pos:
            break
        total += Decimal(match.group(1)) * _NANOSECONDS[match.group(2)]
        pos = match.end()
    if pos != len(text) or not text:
        raise SpecError(f"ttl {ttl!r} is not a Go duration such as 168h, 30m or 0 (no expiry)",
                        reason="InvalidTTL")
    if total > MAX_INT64:
        raise SpecError(f"ttl {ttl!r} is longer than a Go duration can be (about 2562047h); "
                        "use 0 for no expiry", reason="InvalidTTL")
    return total == 0


def validate_upstream(upstream: Any) -> str:
    """Return the upstream URL as distribution wants it, or raise :class:`SpecError`.

    distribution's proxy keeps only scheme and host of ``proxy.remoteurl`` (its URL
    builder resolves the absolute ``/v2/...`` routes against it), so a path would be
    silently dropped: refuse it rather than mirror the wrong thing. Credentials in the URL
    would end up in the pod spec in clear text: they belong in ``credentialsSecretRef``.
    """
    if not isinstance(upstream, str) or not upstream.strip():
        raise SpecError("spec.upstream is required: the registry URL to mirror, "
                        "e.g. https://registry-1.docker.io", reason="InvalidUpstream")
    try:
        parts = urlsplit(upstream.strip())
        port = parts.port
    except ValueError as exc:
        raise SpecError(f"spec.upstream {upstream!r} is not a URL: {exc}",
                        reason="InvalidUpstream") from exc
    if port == 0:  # urlsplit accepts it; no registry listens on port 0
        raise SpecError(f"spec.upstream {upstream!r} has port 0; a port is 1..65535",
                        reason="InvalidUpstream")
    if parts.scheme not in ("http", "https"):
        raise SpecError(f"spec.upstream {upstream!r} must start with https:// (or http://)",
                        reason="InvalidUpstream")
    if not parts.hostname or any(c in parts.hostname for c in " _"):
        raise SpecError(f"spec.upstream {upstream!r} has no valid host name",
                        reason="InvalidUpstream")
    if parts.username or parts.password:
        raise SpecError("spec.upstream must not contain credentials; put them in a Secret with "
                        "keys username and password and name it in spec.credentialsSecretRef",
                        reason="InvalidUpstream")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise SpecError(f"spec.upstream {upstream!r} has a path, query or fragment; the "
                        "distribution registry only uses scheme and host (e.g. https://quay.io)",
                        reason="InvalidUpstream")
    netloc = parts.hostname if port is None else f"{parts.hostname}:{port}"
    if ":" in parts.hostname:  # IPv6 literal
        netloc = f"[{parts.hostname}]" + ("" if port is None else f":{port}")
    return f"{parts.scheme}://{netloc}"


def validate_image(field: str, image: Any, default: str) -> str:
    """The image to run for ``spec.image.<field>`` (``default`` when unset), or raise.

    Refused here, before any workload changes: the API server accepts a template whose
    image has trailing whitespace into a StatefulSet, whose controller then deletes the
    running pod and fails to create the new one (``FailedCreate``); a name the runtimes can
    not parse (upper case in the path, a space inside) only fails on the node
    (``InvalidImageName``). Neither is trimmed silently: the user should see what they wrote.
    """
    if image is None or image == "":
        return default
    if not isinstance(image, str) or not _IMAGE.fullmatch(image):
        raise SpecError(f"spec.image.{field} {image!r} is not an image reference such as "
                        f"{default} (no whitespace; repository path in lower case)",
                        reason="InvalidImage")
    return image


def validate_secret_name(name: Any) -> str | None:
    """The Secret named in ``credentialsSecretRef`` (None when unset), or raise: a name no
    Secret can have would otherwise be reported as missing, with advice to create it."""
    if name is None or name == "":
        return None
    if not isinstance(name, str) or len(name) > 253 or not _SUBDOMAIN.fullmatch(name):
        raise SpecError(f"spec.credentialsSecretRef.name {name!r} is not a valid Secret name "
                        "(lower case letters, digits, '-' and '.', at most 253 characters)",
                        reason="InvalidCredentialsSecretRef")
    return name


@dataclass(frozen=True)
class MirrorSpec:
    """A RegistryMirror's spec with defaults applied and every field checked."""

    upstream: str
    host_port: int
    size: str
    storage_class: str | None
    credentials_secret: str | None
    ttl: str
    registry_image: str
    proxy_image: str

    @property
    def expiry_enabled(self) -> bool:
        return not duration_is_zero(self.ttl)


def parse_spec(mirror: Obj) -> MirrorSpec:
    """Apply the CRD's defaults and validate; raise :class:`SpecError` with a clear reason.

    The API server validates the CRD schema too, but the handler does not rely on it: the
    CRD may be an older version, and events are only hints.
    """
    spec = mirror.get("spec") or {}
    upstream = validate_upstream(spec.get("upstream"))
    host_port = host_port_of(mirror)
    if isinstance(host_port, bool) or not isinstance(host_port, int) or not (
            1 <= host_port <= 65535):
        raise SpecError(f"spec.hostPort {host_port!r} must be 1..65535",
                        reason="InvalidHostPort")
    storage = spec.get("storage") or {}
    size = str(storage.get("size") or DEFAULT_SIZE)
    amount = parse_quantity(size)
    if amount <= 0:
        raise SpecError(f"storage size {size!r} must be positive", reason="InvalidStorageSize")
    if amount > MAX_INT64:
        raise SpecError(f"storage size {size!r} is larger than a Kubernetes quantity can "
                        f"be ({MAX_INT64} bytes, just under 8Ei)", reason="InvalidStorageSize")
    if amount != amount.to_integral_value():
        # "1.5" is 1500m bytes to Kubernetes: a claim the provisioner rounds or refuses
        raise SpecError(f"storage size {size!r} is not a whole number of bytes; use a unit "
                        "such as 1536Mi or 2Gi", reason="InvalidStorageSize")
    ref = spec.get("credentialsSecretRef") or {}
    secret = validate_secret_name(ref.get("name"))
    ttl = str(spec.get("ttl") if spec.get("ttl") is not None else DEFAULT_TTL)
    duration_is_zero(ttl)  # validates
    image = spec.get("image") or {}
    return MirrorSpec(
        upstream=upstream, host_port=host_port, size=size,
        storage_class=storage.get("storageClassName") or None,
        credentials_secret=secret, ttl=ttl,
        registry_image=validate_image("registry", image.get("registry"), REGISTRY_IMAGE),
        proxy_image=validate_image("proxy", image.get("proxy"), PROXY_IMAGE),
    )
