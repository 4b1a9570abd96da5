"""``python -m eventop.watcher replay`` and ``emit``: what the CronJob and the replay tests
rely on."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from eventop.watcher.cli import build_parser, main
from eventop.watcher.recording import load_recording
from eventop.watcher.specs import DEFAULT_RESOURCES, ResourceSpec, parse_resources

REC = Path(__file__).resolve().parents[1] / "recordings"
REPO = Path(__file__).resolve().parents[2]
FAST = ["--backoff-base", "0.01", "--backoff-max", "0.05", "--sink-timeout", "1"]


def test_replaying_a_recording_twice_sends_the_same_ids_in_order(sink, capsys) -> None:
    args = ["replay", str(REC / "copy-rules"), str(REC / "mirrors-and-rates"),
            "--sink", sink.url, *FAST]
    assert main(args) == 0
    first = sink.ids()
    assert main(args) == 0
    second = sink.ids()[len(first):]
    expected = [f"{o['metadata']['uid']}/{o['metadata']['resourceVersion']}/{c}"
                for c, o in load_recording([REC / "copy-rules", REC / "mirrors-and-rates"])]
    assert first == second == expected
    assert f"{len(expected)} of {len(expected)} events accepted" in capsys.readouterr().out


def test_replay_retries_transient_failures_and_fails_on_refusal(sink, capsys) -> None:
    sink.fail(2, 503)
    assert main(["replay", str(REC / "copy-rules" / "api_v1_secrets.watch.jsonl"),
                 "--sink", sink.url, *FAST]) == 0
    assert len(sink.ids()) == 2
    sink.fail(1, 400)
    assert main(["replay", str(REC / "copy-rules" / "api_v1_secrets.watch.jsonl"),
                 "--sink", sink.url, *FAST]) == 1
    assert "1 of 2 events accepted" in capsys.readouterr().out


def test_emit_posts_one_refresh_event_with_its_data(sink) -> None:
    sink.fail(1, 500)
    assert main(["emit", "dev.eventop.exchangerates.refresh", "--sink", sink.url,
                 "--data", '{"currency": "CHF"}', "--source", "cron", *FAST]) == 0
    (got,) = sink.accepted
    assert got.type == "dev.eventop.exchangerates.refresh"
    assert got.headers["ce-source"] == "cron"
    assert json.loads(got.body) == {"currency": "CHF"}


def test_emit_exit_code_reports_a_sink_that_never_accepts() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "eventop.watcher", "emit", "dev.eventop.exchangerates.refresh",
         "--sink", "http://127.0.0.1:9/", "--max-attempts", "2", *FAST],
        cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert "NOT accepted" in proc.stdout


def test_emit_without_a_sink_says_how_to_give_one(monkeypatch) -> None:
    monkeypatch.delenv("K_SINK", raising=False)
    with pytest.raises(SystemExit, match="K_SINK"):
        main(["emit", "x"])


def test_sink_and_intervals_come_from_the_environment(monkeypatch) -> None:
    monkeypatch.setenv("K_SINK", "http://router")
    monkeypatch.setenv("EVENTOP_RESYNC_SECONDS", "42")
    monkeypatch.setenv("EVENTOP_RESOURCES", "v1/configmaps@team-a apps/v1/daemonsets:a=b,c=d")
    args = build_parser().parse_args(["run"])
    assert args.sink == "http://router" and args.resync_seconds == 42.0
    assert [str(s) for s in parse_resources(args.resources)] == [
        "v1/configmaps@team-a", "apps/v1/daemonsets:a=b,c=d"]


def test_resource_specs_parse_every_documented_form() -> None:
    assert ResourceSpec.parse("configmaps") == ResourceSpec("", "v1", "configmaps")
    assert ResourceSpec.parse("eventop.dev/v1/copyrules") == ResourceSpec(
        "eventop.dev", "v1", "copyrules")
    spec = ResourceSpec.parse("apps/v1/statefulsets@ns1:app.kubernetes.io/managed-by=eventop")
    assert (spec.namespace, spec.label_selector) == ("ns1", "app.kubernetes.io/managed-by=eventop")
    with pytest.raises(ValueError, match="group/"):
        ResourceSpec.parse("statefulsets.apps")
    plurals = {ResourceSpec.parse(r).plural for r in DEFAULT_RESOURCES}
    assert plurals == {"registrymirrors", "copyrules", "exchangerates", "namespaces",
                       "configmaps", "secrets", "statefulsets", "daemonsets"}


def test_emit_waits_longer_than_the_refresh_handler_may_take(monkeypatch) -> None:
    """A refresh retried while the first still runs would hit the provider twice."""
    from eventop.handlers.exchange_rates.provider import FrankfurterClient

    monkeypatch.delenv("EVENTOP_SINK_TIMEOUT_SECONDS", raising=False)
    args = build_parser().parse_args(["emit", "dev.eventop.exchangerates.refresh"])
    assert args.sink_timeout > FrankfurterClient().refresh_budget


def test_a_sink_that_is_not_an_http_url_is_refused_at_start() -> None:
    with pytest.raises(SystemExit, match="http:// or https://"):
        main(["emit", "x", "--sink", "router:8080"])
