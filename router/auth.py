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
    token = token_from_env()
    return hashlib.sha256(token.encode()).digest() if token else None


def token_from_env() -> str:
    """``EVENTOP_ROUTER_TOKEN``, stripped; ValueError if it can not be sent in an HTTP header.

    A sender puts it in ``Authorization``, which carries printable ASCII only: a token with
    a newline (a file read with its line end) or a non-ASCII character would fail every
    send, so the router and the senders refuse it at start, naming the position and never
    the token itself (it is a secret).
    """
    token = os.environ.get(ENV, "").strip()
    for position, char in enumerate(token, 1):
        if not " " <= char <= "~":
            what = "a control character" if char.isascii() or not char.isprintable() \
                else "a non-ASCII character"
            raise ValueError(f"{ENV} has {what} at position {position}: it is sent in an "
                             "HTTP header, which carries printable ASCII only (a base64 or "
                             "hex token, e.g. from `openssl rand -hex 32`)")
    return token


def authorized(header: str | None, expected: bytes) -> bool:
    """Does an ``Authorization`` header carry the token whose digest is ``expected``?"""
    scheme, _, value = (header or "").partition(" ")
    given = hashlib.sha256(value.strip().encode()).digest()
    # compare first, check the scheme after: the same work whatever was sent
    return hmac.compare_digest(given, expected) and scheme.lower() == "bearer"


def bearer_header() -> dict[str, str]:
    """The header a sender adds when ``EVENTOP_ROUTER_TOKEN`` is set (else nothing);
    ValueError for a token no header can carry (:func:`token_from_env`)."""
    token = token_from_env()
    return {"Authorization": f"Bearer {token}"} if token else {}
