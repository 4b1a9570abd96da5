"""Kubernetes' name rules (RFC 1123), with the standard library only: the command lines check
names with them before anything is imported, and :mod:`eventop.kube` checks label keys."""

from __future__ import annotations

import re

_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


def is_dns_label(text: str) -> bool:
    """An RFC 1123 label, what a namespace's name must be."""
    return len(text) <= 63 and _LABEL.fullmatch(text) is not None


def is_dns_subdomain(text: str) -> bool:
    """An RFC 1123 subdomain, what most objects' names must be (a Lease's, a ConfigMap's),
    and a label key's prefix."""
    return len(text) <= 253 and all(_LABEL.fullmatch(part) for part in text.split("."))
