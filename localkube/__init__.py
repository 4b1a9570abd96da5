"""localkube: a small local stand-in for kube-apiserver, over real HTTP.

Used by the default test suite and by ``make demo`` when no cluster is configured. It
behaves like the real v1.24 server recorded in ``tests/recordings/`` (resourceVersions,
watch resume with BOOKMARKs and 410 Expired, DELETED with the last state, server-side apply,
CRD schema validation, namespace termination, garbage collection), and
``tests/localkube/`` checks it against those recordings.

Why not kmock (nolar's Kubernetes mock, 0.8): its ``KubernetesEmulator`` has no
resourceVersion semantics, no label selectors, no server-side apply and no watch resume /
410 / bookmarks, and it is asyncio-based; extending it would have meant rewriting it, so
this is a small threaded server of our own instead.

Modules: ``store`` (objects, versions, events, controllers), ``apply`` (field ownership),
``schema`` (CRD validation), ``validation`` (built-in admission), ``selectors``,
``patches``, ``server`` (HTTP), ``core`` (``LocalKube``), ``__main__`` (CLI).
"""

from eventop.localkube.core import LocalKube, RequestLog
from eventop.localkube.errors import ApiError

__all__ = ["ApiError", "LocalKube", "RequestLog"]
