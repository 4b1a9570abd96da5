"""Retry-After, read one way by every HTTP client of eventop (watcher, rates provider)."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest

from eventop.kube.backoff import Backoff, retry_after

NOW = datetime(2026, 11, 21, 8, 0, 0, tzinfo=UTC).timestamp()


@pytest.mark.parametrize(("header", "seconds"), [
    ("7", 7.0), (" 120 ", 120.0), ("0", 0.0), ("0.2", 0.2),
    ("Sat, 21 Nov 2026 08:01:30 GMT", 90.0),
    ("Wed, 21 Oct 2015 07:28:00 GMT", 0.0),  # in the past: at once
])
def test_retry_after_is_seconds_or_an_http_date(header: str, seconds: float) -> None:
    assert retry_after(header, now=NOW) == pytest.approx(seconds)


@pytest.mark.parametrize("header", [None, "", "soon", "-5", "inf", "nan", "1e3", "7 s"])
def test_retry_after_that_says_nothing_usable_is_none(header: str | None) -> None:
    assert retry_after(header, now=NOW) is None


def test_retry_after_date_without_a_zone_is_utc_not_local_time(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    try:
        soon = datetime.now(UTC).replace(tzinfo=None) + timedelta(seconds=60)
        header = format_datetime(soon)  # naive: "... -0000"
        assert header.endswith("-0000")
        assert 50 < retry_after(header) <= 60  # type: ignore[operator]
    finally:
        monkeypatch.undo()
        time.tzset()


def test_backoff_grows_exponentially_within_jitter_and_cap() -> None:
    backoff = Backoff(base=1.0, cap=8.0)
    for attempt, full in [(0, 1.0), (1, 2.0), (2, 4.0), (3, 8.0), (10, 8.0)]:
        for _ in range(20):
            assert full / 2 <= backoff.delay(attempt) <= full
