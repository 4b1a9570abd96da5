"""Delivery to a misbehaving sink: retried until accepted, in per-object order, bounded."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest

from eventop.events import to_cloudevent
from eventop.testing.waiting import wait_until
from eventop.watcher.delivery import (
    Backoff,
    Deliverer,
    Outgoing,
    RetryPolicy,
    post,
)
from eventop.watcher.sink import SinkClient
from tests.support.tls import tls_server

# Quick retries; a read timeout long enough that a slow answer on a loaded machine is not
# taken for a hanging sink (which would deliver the event twice).
FAST = RetryPolicy(Backoff(0.01, 0.05), timeout=(1.0, 5.0))
# For the tests where the sink hangs on purpose: the read timeout is what ends the wait.
HANG = RetryPolicy(Backoff(0.01, 0.05), timeout=(1.0, 0.5))


def _obj(name: str, rv: int, ns: str = "default") -> dict:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": ns, "uid": f"uid-{name}",
                         "resourceVersion": str(rv)}, "data": {"k": str(rv)}}


def _item(name: str, rv: int, change: str = "update") -> Outgoing:
    return Outgoing.of(to_cloudevent(change, _obj(name, rv), "test"), key=name)


@pytest.mark.parametrize("status", [500, 503, 404, 408, 409, 429])
def test_transient_answers_are_retried_until_accepted(sink, status: int) -> None:
    sink.fail(3, status)
    with SinkClient(sink.url) as s:
        result = post(s, _item("a", 1), FAST)
    assert result.ok and result.attempts == 4
    assert sink.ids() == ["uid-a/1/update"]


def test_a_token_the_router_refuses_is_retried_saying_what_to_fix_not_given_up(
        sink, caplog: pytest.LogCaptureFixture) -> None:
    # EVENTOP_ROUTER_TOKEN changed on one side first: every event is refused alike until
    # both agree, so none is given up (a delete would be lost: no resync brings it back)
    sink.fail(2, 401)
    with caplog.at_level(logging.WARNING, "eventop.watcher"), SinkClient(sink.url) as s:
        result = post(s, _item("a", 1), FAST)
    assert result.ok and result.attempts == 3
    assert "EVENTOP_ROUTER_TOKEN must be the same for both" in caplog.text
    assert "giving up" not in caplog.text


def test_retry_after_is_honoured(sink) -> None:
    sink.fail(1, 429, retry_after="0")
    sink.fail(1, 503, retry_after="0.2")
    policy = RetryPolicy(Backoff(30.0, 30.0), timeout=(1.0, 1.0))  # backoff alone would wait
    with SinkClient(sink.url) as s:
        result = post(s, _item("a", 1), policy)
    assert result.ok and result.attempts == 3


def test_hanging_sink_times_out_and_is_retried(sink) -> None:
    sink.hang(1)
    with SinkClient(sink.url) as s:
        result = post(s, _item("a", 1), HANG)
    assert result.ok and result.attempts == 2
    assert sink.ids() == ["uid-a/1/update"]


@pytest.mark.parametrize("status", [400, 403, 413, 415, 422])
def test_other_client_errors_are_given_up_loudly(sink, status: int,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    sink.fail(1, status)
    with caplog.at_level(logging.ERROR, "eventop.watcher"), SinkClient(sink.url) as s:
        result = post(s, _item("secret-thing", 7), FAST)
    assert not result.ok and result.status == status and result.attempts == 1
    assert "uid-secret-thing/7/update" in caplog.text
    assert '"k"' not in caplog.text  # never the event data: it may be a Secret


def test_bounded_attempts_give_up_on_a_dead_sink() -> None:
    policy = RetryPolicy(Backoff(0.01, 0.01), timeout=(0.5, 0.5), max_attempts=3)
    with SinkClient("http://127.0.0.1:9/") as s:
        result = post(s, _item("a", 1), policy)
    assert not result.ok and result.attempts == 3 and result.status is None


def test_per_object_order_holds_across_parallel_lanes_and_failures(sink) -> None:
    sink.fail(5, 500)
    d = Deliverer(sink.url, lanes=4, queue_size=100, policy=FAST).start()
    try:
        for rv in range(1, 21):
            for name in ("a", "b", "c"):
                assert d.submit(_item(name, rv), timeout=5)
        assert d.join(20)
    finally:
        d.stop()
    assert d.delivered == 60
    for name in ("a", "b", "c"):
        rvs = [int(i.split("/")[1]) for i in sink.ids() if i.startswith(f"uid-{name}/")]
        assert rvs == list(range(1, 21))


def test_full_buffer_blocks_submit_instead_of_growing(sink) -> None:
    sink.hang(1)
    policy = RetryPolicy(Backoff(0.01, 0.05), timeout=(1.0, 2.0))  # the hang outlasts the submits
    d = Deliverer(sink.url, lanes=1, queue_size=2, policy=policy).start()
    try:
        assert d.submit(_item("a", 1), timeout=1)
        assert d.submit(_item("a", 2), timeout=1)
        assert not d.submit(_item("a", 3), timeout=0.2)  # full: the caller must wait
        assert d.pending == 2
        assert d.join(10)
        assert d.submit(_item("a", 3), timeout=1)
        assert d.join(10)
    finally:
        d.stop()
    assert sink.ids() == ["uid-a/1/update", "uid-a/2/update", "uid-a/3/update"]


def test_sink_down_for_a_while_loses_nothing(sink) -> None:
    port = sink.port
    sink.down()
    d = Deliverer(sink.url, lanes=3, queue_size=50, policy=FAST).start()
    try:
        for rv in range(1, 11):
            for name in ("a", "b"):
                assert d.submit(_item(name, rv), timeout=5)
        assert not d.join(0.5)  # nothing can be delivered while the port is closed
        sink.port = port
        sink.start()
        assert d.join(20)
    finally:
        d.stop()
    assert len(sink.ids()) == 20 and len(set(sink.ids())) == 20
    for name in ("a", "b"):
        rvs = [int(i.split("/")[1]) for i in sink.ids() if i.startswith(f"uid-{name}/")]
        assert rvs == list(range(1, 11))


def test_stop_reports_what_was_left_undelivered() -> None:
    d = Deliverer("http://127.0.0.1:9/", lanes=1, queue_size=10,
                  policy=RetryPolicy(Backoff(5.0, 5.0), timeout=(0.2, 0.2))).start()
    for rv in (1, 2, 3):
        assert d.submit(_item("a", rv), timeout=1)
    left = d.stop(drain_seconds=0.2)
    assert left == 3
    assert not d.submit(_item("a", 4), timeout=0.1)


def test_event_the_handlers_keep_failing_is_given_up_and_others_are_delivered(
        sink, caplog: pytest.LogCaptureFixture) -> None:
    sink.break_events("uid-broken/", 500)
    policy = RetryPolicy(Backoff(0.01, 0.05), timeout=(1.0, 5.0), max_error_attempts=3)
    d = Deliverer(sink.url, lanes=1, queue_size=10, policy=policy).start()
    try:
        with caplog.at_level(logging.ERROR, "eventop.watcher"):
            assert d.submit(_item("broken", 1), timeout=1)
            assert d.submit(_item("healthy", 1), timeout=1)  # one worker, queued behind it
            assert d.join(10)
    finally:
        d.stop()
    assert sink.attempts == 4 and sink.ids() == ["uid-healthy/1/update"]
    assert d.delivered == 1
    assert "uid-broken/1/update" in caplog.text and "giving up" in caplog.text
    assert "resync sends the object again" in caplog.text


def test_an_object_whose_handler_keeps_failing_backs_off_alone(sink) -> None:
    """client-go's rate-limited work queue: the failing key waits, every other key flows."""
    sink.break_events("uid-broken/", 500)
    policy = RetryPolicy(Backoff(0.2, 0.4), timeout=(1.0, 5.0), max_error_attempts=0)
    d = Deliverer(sink.url, lanes=1, queue_size=100, policy=policy).start()
    try:
        assert d.submit(_item("broken", 1), timeout=1)
        assert d.submit(_item("broken", 2), timeout=1)  # its successor waits for it, in order
        for i in range(30):
            assert d.submit(_item(f"healthy-{i}", 1), timeout=1)
        assert sink.wait_for(30)  # all delivered by the single worker...
        # ...while the broken object is still being retried
        assert wait_until(lambda: d.delivered == 30, 10) and d.pending == 2
        broken_attempts = sink.attempts - 30
        assert broken_attempts >= 1
        sink.mend_events("uid-broken/")
        assert d.join(10)
    finally:
        d.stop()
    assert sink.ids()[-2:] == ["uid-broken/1/update", "uid-broken/2/update"]
    assert d.delivered == 32


