"""The router's logs (``router/logs.py``): the line each event gets, formatted in this process,
and what ``python -m eventop.router`` writes on stderr, read as a person or a collector would.

Every line is one JSON object (or, with ``--log-format text``, one text line), gunicorn's own
messages included: a malformed HTTP request or a shutdown must not add Python's
``--- Logging error ---`` blocks. The per-event line says what each handler returned.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import requests
from flask.testing import FlaskClient

from eventop.router.logs import JsonFormatter
from eventop.testing.processes import RouterProcess, free_port
from tests.router.support import HANDLERS, binary, ce_headers, configmap, kube_event, post

MODULE = "tests.router.recording_handlers"
TEXT_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} (DEBUG|INFO|WARNING|ERROR|"
                       r"CRITICAL) +[\w.]+: ")


def _router(tmp_path: Path, *args: str) -> RouterProcess:
    return RouterProcess({"EVENTOP_BUILTIN_HANDLERS": "none", "EVENTOP_HANDLERS": MODULE,
                          "EVENTOP_TEST_RECORD": str(tmp_path / "received.jsonl"),
                          "EVENTOP_KUBE_URL": f"http://127.0.0.1:{free_port()}"},
                         workers=1, log_dir=str(tmp_path), extra_args=list(args))


def _malformed_requests(port: int) -> None:
    """Bytes that are not HTTP, and a header gunicorn refuses: each answered 400."""
    for payload in (b"GARBAGE\r\n\r\n",
                    b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n"):
        with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
            conn.sendall(payload)
            assert conn.recv(100).startswith(b"HTTP/1.1 400")


@pytest.mark.parametrize("log_format", ["json", "text"])
def test_every_line_has_the_chosen_format_through_bad_requests_and_shutdown(
        tmp_path: Path, log_format: str) -> None:
    router = _router(tmp_path, "--log-format", log_format)
    try:
        obj = configmap("settings", "team-a", uid="u1", resource_version="4")
        headers, body = binary(kube_event("update", obj))
        assert requests.post(router.url, headers=headers, data=body, timeout=30).ok
        _malformed_requests(router.port)
    finally:
        router.stop(keep_log=True)
    lines = router.log().splitlines()
    assert "Logging error" not in router.log()
    if log_format == "json":
        parsed = [json.loads(line) for line in lines]  # fails on any line that is not JSON
        messages = [p["message"] for p in parsed]
    else:
        assert [line for line in lines if not TEXT_LINE.match(line)] == []
        messages = [TEXT_LINE.sub("", line) for line in lines]
    assert any(m.startswith("Invalid request from ip=127.0.0.1") for m in messages)
    assert "Shutting down: Master" in messages
    [event_line] = [m for m in messages if m.startswith("update ConfigMap team-a/settings")]
    assert re.fullmatch(r"update ConfigMap team-a/settings: "
                        rf"{re.escape(MODULE)}\.configmaps: recorded by configmaps "
                        r"\(200 in [\d.]+ ms\)", event_line)


def test_the_event_line_carries_each_handlers_result_as_a_field(tmp_path: Path) -> None:
    router = _router(tmp_path)
    try:
        obj = configmap("db", "team-b", data={"password": "never-logged"}, uid="u2",
                        resource_version="9")
        headers, body = binary(kube_event("add", obj))
        assert requests.post(router.url, headers=headers, data=body, timeout=30).ok
    finally:
        router.stop(keep_log=True)
    [line] = [json.loads(x) for x in router.log().splitlines() if '"u2/9/add"' in x]
    assert line["results"] == [{"handler": f"{MODULE}.configmaps", "outcome": "ok",
                                "detail": "recorded by configmaps"}]
    assert (line["kind"], line["namespace"], line["name"], line["status"]) == (
        "ConfigMap", "team-b", "db", 200)
    assert "never-logged" not in router.log()


def test_python_warnings_are_lines_and_the_insecure_tls_warning_comes_once(
        tmp_path: Path) -> None:
    """A kubeconfig with insecure-skip-tls-verify made urllib3 warn on every request."""
    code = """
import warnings
from urllib3.exceptions import InsecureRequestWarning
from eventop.router import logs
logs.configure("info", force=True, log_format="json")
for _ in range(3):
    warnings.warn("Unverified HTTPS request is being made to host '10.0.0.1'",
                  InsecureRequestWarning, stacklevel=1)
