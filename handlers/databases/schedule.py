"""Backup schedules: the cron dialect a Kubernetes CronJob accepts, and its past ticks.

The API server checks a CronJob's schedule with robfig/cron's standard parser: five fields
(minute hour day-of-month month day-of-week), ``*`` or ``?``, numbers, ranges ``a-b``, steps
``/n``, lists ``a,b``, three-letter month and day names, and the descriptors ``@yearly``,
``@annually``, ``@monthly``, ``@weekly``, ``@daily``, ``@midnight``, ``@hourly``. It is
stricter than most cron libraries (no seconds field, no ``L``/``W``/``#``, day-of-week 0-6
only), so the grammar is checked here, field by field, and a schedule it accepts is then
evaluated with :mod:`cronsim`, whose day-of-month/day-of-week rule (AND when either starts
with ``*``, else OR) is robfig's. ``@every <duration>`` (robfig has it) and ``TZ=`` prefixes
(refused since Kubernetes 1.25) are refused with a clear message: schedules are in UTC.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime
from itertools import islice

from cronsim import CronSim, CronSimError

DESCRIPTORS = {
    "@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0", "@daily": "0 0 * * *", "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_FIELDS = (  # name, lowest, highest, names (index + lowest = value)
    ("minute", 0, 59, ()),
    ("hour", 0, 23, ()),
    ("day-of-month", 1, 31, ()),
    ("month", 1, 12, ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT",
                      "NOV", "DEC")),
    ("day-of-week", 0, 6, ("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT")),
)
_ITEM = re.compile(r"^(?P<range>\*|\?|[A-Za-z0-9]+(?:-[A-Za-z0-9]+)?)(?:/(?P<step>[0-9]+))?$")
ACCEPTED = ("five fields (minute hour day-of-month month day-of-week, e.g. '30 2 * * *') or "
            "one of @hourly, @daily, @weekly, @monthly, @yearly")


class ScheduleError(ValueError):
    """A schedule a CronJob would refuse, with what is wrong and what is accepted."""


def normalize(schedule: str) -> str:
    """The five-field form of ``schedule`` (descriptors expanded, ``?`` read as ``*``).

    Raises :class:`ScheduleError` saying which field is wrong.
    """
    text = " ".join(schedule.split())
    if text.startswith(("TZ=", "CRON_TZ=")):
        raise ScheduleError(f"schedule {schedule!r}: time zones are not supported (schedules "
                            f"run in UTC); use {ACCEPTED}")
    if text.startswith("@"):
        if text.lower() in DESCRIPTORS:
            return DESCRIPTORS[text.lower()]
        raise ScheduleError(f"schedule {schedule!r}: unknown descriptor; use {ACCEPTED}")
    fields = text.split(" ")
    if len(fields) != 5:
        raise ScheduleError(f"schedule {schedule!r} has {len(fields)} field(s); use {ACCEPTED}")
    out = []
    for value, (name, low, high, names) in zip(fields, _FIELDS, strict=True):
        for item in value.split(","):
            _check_item(schedule, item, name, low, high, names)
        out.append(value.replace("?", "*"))
    normalized = " ".join(out)
    try:
        CronSim(normalized, datetime(2000, 1, 1, tzinfo=UTC))
    except (CronSimError, ValueError) as exc:  # e.g. day 31 in a month set without one
        raise ScheduleError(f"schedule {schedule!r} never fires ({exc}); use {ACCEPTED}"
                            ) from exc
    return normalized


def _check_item(schedule: str, item: str, field: str, low: int, high: int,
                names: tuple[str, ...]) -> None:
    match = _ITEM.match(item)
    if not match:
        raise ScheduleError(f"schedule {schedule!r}: {field} {item!r} is not a number, range, "
                            f"step or list; use {ACCEPTED}")
    if match["step"] is not None and int(match["step"]) == 0:
        raise ScheduleError(f"schedule {schedule!r}: {field} step must be at least 1")
    span = match["range"]
    if span in ("*", "?"):
        return
    bounds = [_value(schedule, part, field, low, high, names) for part in span.split("-")]
    if len(bounds) == 2 and bounds[0] > bounds[1]:
        raise ScheduleError(f"schedule {schedule!r}: {field} range {span} runs backwards")


def _value(schedule: str, text: str, field: str, low: int, high: int,
           names: tuple[str, ...]) -> int:
    if text.upper() in names:
        return names.index(text.upper()) + low
    if not text.isdigit() or not low <= int(text) <= high:
        allowed = f"{low}-{high}" + (f" or {names[0]}-{names[-1]}" if names else "")
        raise ScheduleError(f"schedule {schedule!r}: {field} {text!r} is outside {allowed}")
    return int(text)


def ticks_before(schedule: str, moment: datetime) -> Iterator[datetime]:
    """The schedule's fire times before ``moment``, newest first (UTC)."""
    return iter(CronSim(normalize(schedule), moment.astimezone(UTC), reverse=True))


def two_periods_ago(schedule: str, moment: datetime) -> datetime:
    """The second most recent fire time before ``moment``: a backup that succeeded
    since then is within two schedule periods (the last run may still be going, or have
    been skipped, without anything being wrong yet)."""
    found = list(islice(ticks_before(schedule, moment), 2))
    return found[-1]


def next_tick(schedule: str, moment: datetime) -> datetime:
    """The schedule's first fire time after ``moment`` (UTC)."""
    return next(iter(CronSim(normalize(schedule), moment.astimezone(UTC))))