def test_a_slow_kind_never_holds_every_worker(sink) -> None:
    """ExchangeRates while the rates provider is down: each event is slow. They may take
    half of the workers; objects of every other kind keep the other half."""
    sink.slow_events("uid-rate-", 1.0)
    d = Deliverer(sink.url, lanes=2, queue_size=100, policy=FAST).start()
    try:
        for i in range(6):
            rate = {"apiVersion": "eventop.dev/v1", "kind": "ExchangeRate",
                    "metadata": {"name": f"rate-{i}", "namespace": "default",
                                 "uid": f"uid-rate-{i}", "resourceVersion": "1"}}
            assert d.submit(Outgoing.of(to_cloudevent("add", rate, "test"), key=f"r{i}"), 1)
        for i in range(10):
            assert d.submit(_item(f"cm-{i}", 1), timeout=1)
        assert sink.wait_for(10, 20)
        # all ten ConfigMaps are through while most ExchangeRates still wait their turn
        configmaps = [i for i in sink.ids() if i.startswith("uid-cm-")]
        assert len(configmaps) == 10 and len(sink.ids()) < 16
        assert d.max_per_kind == 1
        assert d.join(20)
    finally:
        d.stop()
    assert len(sink.ids()) == 16


def test_a_sink_outage_pauses_everyone_without_aging_each_objects_backoff(sink) -> None:
    """Connection refused is the sink's failure, not the event's: the shared gate retries
    it with the short sink backoff, so a long outage does not leave every key with a
    minutes-long backoff (the per-object backoff here is 30 s: waiting on it would not
    finish within the join below)."""
    port = sink.port
    sink.down()
    policy = RetryPolicy(Backoff(30.0, 30.0), timeout=(1.0, 5.0),
                         sink_backoff=Backoff(0.05, 0.2))
    d = Deliverer(sink.url, lanes=2, queue_size=50, policy=policy).start()
    try:
        for i in range(10):
            assert d.submit(_item(f"o{i}", 1), timeout=1)
        assert not d.join(1.0)  # a second of refused connections: many failed attempts
        sink.port = port
        sink.start()
        assert d.join(15)
    finally:
        d.stop()
    assert sorted(sink.ids()) == sorted(f"uid-o{i}/1/update" for i in range(10))


