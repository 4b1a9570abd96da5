"""The watcher against the local API server, through real HTTP, with failures injected.

Each test watches ConfigMaps labelled ``test=watcher`` in namespace ``demo`` (so the
``kube-root-ca.crt`` the local server publishes stays out of the way) and checks what the
sink received: every change exactly once (ids ``<uid>/<rv>/<change>``), in order per object.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from eventop.kube import Kube
from eventop.kube.reflector import WatchSettings
from eventop.testing.processes import WatcherProcess, free_port
from eventop.testing.waiting import wait_until
from eventop.watcher.delivery import Backoff, Deliverer, RetryPolicy
from eventop.watcher.recording import load_initial, load_recording
from eventop.watcher.specs import ResourceSpec
from eventop.watcher.watch import Watcher

REPO = Path(__file__).resolve().parents[2]
SPEC = "v1/configmaps@demo:test=watcher"


def cm(name: str, value: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": "demo", "labels": {"test": "watcher"}},
            "data": {"value": value}}


def event_id(change: str, obj: dict[str, Any]) -> str:
    return f"{obj['metadata']['uid']}/{obj['metadata']['resourceVersion']}/{change}"


def watch_requests(local_kube: Any) -> list[str]:
    return [q for m, p, q, _ in list(local_kube.requests)
            if p.endswith("/configmaps") and "watch=true" in q]


def list_requests(local_kube: Any, *, pages: bool = False) -> list[str]:
    """LIST requests made (first pages only, unless ``pages``)."""
    return [q for m, p, q, _ in list(local_kube.requests)
            if p.endswith("/configmaps") and "watch=" not in q
            and (pages or "continue=" not in q)]


@pytest.fixture
def start_watcher(local_kube, sink) -> Iterator[Callable[..., Watcher]]:
    watchers: list[Watcher] = []

    def start(*, queue_size: int = 100, lanes: int = 4, read_timeout: float = 1.5,
              resync: float = 0.0, url: str | None = None,
              specs: list[ResourceSpec] | None = None) -> Watcher:
        kube = Kube.connect(url=url or local_kube.url)
        deliverer = Deliverer(sink.url, lanes=lanes, queue_size=queue_size,
                              policy=RetryPolicy(Backoff(0.02, 0.2), timeout=(1.0, 5.0)))
        settings = WatchSettings(watch_timeout=30, read_timeout=read_timeout,
                                 connect_timeout=1.0, resync_seconds=resync, page_size=2,
                                 backoff=Backoff(0.05, 0.3))
        w = Watcher(kube, specs or [ResourceSpec.parse(SPEC)], deliverer, settings=settings,
                    source="http://test").start()
        watchers.append(w)
        return w

    yield start
    for w in watchers:
        w.stop(join_seconds=5)


def test_list_then_watch_sends_every_change_once_in_order(local_kube, sink, start_watcher):
    before = [local_kube.put(cm(f"pre-{i}", "0")) for i in range(5)]
    w = start_watcher()
    assert w.wait_synced(10)
    v1 = local_kube.put(cm("pre-0", "1"))
    new = local_kube.put(cm("fresh", "0"))
    local_kube.remove("v1", "ConfigMap", "pre-1", "demo")
    gone = {**before[1], "metadata": {**before[1]["metadata"]}}
    expected = [event_id("add", o) for o in before] + [
        event_id("update", v1), event_id("add", new)]
    assert sink.wait_for(len(expected) + 1)
    ids = sink.ids()
    assert set(expected) <= set(ids) and len(ids) == len(set(ids)) == 8
    delete = next(r for r in sink.accepted if r.type.endswith(".delete"))
    assert delete.id.startswith(gone["metadata"]["uid"] + "/")
    assert delete.subject == "/apis/v1/namespaces/demo/configmaps/pre-1"
    assert delete.headers["ce-source"] == "http://test"
    # A label-selected kind is listed in one page, whatever the page size (a 1.2x API server
    # ends a paginated filtered list early: see Kube.pages); unfiltered lists are paged.
    [listed] = list_requests(local_kube, pages=True)
    assert "labelSelector=test%3Dwatcher" in listed and "limit=" not in listed


def test_disconnect_mid_stream_resumes_without_duplicate_or_gap(local_kube, sink,
                                                               start_watcher):
    start_watcher()
    assert wait_until(lambda: len(watch_requests(local_kube)) == 1)
    expected = []
    opened = 0
    for i in range(12):
        expected.append(event_id("add" if i == 0 else "update",
                                 local_kube.put(cm("counter", str(i)))))
        if i % 3 == 1:  # cut the stream; the next change happens while it is down
            opened = len(watch_requests(local_kube))
            local_kube.break_watches()
        elif i % 3 == 2:  # let the watcher come back before cutting again
            assert wait_until(lambda n=opened: len(watch_requests(local_kube)) > n)
    assert sink.wait_for(12)
    time.sleep(0.3)  # a duplicate would arrive now
    assert sink.ids() == expected
    assert len(list_requests(local_kube)) == 1  # resumed, never re-listed
    resumed = watch_requests(local_kube)[1:]
    assert resumed  # (a cut can race with a reconnect, so not necessarily one per cut)
    assert all("resourceVersion=" in q and "resourceVersion=&" not in q for q in resumed)


def test_expired_history_relists_and_emits_exactly_the_difference(local_kube, sink,
                                                                  start_watcher, caplog):
    objs = {n: local_kube.put(cm(n, "0")) for n in ("a", "b", "c")}
    w = start_watcher()
    assert sink.wait_for(3)
    local_kube.set_unavailable(True)  # the watcher loses its watch and cannot come back yet
    a2 = local_kube.put(cm("a", "1"))
    local_kube.remove("v1", "ConfigMap", "b", "demo")
    d = local_kube.put(cm("d", "0"))
    local_kube.compact()  # the history it would resume from is gone: 410 Expired
    with caplog.at_level(logging.WARNING, "eventop.watcher"):
        local_kube.set_unavailable(False)
        assert sink.wait_for(6)
        time.sleep(0.3)
    after = sink.ids()[3:]
    assert sorted(after) == sorted([
        event_id("update", a2), event_id("add", d),
        f"{objs['b']['metadata']['uid']}/{objs['b']['metadata']['resourceVersion']}/delete"])
    assert len(list_requests(local_kube)) == 2
    assert "watch history expired" in caplog.text
    deleted = json.loads(next(r for r in sink.accepted if r.type.endswith(".delete")).body)
    assert deleted["metadata"]["name"] == "b" and deleted["metadata"]["namespace"] == "demo"
    assert deleted["metadata"]["labels"] == {"test": "watcher"}
    assert w.loops[0].known.keys() == {objs["a"]["metadata"]["uid"],
                                       objs["c"]["metadata"]["uid"], d["metadata"]["uid"]}


def test_hung_watch_is_detected_by_the_client_read_timeout(local_kube, sink, start_watcher,
                                                          caplog):
    start_watcher(read_timeout=1.2)
    assert wait_until(lambda: len(watch_requests(local_kube)) == 1)
    opened = 1
    with caplog.at_level(logging.WARNING, "eventop.watcher"):
        local_kube.hang_watches(True)
        obj = local_kube.put(cm("x", "1"))
        assert wait_until(lambda: len(watch_requests(local_kube)) > opened, 10)
        local_kube.hang_watches(False)
        assert sink.wait_for(1)
    assert "the watch looks hung" in caplog.text
    time.sleep(0.3)
    assert sink.ids() == [event_id("add", obj)]


def test_sink_down_for_a_while_then_every_event_delivered_in_object_order(
        local_kube, sink, start_watcher):
    w = start_watcher()
    assert w.wait_synced(10)
    port = sink.port
    sink.down()
    expected: dict[str, list[str]] = {}
    for i in range(8):
        for name in ("p", "q", "r"):
            obj = local_kube.put(cm(name, str(i)))
            expected.setdefault(name, []).append(event_id("add" if i == 0 else "update", obj))
    # Every change was read and is held while the sink is down, none delivered yet.
    assert wait_until(lambda: w.deliverer.pending == 24)
    assert sink.ids() == []
    sink.port = port
    sink.start()
    assert sink.wait_for(24)
    time.sleep(0.3)
    ids = sink.ids()
    assert len(ids) == 24
    for name, want in expected.items():
        assert [i for i in ids if i in set(want)] == want, name


def test_back_pressure_stops_reading_and_resumes_without_dropping(local_kube, sink,
                                                                 start_watcher, caplog):
    w = start_watcher(queue_size=2, lanes=1, read_timeout=1.0)
    assert w.wait_synced(10)
    port = sink.port
    sink.down()
    with caplog.at_level(logging.WARNING, "eventop.watcher"):
        expected = [event_id("add" if i == 0 else "update", local_kube.put(cm("bp", str(i))))
                    for i in range(10)]
        # Blocked longer than the read timeout, the watch gives up its stream.
        assert wait_until(lambda: "the sink is slow" in caplog.text)
        assert w.deliverer.pending == 2
        sink.port = port
        sink.start()
        assert sink.wait_for(10)
    time.sleep(0.3)
    assert sink.ids() == expected


def test_unavailable_api_server_is_retried_until_it_answers(local_kube, sink, start_watcher,
                                                           caplog):
    local_kube.set_unavailable(True)
    obj = local_kube.put(cm("early", "0"))
    with caplog.at_level(logging.ERROR, "eventop.watcher"):
        w = start_watcher()
        assert wait_until(lambda: "retrying in" in caplog.text, 10)
        local_kube.set_unavailable(False)
        assert w.wait_synced(10)
    assert sink.wait_for(1)
    assert sink.ids() == [event_id("add", obj)]


def test_unreachable_api_server_is_logged_clearly(start_watcher, caplog):
    with caplog.at_level(logging.ERROR, "eventop.watcher"):
        w = start_watcher(url="http://127.0.0.1:9")
        assert wait_until(lambda: "is the API server up" in caplog.text, 10)
    assert not w.loops[0].synced.is_set()


def test_an_optional_resource_not_served_is_one_warning_and_no_error(
        local_kube, sink, start_watcher, caplog):
    # The snapshot API is in the static table but not served here (no CRD): looked up by
    # discovery and waited for quietly, as the router's cache does, instead of an ERROR for
    # a 404 on every retry
    snapshots = ResourceSpec("snapshot.storage.k8s.io", "v1", "volumesnapshots",
                             optional=True)
    with caplog.at_level(logging.INFO, "eventop"):
        w = start_watcher(specs=[snapshots, ResourceSpec.parse(SPEC)])
        obj = local_kube.put(cm("meanwhile", "0"))
        assert sink.wait_for(1)  # the other resource is watched as usual
        time.sleep(1.0)
    assert sink.ids() == [event_id("add", obj)]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
    [warning] = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert "volumesnapshots" in warning.getMessage() and "not served" in warning.getMessage()
    assert not w.loops[0].synced.is_set()


def test_a_resource_whose_crd_is_deleted_is_one_warning_and_no_error_until_it_is_back(
        local_kube, sink, start_watcher, caplog):
    """After its "waiting until it is", each later 404 was an ERROR at every doubling of
    the backoff (a user's trial, CRDs deleted with the watcher running)."""
    import yaml

    from tests.kube.test_informer import SNAPSHOTS

    crd = local_kube.put(yaml.safe_load(SNAPSHOTS.read_text()))
    snapshots = ResourceSpec("snapshot.storage.k8s.io", "v1", "volumesnapshots")
    w = start_watcher(specs=[snapshots])
    assert wait_until(lambda: w.loops[0].synced.is_set(), 10)
    with caplog.at_level(logging.INFO, "eventop"):
        local_kube.remove(crd["apiVersion"], crd["kind"], crd["metadata"]["name"])
        assert wait_until(lambda: not w.loops[0].synced.is_set(), 10)
        time.sleep(1.5)  # several backoff periods of the test's watcher
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
    [warning] = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert "not served by the API server any more" in warning.getMessage()


def test_an_api_server_down_for_long_is_a_few_error_lines_not_one_per_attempt(
        start_watcher, caplog):
    def attempts() -> list[logging.LogRecord]:
        return [r for r in caplog.records if "retrying in" in r.getMessage()]

    with caplog.at_level(logging.DEBUG, "eventop.watcher"):
        start_watcher(url="http://127.0.0.1:9")
        assert wait_until(lambda: len(attempts()) >= 9, 20)
    errors = [r.getMessage() for r in attempts() if r.levelno == logging.ERROR]
    assert [e.rsplit("(attempt ", 1)[1] for e in errors][:4] == ["1)", "2)", "4)", "8)"]
    assert len(errors) <= 5  # 1, 2, 4, 8 (16 if slow): the rest at debug


def test_resync_sends_every_object_again_with_its_own_id(local_kube, sink, start_watcher):
    obj = local_kube.put(cm("steady", "0"))
    start_watcher(resync=0.5)
    assert sink.wait_for(2)
    assert sink.ids()[:2] == [event_id("add", obj), event_id("update", obj)]


def test_run_command_watches_serves_metrics_and_exits_cleanly_on_sigterm(local_kube, sink,
                                                                        tmp_path):
    obj = local_kube.put(cm("cli", "0"))
    port = free_port()
    proc = WatcherProcess(sink.url, {"EVENTOP_RESOURCES": SPEC,
                                     "EVENTOP_KUBE_URL": local_kube.url,
                                     "EVENTOP_METRICS_PORT": str(port)},
                          log_dir=str(tmp_path),
                          extra_args=["--read-timeout", "2", "--watch-timeout", "1"])
    try:
        assert sink.wait_for(1, 30)
        later = local_kube.put(cm("cli", "1"))
        assert sink.wait_for(2, 10)
        metrics = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    finally:
        proc.stop(keep_log=True)  # SIGTERM
    err = proc.log()
    assert proc.returncode == 0, err
    assert sink.ids() == [event_id("add", obj), event_id("update", later)]
    assert '"level": "info"' in err and "watching v1/configmaps@demo" in err
    assert ('eventop_watcher_events_emitted_total{kind="ConfigMap",'
            'type="dev.knative.apiserver.resource.update"} 1.0') in metrics
    assert "eventop_watcher_watch_starts_total" in metrics
    assert "eventop_watcher_queue_depth" in metrics


def test_record_saves_list_and_watch_that_replay_reads_back(local_kube, tmp_path):
    before = local_kube.put(cm("rec", "0"))
    env = {**os.environ, "PYTHONPATH": str(REPO), "EVENTOP_KUBE_URL": local_kube.url}
    proc = subprocess.Popen([sys.executable, "-m", "eventop.watcher", "record", str(tmp_path),
                             "--resource", "v1/configmaps:test=watcher", "--seconds", "3"],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, text=True)
    assert wait_until(lambda: (tmp_path / "api_v1_configmaps.watch.jsonl").exists(), 20)
    changed = local_kube.put(cm("rec", "1"))
    local_kube.remove("v1", "ConfigMap", "rec", "demo")
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0
    assert "v1/configmaps:test=watcher:" in out
    assert [o["metadata"]["uid"] for o in load_initial(tmp_path)] == [before["metadata"]["uid"]]
    assert load_initial(tmp_path)[0]["kind"] == "ConfigMap"
    recorded = [(c, o["metadata"]["resourceVersion"]) for c, o in load_recording(tmp_path)]
    assert recorded[0] == ("update", changed["metadata"]["resourceVersion"])
    assert [c for c, _ in recorded] == ["update", "delete"]


@pytest.mark.parametrize("sink_state", ["hanging", "refusing"])
def test_sigterm_with_the_sink_down_exits_right_after_the_drain(local_kube, tmp_path,
                                                                 sink_state: str) -> None:
    """Kubernetes sends SIGKILL 30 s after SIGTERM: the watcher must be gone before, even
    with a POST hanging on a sink that accepts connections and never answers."""
    local_kube.put(cm("stuck", "0"))
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    if sink_state == "hanging":
        silent.listen(64)  # connections complete in the kernel; nobody ever answers
    port = silent.getsockname()[1]
    proc = WatcherProcess(f"http://127.0.0.1:{port}/", {"EVENTOP_RESOURCES": SPEC,
                                                         "EVENTOP_KUBE_URL": local_kube.url},
                          log_dir=str(tmp_path),
                          extra_args=["--drain-seconds", "1", "--sink-timeout", "60"])
    try:
        assert wait_until(lambda: "list of 1 objects" in proc.log(), 30), proc.log()
        proc.proc.send_signal(signal.SIGTERM)
        # the drain is 1 s and the POST's own timeout 60 s: exiting at all within the wait
        # below proves the in-flight POST was not waited for
        proc.proc.wait(timeout=20)
    finally:
        proc.stop(keep_log=True)
        silent.close()
    assert proc.returncode == 1, proc.log()  # undelivered events: not a clean exit
    assert "stopping with 1 events not delivered" in proc.log()
