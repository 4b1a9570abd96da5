"""How long to wait before trying again: one rule for watches, deliveries and reconciles,
and one reading of a server's ``Retry-After`` for every HTTP client of eventop (the
watcher's deliveries, the exchange-rate provider)."""

from __future__ import annotations

import random
import re
import time
from dataclasses import dataclass
from datetime import UTC
from email.utils import parsedate_to_datetime

#: delta-seconds: RFC 9110 says an integer; some servers send a decimal, taken as meant.
_SECONDS = re.compile(r"^[0-9]+(\.[0-9]+)?$")


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff with jitter: attempt n waits between d/2 and d, d = base * 2**n,
    capped. The jitter keeps many clients that failed together from retrying together."""

    base: float = 0.5
    cap: float = 60.0

    def delay(self, attempt: int) -> float:
        d = min(self.cap, self.base * (2 ** min(max(attempt, 0), 30)))
        return d / 2 + random.uniform(0, d / 2)


def retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds to wait as a ``Retry-After`` header asks (RFC 9110, section 10.2.3).

    ``value`` is delta-seconds (``"120"``; ``"0.5"`` is accepted too) or an HTTP date, which
    is read as UTC when it names no zone (``"-0000"``), never as the local time; a date in
    the past means at once (0). None when the header is absent or says anything else
    (``"soon"``, ``"inf"``, a negative number): the caller then waits by its own backoff.
    ``now`` (a ``time.time()`` value) is for tests.
    """
    if not value:
        return None
    value = value.strip()
    if _SECONDS.match(value):
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, when.timestamp() - (time.time() if now is None else now))
