"""How long the router holds an event for the controllers' runs (router/dispatch.py)."""

from __future__ import annotations

import types
from typing import Any

import pytest

from eventop.engine.settings import EngineSettings
from eventop.events import REFRESH_TYPE
from eventop.handlers.events import Event
from eventop.kube.errors import Unavailable
from eventop.router import dispatch
from eventop.watcher.cli import build_parser


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


class Ticket:
    """Runs that never finish; remembers how long it was asked to wait."""

    pending = {("exchange-rates", ("finance", "eur-usd"))}

    def __init__(self) -> None:
        self.waited: list[float] = []

    def wait(self, timeout: float) -> bool:
        self.waited.append(timeout)
        return False


class Engines:
    """An engine whose ``@triggers`` function takes ``trigger_seconds`` of the clock."""

    def __init__(self, clock: Clock, trigger_seconds: float) -> None:
        self.settings = EngineSettings()
        self.clock = clock
        self.trigger_seconds = trigger_seconds
        self.ticket = Ticket()

    def __bool__(self) -> bool:
        return True

    def interested(self, event: Event) -> list[str]:
        return ["exchange-rates"]

    def get(self) -> Any:
        return self

    def submit(self, event: Event) -> tuple[Ticket, dict[str, str]]:
        self.clock.now += self.trigger_seconds
        return self.ticket, {}


REFRESH = Event(id="r-1", type=REFRESH_TYPE, source="/cronjob", data={})


@pytest.mark.parametrize("trigger_seconds", [0.0, 30.0, 60.0])
def test_the_answer_comes_within_answer_wait_of_the_event_whatever_its_trigger_took(
        monkeypatch: pytest.MonkeyPatch, trigger_seconds: float) -> None:
    clock = Clock()
    monkeypatch.setattr(dispatch, "time", types.SimpleNamespace(monotonic=clock.monotonic))
    engines = Engines(clock, trigger_seconds)
    with pytest.raises(Unavailable, match=r"exchange-rates .* not finished"):
        dispatch.run_controllers(engines, REFRESH)  # type: ignore[arg-type]
    answer_wait = engines.settings.answer_wait
    assert engines.ticket.waited == [max(0.0, answer_wait - trigger_seconds)]


def test_emit_waits_longer_than_the_router_holds_an_event(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Else ``emit`` posts the refresh again while the first is still answered."""
    monkeypatch.delenv("EVENTOP_SINK_TIMEOUT_SECONDS", raising=False)
    args = build_parser().parse_args(["emit", REFRESH_TYPE])
    assert args.sink_timeout > EngineSettings().answer_wait