"""
    script = tmp_path / "warns.py"  # a file: Python adds the source line that warned
    script.write_text(code)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=60, cwd=tmp_path)
    lines = [json.loads(line) for line in proc.stderr.splitlines()]
    assert len(lines) == 1 and lines[0]["logger"] == "py.warnings"
    assert "InsecureRequestWarning: Unverified HTTPS request" in lines[0]["message"]
    assert "\n" not in lines[0]["message"] and "warnings.warn" not in lines[0]["message"]


# -- the log lines, formatted in this process --------------------------------------------------

def test_one_structured_log_line_per_event_without_its_data(
        client: FlaskClient, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="eventop")
    obj = configmap("db", "team-b", data={"password": "hunter2-secret"}, uid="L",
                    resource_version="9")
    post(client, binary(kube_event("update", obj)))
    lines = [r for r in caplog.records if r.name == "eventop.router"]
    assert len(lines) == 1
    fields = json.loads(JsonFormatter().format(lines[0]))
    assert fields["message"] == (
        f"update ConfigMap team-b/db: {HANDLERS}.configmaps: "
        f"converged (200 in {fields['duration_ms']:g} ms)")
    assert fields["results"] == [{"handler": f"{HANDLERS}.configmaps",
                                  "outcome": "ok", "detail": "converged"}]
    assert {k: fields[k] for k in ("id", "type", "kind", "namespace", "name", "handlers",
                                   "outcome", "status")} == {
        "id": "L/9/update", "type": "dev.knative.apiserver.resource.update",
        "kind": "ConfigMap", "namespace": "team-b", "name": "db",
        "handlers": [f"{HANDLERS}.configmaps"],
        "outcome": "ok", "status": 200}
    assert isinstance(fields["duration_ms"], float) and fields["duration_ms"] >= 0
    assert all("hunter2-secret" not in JsonFormatter().format(r) for r in caplog.records)



def test_an_event_no_handler_wants_gets_its_line_at_debug_not_info(
        client: FlaskClient, caplog: pytest.LogCaptureFixture) -> None:
    """Most of a cluster's changes concern no handler: counted, answered 202, and no line at
    info (one per event would bury the lines of events a handler ran for)."""
    secret = {"apiVersion": "v1", "kind": "Secret",
              "metadata": {"name": "regcred", "namespace": "default", "uid": "s",
                           "resourceVersion": "1"}}
    caplog.set_level(logging.INFO, logger="eventop")
    assert post(client, binary(kube_event("add", secret))).status_code == 202
    assert [r for r in caplog.records if r.name == "eventop.router"] == []
    caplog.set_level(logging.DEBUG, logger="eventop")
    assert post(client, binary(kube_event("add", secret))).status_code == 202
    [line] = [r for r in caplog.records if r.name == "eventop.router"]
    assert line.levelno == logging.DEBUG
    assert line.getMessage().startswith("add Secret default/regcred: no handler wants it (202")
    caplog.clear()
    post(client, binary(kube_event("update", configmap("db", "team-b"))))
    assert [r.levelno for r in caplog.records if r.name == "eventop.router"] == [logging.INFO]


def test_rejected_event_is_logged_with_the_reason(
        client: FlaskClient, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="eventop")
    client.post("/", headers=ce_headers(ce_source=None, ce_id="bad-1"), data=b"{}")
    [line] = [r for r in caplog.records if r.name == "eventop.router"]
    assert line.levelno == logging.WARNING
    fields = json.loads(JsonFormatter().format(line))
    assert (fields["id"], fields["outcome"], fields["status"]) == ("bad-1", "invalid", 400)
    assert "'source' (header ce-source)" in fields["error"]



def test_json_formatter_writes_one_line_per_record() -> None:
    try:
        raise ValueError("line one\nline two")
    except ValueError:
        import sys

        record = logging.LogRecord("eventop.router", logging.ERROR, __file__, 1, "failed %s",
                                   ("x",), sys.exc_info())
    record.fields = {"id": "e-1"}
    text = JsonFormatter().format(record)
    assert "\n" not in text
    parsed = json.loads(text)
    assert parsed["message"] == "failed x" and parsed["id"] == "e-1"
    assert "ValueError: line one\nline two" in parsed["traceback"]



def test_line_handler_writes_whole_json_lines_to_its_descriptor(tmp_path: Any) -> None:
    from eventop.router.logs import LineHandler

    path = tmp_path / "log"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT)
    try:
        handler = LineHandler(fd)
        handler.setFormatter(JsonFormatter())
        logger = logging.getLogger("eventop.test.linehandler")
        logger.addHandler(handler)
        logger.propagate = False
        try:
            logger.warning("first")
            logger.warning("second %s", "é", extra={"fields": {"id": "x"}})
        finally:
            logger.removeHandler(handler)
    finally:
        os.close(fd)
    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    assert [(line["message"], line.get("id")) for line in lines] == [
        ("first", None), ("second é", "x")]



@pytest.mark.parametrize("formatter", ["json", "text"])
def test_a_line_logged_with_its_fields_is_the_line_its_record_gives(
        tmp_path: Path, formatter: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The router's line per event skips making a record where only eventop's own handler
    would see it: the line is the same, field for field (the time aside)."""
    from eventop.router.logs import LineHandler, log_fields
    from eventop.router.logs import formatter as make_formatter

    path = tmp_path / "log"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT)
    handler = LineHandler(fd)
    handler.setFormatter(make_formatter(formatter))
    logger = logging.getLogger("eventop.test.fields")
    logger.addHandler(handler)
    monkeypatch.setattr(logger, "propagate", False)
    logger.setLevel(logging.INFO)
    fields = {"id": "e-1", "handlers": ["h"], "status": 200, "duration_ms": 1.25,
              "results": [{"handler": "h", "outcome": "ok", "detail": "done é"}]}
    records: list[Any] = []
    try:
        with monkeypatch.context() as m:
            m.setattr(logger, "makeRecord", lambda *a, **k: records.append(a))
            log_fields(logger, logging.INFO, "update ConfigMap a/b: h: done (200 in 1.25 ms)",
                       fields)
        assert records == []  # no record made: the line went straight to the handler
        logger.info("%s", "update ConfigMap a/b: h: done (200 in 1.25 ms)",
                    extra={"fields": fields})
        log_fields(logger, logging.DEBUG, "below the level", {"id": "e-2"})
    finally:
        logger.removeHandler(handler)
        logger.setLevel(logging.NOTSET)
        os.close(fd)
    direct, through_logging = path.read_text(encoding="utf-8").splitlines()
    if formatter == "json":
        direct_fields, record_fields = json.loads(direct), json.loads(through_logging)
        assert direct_fields.pop("time")[:16] == record_fields.pop("time")[:16]
        assert direct_fields == record_fields
        assert direct_fields["results"][0]["detail"] == "done é"
    else:
        assert TEXT_LINE.match(direct) and direct[24:] == through_logging[24:]


