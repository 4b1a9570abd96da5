"""Kubernetes access for handlers: one :class:`Kube` object, clear exceptions, pure helpers.

This is the face handlers import from (``from eventop.kube import Kube, set_condition``); the
modules behind it (client, objects, backoff, ...) are its parts, for eventop's own machinery.
"""

from eventop.kube.backoff import retry_after
from eventop.kube.client import FIELD_MANAGER, Kube
from eventop.kube.errors import Conflict, Forbidden, Invalid, KubeError, NotFound, Unavailable
from eventop.kube.objects import (
    MANAGED_BY,
    MANAGED_BY_LABEL,
    content_hash,
    dns_label,
    get_condition,
    is_owned_by,
    is_terminating,
    label_selector_problems,
    label_selector_string,
    label_value,
    now_rfc3339,
    owner_reference,
    parse_rfc3339,
    selector_matches,
    set_condition,
    standard_labels,
    status_changed,
)
from eventop.kube.resources import Resource

__all__ = [
    "FIELD_MANAGER", "MANAGED_BY", "MANAGED_BY_LABEL", "Conflict", "Forbidden", "Invalid", "Kube",
    "KubeError", "NotFound", "Resource", "Unavailable", "content_hash", "dns_label",
    "get_condition", "is_owned_by", "is_terminating", "label_selector_problems",
    "label_selector_string", "label_value", "now_rfc3339", "owner_reference", "parse_rfc3339",
    "retry_after", "selector_matches", "set_condition", "standard_labels", "status_changed",
]
