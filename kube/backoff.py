"""How long to wait before trying again: one rule for watches, deliveries and reconciles."""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff with jitter: attempt n waits between d/2 and d, d = base * 2**n,
    capped. The jitter keeps many clients that failed together from retrying together."""

    base: float = 0.5
    cap: float = 60.0

    def delay(self, attempt: int) -> float:
        d = min(self.cap, self.base * (2 ** min(max(attempt, 0), 30)))
        return d / 2 + random.uniform(0, d / 2)