def test_stop_after_the_drain_does_not_wait_for_a_hanging_post(sink) -> None:
    """SIGTERM with the sink hanging: the watcher must exit right after its drain, not
    after the sink's read timeout (Kubernetes kills it 30 s after SIGTERM)."""
    sink.hang(5)
    policy = RetryPolicy(Backoff(0.01, 0.05), timeout=(1.0, 30.0))
    d = Deliverer(sink.url, lanes=2, queue_size=10, policy=policy, max_per_kind=2).start()
    for name in ("a", "b", "c"):
        assert d.submit(_item(name, 1), timeout=1)
    assert wait_until(lambda: sink.hanging == 2, 10)
    left = d.stop(drain_seconds=0.2, grace=0.2)
    assert left == 3
    assert sink.hanging == 2  # returned while both POSTs still hang on the sink


def test_unavailable_api_is_retried_past_the_handler_error_limit(sink) -> None:
    sink.fail(4, 503)
    policy = RetryPolicy(Backoff(0.01, 0.05), timeout=(1.0, 5.0), max_error_attempts=2)
    with SinkClient(sink.url) as s:
        result = post(s, _item("a", 1), policy)
    assert result.ok and result.attempts == 5


def test_the_sinks_proxy_comes_from_the_environment_read_once(
        sink, monkeypatch: pytest.MonkeyPatch) -> None:
    """``HTTP_PROXY`` and ``NO_PROXY`` decide how the sink is reached, read when the client
    is made, not for every event it posts."""
    # Through the proxy (the sink plays it: it takes the absolute-URL request) to a host
    # that does not resolve, as a sink behind an egress proxy would be.
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{sink.port}")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    proxied = SinkClient("http://sink.invalid/")
    monkeypatch.delenv("HTTP_PROXY")  # the client keeps what it read
    assert post(proxied, _item("a", 1), FAST).ok
    # NO_PROXY names the sink: straight to it, past a proxy that is not there.
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    direct = SinkClient(sink.url)
    assert direct.proxy is None
    assert post(direct, _item("b", 1), FAST).ok
    assert [r.id for r in sink.accepted] == [_item("a", 1).event_id, _item("b", 1).event_id]


def test_a_proxy_given_without_a_scheme_is_taken_as_http(sink, monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    """``HTTP_PROXY=host:port`` works, as it did through requests (and does with curl)."""
    monkeypatch.setenv("HTTP_PROXY", f"127.0.0.1:{sink.port}")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    client = SinkClient("http://sink.invalid/")
    assert client.proxy == f"http://127.0.0.1:{sink.port}"
    assert post(client, _item("a", 1), FAST).ok


def test_a_deliverer_whose_proxy_can_not_be_used_refuses_to_start(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Said at start, in the caller's thread: inside a worker it would have stopped delivery
    without a word."""
    monkeypatch.setenv("HTTP_PROXY", "socks5://proxy.example:1080")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    with pytest.raises(ValueError, match=re.escape("through the proxy 'socks5://proxy.example:1080'")):
        Deliverer("http://router.example/", lanes=2).start()


def test_an_https_sink_is_verified_against_the_ca_bundle_named_in_the_environment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    once = RetryPolicy(Backoff(0.01, 0.01), timeout=(1.0, 5.0), max_attempts=1)
    for name in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy", "REQUESTS_CA_BUNDLE",
                 "CURL_CA_BUNDLE"):
        monkeypatch.delenv(name, raising=False)
    with tls_server(tmp_path) as server:
        untrusted = post(SinkClient(server.url() + "/"), _item("a", 1), once)
        assert not untrusted.ok and untrusted.status is None
        assert "CERTIFICATE_VERIFY_FAILED" in untrusted.detail
        monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(server.ca))
        assert post(SinkClient(server.url() + "/"), _item("a", 1), once).ok
