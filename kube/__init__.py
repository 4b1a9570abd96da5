"""Kubernetes access for handlers: one :class:`Kube` object, clear exceptions, pure helpers."""

from eventop.kube.client import FIELD_MANAGER, Kube
from eventop.kube.errors import Conflict, Forbidden, Invalid, KubeError, NotFound, Unavailable
from eventop.kube.objects import (
    content_hash,
    is_owned_by,
    label_selector_string,
    now_rfc3339,
    owner_reference,
    selector_matches,
    set_condition,
    standard_labels,
)
from eventop.kube.resources import Resource

__all__ = [
    "FIELD_MANAGER", "Conflict", "Forbidden", "Invalid", "Kube", "KubeError", "NotFound",
    "Resource", "Unavailable", "content_hash", "is_owned_by", "label_selector_string",
    "now_rfc3339", "owner_reference", "selector_matches", "set_condition", "standard_labels",
]
