"""Kubernetes API failures mapped to a few exceptions a handler can act on.

The API server answers errors with a ``Status`` object (examples recorded from a real one are
in ``tests/recordings/errors/``). Handlers should not parse those: they catch ``NotFound`` to
treat a missing object as "nothing to do", ``Conflict`` to retry a read-modify-write,
``Invalid``/``Forbidden`` to report a condition, and let ``Unavailable`` propagate so the event
is retried by its sender.
"""

from __future__ import annotations

import json
import re
from typing import Any

import urllib3


class KubeError(Exception):
    """An API request failed. ``status`` is the HTTP code, ``reason`` the Status reason."""

    status: int = 0

    def __init__(self, message: str, *, status: int = 0, reason: str = "",
                 body: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status or self.status
        self.reason = reason
        self.body = body or {}

    @property
    def causes(self) -> list[dict[str, Any]]:
        return list((self.body.get("details") or {}).get("causes") or [])

    def __str__(self) -> str:
        return f"{self.status} {self.reason}: {self.message}" if self.reason else self.message


class NotFound(KubeError):
    """404: the object, its namespace or its resource type does not exist."""
    status = 404


class Conflict(KubeError):
    """409: already exists, stale resourceVersion, or a server-side-apply field conflict."""
    status = 409

    def only_with(self, field_manager: str) -> bool:
        """Is this a server-side-apply conflict with nobody but ``field_manager``'s own
        non-apply writes (its create or update, recorded as operation Update)?

        The API server keeps a manager's Update and Apply entries apart, so the first apply
        without force of an object the same manager created conflicts with itself on every
        field it changes. Each cause reads ``conflict with "<manager>" using <apiVersion>``
        (kube-apiserver's fieldmanager ``printManager``; ``with subresource`` for another
        subresource's entry, which is not the same writer)."""
        causes = [c for c in self.causes if c.get("reason") == "FieldManagerConflict"]
        return bool(causes) and all(_updater(str(c.get("message") or "")) == field_manager
                                    for c in causes)


#: One field-manager conflict cause with an Update entry: the manager's name as Go quotes
#: it, then `` using <apiVersion>`` (and `` at <time>`` where the entry has one).
_CONFLICT_WITH = re.compile(r'^conflict with ("(?:[^"\\]|\\.)*") using [^ ]+(?: at [^ ]+)?$')


def _updater(message: str) -> str | None:
    """The manager named by a conflict cause with an Update entry, else None."""
    found = _CONFLICT_WITH.match(message)
    if found is None:
        return None
    try:
        name = json.loads(found[1])
    except ValueError:  # a Go escape JSON does not have: not a name eventop gives
        return None
    return name if isinstance(name, str) else None


class Expired(Conflict):
    """410 Gone: the resourceVersion asked for is older than the server's history."""
    status = 410


class ContinueExpired(Expired):
    """410 on a LIST's continue token: the snapshot it paged through is gone; list anew."""


class Invalid(KubeError):
    """422 (or 400): the API server rejected the object; ``causes`` names the fields."""
    status = 422


class Forbidden(KubeError):
    """403: RBAC denied it, or the namespace is terminating (reason in ``causes``)."""
    status = 403


class Unavailable(KubeError):
    """The API server could not be reached, timed out, throttled us (429) or failed (5xx).

    Transient by nature: let it propagate so the event is redelivered later.
    """
    status = 503


class Unreachable(Unavailable):
    """No answer came at all (connection refused or reset, a timeout, an answer broken
    off): the API server, or the way to it, is down, for every request alike. A 5xx is an
    answer, and may concern one object only (a webhook failing for one namespace)."""


_BY_STATUS: dict[int, type[KubeError]] = {
    400: Invalid, 403: Forbidden, 404: NotFound, 409: Conflict, 410: Expired, 422: Invalid,
}


_ERRNO = re.compile(r"\[Errno -?\d+\] ([^)\]]+)")


def transport_reason(exc: BaseException) -> str:
    """Why a request got no answer, in a few words ("connection refused", "read timed out",
    "cannot resolve host 'x': Name or service not known") instead of urllib3's
    300-character chain of pools, URLs and object reprs, repeated on every retry."""
    reason: BaseException = exc
    if isinstance(exc, urllib3.exceptions.MaxRetryError) and exc.reason is not None:
        reason = exc.reason
    if isinstance(reason, urllib3.exceptions.NameResolutionError):
        found = _ERRNO.search(str(reason))
        return f"cannot resolve host {reason.conn.host!r}" + (f": {found.group(1)}" if found
                                                              else "")
    if isinstance(reason, urllib3.exceptions.NewConnectionError):  # (a ConnectTimeoutError)
        found = _ERRNO.search(str(reason))
        return found.group(1).lower() if found else "cannot connect"
    if isinstance(reason, urllib3.exceptions.ConnectTimeoutError):
        return "connect timed out"
    if isinstance(reason, urllib3.exceptions.ReadTimeoutError):
        return "read timed out"
    if isinstance(reason, urllib3.exceptions.SSLError):
        return f"TLS: {str(reason)[:200]}"
    if isinstance(reason, urllib3.exceptions.ProtocolError):
        inner = reason.args[1] if len(reason.args) > 1 else None
        return f"connection broken ({inner!r})" if inner is not None else "connection broken"
    return str(reason)[:300]


def from_response(status: int, body: bytes, what: str) -> KubeError:
    """Build the exception for an HTTP error answer, keeping the server's own message."""
    try:
        parsed = json.loads(body or b"{}")
    except ValueError:
        parsed = {}
    if not isinstance(parsed, dict):
        parsed = {}
    message = str(parsed.get("message") or body[:300].decode("utf-8", "replace") or what)
    reason = str(parsed.get("reason") or "")
    cls = _BY_STATUS.get(status)
    if cls is None:
        cls = Unavailable if status >= 500 or status in (408, 429) else KubeError
    return cls(message, status=status, reason=reason, body=parsed)


#: Said beside a 403's hint: a kube-apiserver refuses everyone for a second or two after it
#: starts, until its RBAC informers have synced (seen after every restart in the trials).
JUST_STARTED = ("unless the API server has just started: it refuses everyone until its "
                "authorization data is loaded, a few seconds")

#: A 403 this soon after the API server failed or was unreachable is most likely that
#: refusal of a server just started (the client says so in the error's message, which the
#: router's answer, its log line and a parent's ReconcileFailed Event quote).
RESTART_WINDOW = 60.0
RESTARTED = ("one that has just started refuses everyone until its authorization data is "
             "loaded, a few seconds; if this goes on, check the grant")
