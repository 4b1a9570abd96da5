"""API errors as the real kube-apiserver reports them: an HTTP code plus a ``Status`` body.

Messages and ``details`` follow ``tests/recordings/errors/`` word for word, because clients
(and our own ``eventop.kube.errors``) act on ``reason``, ``details.causes`` and sometimes the text.
"""

from __future__ import annotations

from typing import Any

Obj = dict[str, Any]


class ApiError(Exception):
    """An error answer: raised anywhere in the store, turned into a Status by the server."""

    def __init__(self, code: int, reason: str, message: str,
                 details: Obj | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details

    def status(self) -> Obj:
        body: Obj = {"kind": "Status", "apiVersion": "v1", "metadata": {},
                     "status": "Failure", "message": self.message, "reason": self.reason}
        if self.details is not None:
            body["details"] = self.details
        body["code"] = self.code
        return body


def _details(name: str, group: str, kind: str, causes: list[Obj] | None = None) -> Obj:
    details: Obj = {"name": name}
    if group:
        details["group"] = group
    details["kind"] = kind
    if causes:
        details["causes"] = causes
    return details


def not_found(qualified: str, group: str, plural: str, name: str) -> ApiError:
    """404 for ``plural[.group] "name"`` (``qualified`` is e.g. ``statefulsets.apps``)."""
    return ApiError(404, "NotFound", f'{qualified} "{name}" not found',
                    _details(name, group, plural))


def namespace_not_found(namespace: str) -> ApiError:
    return not_found("namespaces", "", "namespaces", namespace)


def already_exists(qualified: str, group: str, plural: str, name: str) -> ApiError:
    return ApiError(409, "AlreadyExists", f'{qualified} "{name}" already exists',
                    _details(name, group, plural))


def conflict_modified(qualified: str, group: str, plural: str, name: str) -> ApiError:
    """409 for a stale resourceVersion (optimistic concurrency)."""
    return ApiError(
        409, "Conflict",
        f'Operation cannot be fulfilled on {qualified} "{name}": the object has been modified; '
        "please apply your changes to the latest version and try again",
        _details(name, group, plural))


def uid_precondition(qualified: str, group: str, plural: str, name: str, wanted: str,
                     actual: str) -> ApiError:
    return ApiError(
        409, "Conflict",
        f'Operation cannot be fulfilled on {qualified} "{name}": Precondition failed: '
        f"UID in precondition: {wanted}, UID in object meta: {actual}",
        _details(name, group, plural))


def namespace_terminating(plural: str, group: str, name: str, namespace: str) -> ApiError:
    return ApiError(
        403, "Forbidden",
        f'{plural} "{name}" is forbidden: unable to create new content in namespace '
        f"{namespace} because it is being terminated",
        _details(name, group, plural, [{
            "reason": "NamespaceTerminating",
            "message": f"namespace {namespace} is being terminated",
            "field": "metadata.namespace"}]))


def cause(reason: str, field: str, message: str) -> Obj:
    """One entry of ``details.causes``; ``reason`` like ``FieldValueInvalid``."""
    return {"reason": reason, "message": message, "field": field}


def invalid(kind: str, group: str, name: str, causes: list[Obj]) -> ApiError:
    """422 Invalid; the message joins the causes the way apimachinery's ErrorList does."""
    qualified = f"{kind}.{group}" if group else kind
    parts = [f"{c['field']}: {c['message']}" if c.get("field") else c["message"]
             for c in causes]
    joined = parts[0] if len(parts) == 1 else "[" + ", ".join(parts) + "]"
    return ApiError(422, "Invalid", f'{qualified} "{name}" is invalid: {joined}',
                    _details(name, group, kind, causes))


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def method_not_allowed(message: str = "the server does not allow this method on the "
                                      "requested resource") -> ApiError:
    return ApiError(405, "MethodNotAllowed", message, {})


def unsupported_media_type(content_type: str) -> ApiError:
    return ApiError(415, "UnsupportedMediaType",
                    f'the body of the request was in an unknown format - accepted media types '
                    f'include: application/json-patch+json, application/merge-patch+json, '
                    f'application/apply-patch+yaml (got "{content_type}")')


def expired(resource_version: int, oldest: int) -> ApiError:
    return ApiError(410, "Expired",
                    f"too old resource version: {resource_version} ({oldest})")


def apply_conflict(conflicts: list[tuple[str, str]]) -> ApiError:
    """409 from server-side apply: ``conflicts`` is a list of (manager label, field path).

    The manager label is already rendered (``"curl" using v1``), as in the recording.
    """
    causes = [{"reason": "FieldManagerConflict", "message": f"conflict with {mgr}",
               "field": path} for mgr, path in conflicts]
    if len(conflicts) == 1:
        mgr, path = conflicts[0]
        message = f"Apply failed with 1 conflict: conflict with {mgr}: {path}"
    else:
        by_manager: dict[str, list[str]] = {}
        for mgr, path in conflicts:
            by_manager.setdefault(mgr, []).append(path)
        lines: list[str] = []
        for mgr in sorted(by_manager):
            lines.append(f"conflicts with {mgr}:")
            lines.extend(f"- {p}" for p in by_manager[mgr])
        message = f"Apply failed with {len(conflicts)} conflicts: " + "\n".join(lines)
    return ApiError(409, "Conflict", message, {"causes": causes})


def unavailable() -> ApiError:
    return ApiError(503, "ServiceUnavailable",
                    "localkube is unavailable (fault injected with set_unavailable(True)); "
                    "retry later", {})
