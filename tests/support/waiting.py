"""Waiting for something to happen, instead of sleeping and hoping it did.

The suite runs on a loaded two-core CI machine, where a fixed sleep is either too short
(a flaky test) or needlessly long. Polling a condition up to a generous deadline is neither.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(condition: Callable[[], T], timeout: float = 15.0,
               interval: float = 0.02) -> T:
    """Poll ``condition()`` until it is truthy or ``timeout`` seconds passed.

    Returns its last value: truthy on success, falsy (for the caller's assert) on timeout.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(interval)
    return condition()
