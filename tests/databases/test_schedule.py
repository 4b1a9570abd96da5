"""The cron dialect Kubernetes CronJobs accept, checked before a CronJob is written."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from eventop.handlers.databases.schedule import (
    ScheduleError,
    next_tick,
    normalize,
    two_periods_ago,
)


@pytest.mark.parametrize("schedule,expected", [
    ("0 0 * * *", "0 0 * * *"),
    ("*/15 2-4 1,15 JAN-jun mon-FRI", "*/15 2-4 1,15 JAN-jun mon-FRI"),
    ("0 3 ? * 0", "0 3 * * 0"),
    ("@daily", "0 0 * * *"),
    ("@Weekly", "0 0 * * 0"),
    ("  5   4 * * *  ", "5 4 * * *"),
])
def test_accepted_schedules(schedule: str, expected: str) -> None:
    assert normalize(schedule) == expected


@pytest.mark.parametrize("schedule,says", [
    ("0 0 * *", "has 4 field(s)"),
    ("0 0 0 * * *", "has 6 field(s)"),
    ("61 * * * *", "minute '61' is outside 0-59"),
    ("0 0 * * 7", "day-of-week '7' is outside 0-6 or SUN-SAT"),
    ("0 0 L * *", "day-of-month 'L' is outside 1-31"),
    ("0 0 * * 1#2", "is not a number, range, step or list"),
    ("*/0 * * * *", "step must be at least 1"),
    ("0 5-2 * * *", "range 5-2 runs backwards"),
    ("@every 1h", "unknown descriptor"),
    ("TZ=Europe/Paris 0 0 * * *", "time zones are not supported"),
    ("0 0 30 2 *", "never fires"),
])
def test_refused_schedules_say_what_is_wrong_and_what_is_accepted(schedule: str,
                                                                  says: str) -> None:
    with pytest.raises(ScheduleError) as err:
        normalize(schedule)
    assert says in str(err.value)


def test_day_of_month_and_day_of_week_are_either_when_both_are_set() -> None:
    # robfig/cron (and Vixie cron): both restricted -> OR; one of them * -> AND
    after = datetime(2026, 11, 2, 12, 0, tzinfo=UTC)  # a Monday
    assert next_tick("0 0 13 * FRI", after) == datetime(2026, 11, 6, tzinfo=UTC)  # Friday 6th
    assert next_tick("0 0 * * FRI", after) == datetime(2026, 11, 6, tzinfo=UTC)


def test_two_periods_ago_is_the_second_most_recent_tick() -> None:
    now = datetime(2026, 11, 24, 10, 0, tzinfo=UTC)
    assert two_periods_ago("0 0 * * *", now) == datetime(2026, 11, 23, tzinfo=UTC)
    assert two_periods_ago("@hourly", now) == datetime(2026, 11, 24, 8, tzinfo=UTC)  # 10:00 runs
    later = datetime(2026, 11, 24, 10, 30, tzinfo=UTC)
    assert two_periods_ago("@hourly", later) == datetime(2026, 11, 24, 9, tzinfo=UTC)
