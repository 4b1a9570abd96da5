"""What the Kubernetes client counts: every API request by verb, resource, HTTP code and
field manager (which handler made it: ``eventop-<handler>``; ``eventop`` for the caches'
reads and the process' own requests), served by the router's and the watcher's
``/metrics``."""

from __future__ import annotations

from prometheus_client import Counter

KUBE_REQUESTS = Counter(
    "eventop_kube_requests_total",
    "Kubernetes API requests made, by verb, resource (plural[/subresource]), HTTP code and "
    "field manager (the handler that made it)",
    ["verb", "resource", "code", "manager"],
)


def resource_label(path: str) -> str:
    """The resource an API path addresses, for metrics: ``configmaps``, ``copyrules/status``.

    Bounded by the kinds a process touches (never names or namespaces); discovery and
    ``/version`` give ``""``. Counting writes per resource is how the fault suite proves a
    redelivered event wrote nothing twice.
    """
    parts = path.strip("/").split("/")
    if parts[0] == "api":
        rest = parts[2:]
    elif parts[0] == "apis":
        rest = parts[3:]
    else:
        return ""
    if len(rest) >= 3 and rest[0] == "namespaces" and rest[2] not in ("status", "finalize"):
        rest = rest[2:]
    if not rest or not rest[0]:
        return ""
    return rest[0] + (f"/{rest[2]}" if len(rest) >= 3 else "")
