"""Waiting for something to happen, instead of sleeping and hoping it did.

A test machine may be loaded (CI on two cores), where a fixed sleep is either too short (a
flaky test) or needlessly long. Polling a condition up to a generous deadline is neither.
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


def eventually(condition: Callable[[], T], timeout: float = 30.0, what: str = "") -> T:
    """``condition()``'s first truthy value within ``timeout`` seconds; else an
    AssertionError saying what was awaited and what the condition last returned.

    For assertions on a cluster that converges asynchronously::

        cm = eventually(lambda: cluster.get("v1", "ConfigMap", "a-roster", "team"))
    """
    value = wait_until(condition, timeout, interval=0.05)
    if not value:
        raise AssertionError(f"{what or 'condition'} not true after {timeout:g}s "
                             f"(last: {value!r})")
    return value