def test_a_filter_on_the_logger_still_sees_every_line_with_its_fields(
        caplog: pytest.LogCaptureFixture) -> None:
    """Where another handler or a filter is on the way, the record is made as usual."""
    from eventop.router.logs import log_fields

    seen: list[logging.LogRecord] = []
    logger = logging.getLogger("eventop.test.filtered")
    logger.addFilter(lambda record: seen.append(record) or True)
    caplog.set_level(logging.INFO, logger="eventop.test.filtered")
    try:
        log_fields(logger, logging.WARNING, "rejected", {"id": "e-3", "status": 400})
    finally:
        logger.filters.clear()
    [record] = seen
    assert record.getMessage() == "rejected" and record.fields == {"id": "e-3", "status": 400}
    assert [r.getMessage() for r in caplog.records] == ["rejected"]


def test_logging_setup_leaves_configured_logging_alone_unless_forced(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from eventop.router import logs

    logger = logging.getLogger("eventop")
    monkeypatch.setattr(logger, "handlers", [])
    monkeypatch.setattr(logger, "propagate", True)
    root_handler = logging.NullHandler()
    monkeypatch.setattr(logging.getLogger(), "handlers", [root_handler])
    logs.configure()
    assert logger.handlers == [] and logger.propagate  # pytest's or the host's handlers win
    logs.configure(force=True)
    [ours] = logger.handlers
    assert isinstance(ours.formatter, JsonFormatter) and not logger.propagate
    logs.configure(force=True)
    assert logger.handlers == [ours]  # idempotent


def test_an_event_that_ran_many_keys_is_one_short_line_failures_first() -> None:
    """A rates refresh with the provider down failed 23 ExchangeRates and wrote one 7 KB
    line repeating the same failure per key (a reviewer's report): the message spells out
    a few, failures first, and counts the rest; the field keeps at most FIELD_RESULTS."""
    from eventop.router import logs

    results = [{"handler": "exchange-rates", "outcome": "ok", "detail": f"ns/er-{i}: written"}
               for i in range(30)]
    results[17] = {"handler": "exchange-rates", "outcome": "error",
                   "detail": "ns/er-17: ProviderUnavailable"}
    info = {"type": "dev.eventop.exchangerates.refresh", "id": "r1"}
    message = logs.event_message(info, 500, 40000.0, results)
    assert message.startswith("dev.eventop.exchangerates.refresh: exchange-rates: FAILED: "
                              "ns/er-17: ProviderUnavailable; exchange-rates: ns/er-0: written")
    assert message.endswith("; and 25 more (29 ok, 1 failed in all; the event's answer "
                            "lists each) (500 in 40000 ms)")
    shown, more = logs.folded(results, logs.FIELD_RESULTS)
    assert (len(shown), more, shown[0]["outcome"]) == (logs.FIELD_RESULTS, 10, "error")
    assert logs.folded(results[:3], 5) == (results[:3], 0)


def test_a_resync_of_a_converged_rule_is_logged_at_debug_and_a_change_at_info(
        local_kube: Any, kube: Any, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The watcher sends every object again each resync period: an event whose runs wrote
    nothing (and the echo of eventop's own write) gets its line at debug, as an event no
    handler wants does; one whose run wrote something keeps its line at info."""
    monkeypatch.setenv("EVENTOP_RUN_ON_WATCH", "false")  # each run is an event's, below
    from eventop import handlers
    from eventop.router.app import create_app
    from eventop.testing import eventually
    from tests.copy_rules.support import config_map, copy_rule, namespace
    from tests.support.engine import wait_cached

    app = create_app(registry=handlers.load("", builtin="copy_rules"), kube=kube)
    client = app.test_client()
    try:
        eventually(lambda: client.get("/readyz").status_code == 200, 30, "a ready router")
        target = local_kube.put(namespace("team-a"))
        # someone else's ConfigMap at the copy's name in team-b: a conflict, reported once
        # (its Event), which a resync does not make news again
        squatted = local_kube.put(namespace("team-b"))
        squatter = local_kube.put(config_map("team-b", "settings", {"mine": "1"}))
        source = local_kube.put(config_map("default", "settings", {"a": "1"},
                                           {"copyrator": "true"}))
        rule = local_kube.put(copy_rule("share"))
        engine = app.extensions["eventop"]["engine"].get()
        for obj in (target, squatted, squatter, source, rule):  # the run below sees them all
            wait_cached(engine, obj)

        def lines(event: Any) -> list[int]:
            caplog.clear()
            assert post(client, binary(event)).status_code == 200
            return [r.levelno for r in caplog.records if r.name == "eventop.router"]

        caplog.set_level(logging.DEBUG, logger="eventop.router")
        assert lines(kube_event("add", rule)) == [logging.INFO]  # the copy is created
        stored = local_kube.get("eventop.dev/v1", "CopyRule", "share")
        assert "team-b" in str(stored["status"])  # the conflict, reported
        copy = eventually(lambda: local_kube.get("v1", "ConfigMap", "settings", "team-a"),
                          10, "the copy")
        assert lines(kube_event("add", copy)) == [logging.DEBUG]  # the echo of that create
        assert lines(kube_event("update", rule)) == [logging.DEBUG]  # a resync: as it is
        assert lines(kube_event("update", squatter)) == [logging.DEBUG]  # still in the way
        assert lines(kube_event("update", source)) == [logging.DEBUG]
        source["data"] = {"a": "2"}
        changed = local_kube.put(source)
        assert lines(kube_event("update", changed)) == [logging.INFO]  # the copy is updated
        assert local_kube.get("v1", "ConfigMap", "settings", "team-a")["data"] == {"a": "2"}
    finally:
        app.extensions["eventop"]["engine"].stop()


def test_a_rejected_events_line_names_the_event_once() -> None:
    from eventop.router.logs import event_message

    info = {"id": "e-1", "type": "", "kind": ""}
    assert event_message(info, 400, 1.5, error="event e-1: the event names Namespace 'a' in "
                         "namespace 'b', but Namespace is cluster-scoped") == (
        "event e-1: the event names Namespace 'a' in namespace 'b', but Namespace is "
        "cluster-scoped (400 in 1.5 ms)")


def test_a_kind_no_handler_listens_to_is_warned_about_once(
        client: FlaskClient, caplog: pytest.LogCaptureFixture) -> None:
    """A Trigger sending a kind whose handler the router did not load (EVENTOP_HANDLERS
    forgotten) is a mistake, not one of a cluster's many unmatched ConfigMap changes."""
    quota = {"apiVersion": "platform.example.com/v1", "kind": "TeamQuota",
             "metadata": {"name": "a", "namespace": "team-a", "uid": "q",
                          "resourceVersion": "1"}}
    caplog.set_level(logging.INFO, logger="eventop")
    for rv in ("1", "2"):
        quota["metadata"]["resourceVersion"] = rv
        assert post(client, binary(kube_event("update", quota))).status_code == 202
    [line] = [r for r in caplog.records if r.name == "eventop.router"]
    assert line.levelno == logging.WARNING
    assert line.getMessage().startswith(
        "events of platform.example.com/v1/TeamQuota arrive, but no loaded handler listens to "
        "that kind: they are answered 202 and dropped (is EVENTOP_HANDLERS set")
