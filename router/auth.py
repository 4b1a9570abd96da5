"""Optional shared-token authentication of the router, for plain mode.

In plain mode only eventop's own watcher and refresh CronJob post events, and a
NetworkPolicy already limits who can connect. Where that is not enough (a CNI that ignores
NetworkPolicy, a cluster where other pods share the namespace) a shared token closes the
door: set ``EVENTOP_ROUTER_TOKEN`` on the router and on every sender (the same Secret,
see ``deploy/``), and an event without ``Authorization: Bearer <token>`` is answered 401 and
handled by nobody. Off when the variable is unset or empty (the default, and Knative mode,
where the Broker does not send such a header).

The comparison is in constant time (:func:`hmac.compare_digest` over SHA-256 digests, so not
even the token's length shows in the timing).
"""

from __future__ import annotations

import hashlib
import hmac
import os

ENV = "EVENTOP_ROUTER_TOKEN"


def configured_token() -> bytes | None:
    """The token the router requires, or None when authentication is off."""
    token = os.environ.get(ENV, "").strip()
    return hashlib.sha256(token.encode()).digest() if token else None


def authorized(header: str | None, expected: bytes) -> bool:
    """Does an ``Authorization`` header carry the token whose digest is ``expected``?"""
    scheme, _, value = (header or "").partition(" ")
    given = hashlib.sha256(value.strip().encode()).digest()
    # compare first, check the scheme after: the same work whatever was sent
    return hmac.compare_digest(given, expected) and scheme.lower() == "bearer"


def bearer_header() -> dict[str, str]:
    """The header a sender adds when ``EVENTOP_ROUTER_TOKEN`` is set (else nothing)."""
    token = os.environ.get(ENV, "").strip()
    return {"Authorization": f"Bearer {token}"} if token else {}
