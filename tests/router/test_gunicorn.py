"""The router as it really runs: ``python -m eventop.router`` under gunicorn, over real HTTP.

One router (2 workers) serves the whole module, with only the recording handlers of
:mod:`tests.router.recording_handlers` loaded; each handler appends what it got to a file.
"""

from __future__ import annotations

import collections
import json
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import requests

from eventop.events import to_cloudevent, to_http
from eventop.testing.processes import RouterProcess, free_port
from eventop.testing.waiting import wait_until
from eventop.watcher.recording import load_recording
from tests.router.support import (
    FAIL_TYPE,
    HANDLER_FOR_KIND,
    KUBE_TYPE,
    SLOW_TYPE,
    UNAVAILABLE_TYPE,
    binary,
    cloudevent,
    configmap,
    kube_event,
    structured,
)
from tests.support.apiserver import local_kube_server

REPO = Path(__file__).resolve().parents[2]
RECORDINGS = REPO / "tests" / "recordings"
MODULE = "tests.router.recording_handlers"


@pytest.fixture(scope="module")
def api() -> Iterator[Any]:
    """One local API server for the module's router (``local_kube`` is fresh per test)."""
    with local_kube_server() as server:
        yield server


class Router:
    def __init__(self, process: RouterProcess, record: Path) -> None:
        self.process = process
        self.url = process.url
        self.record = record

    def records(self) -> list[dict[str, Any]]:
        if not self.record.exists():
            return []
        return [json.loads(line) for line in self.record.read_text().splitlines()]

    def post(self, message: tuple[dict[str, str], bytes],
             session: requests.Session | None = None) -> requests.Response:
        headers, body = message
        return (session or requests).post(self.url, headers=headers, data=body, timeout=30)

    def log_lines(self) -> list[dict[str, Any]]:
        out = []
        for line in self.process.log().splitlines():
            if line.startswith("{"):
                out.append(json.loads(line))
        return out


@pytest.fixture(scope="module")
def router(api: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Router]:
    tmp = tmp_path_factory.mktemp("router")
    record = tmp / "received.jsonl"
    process = RouterProcess({"EVENTOP_BUILTIN_HANDLERS": "none", "EVENTOP_HANDLERS": MODULE,
                             "EVENTOP_TEST_RECORD": str(record), "EVENTOP_KUBE_URL": api.url},
                            workers=2, log_dir=str(tmp))
    try:
        yield Router(process, record)
    finally:
        process.stop()


def test_recorded_watch_events_reach_the_handler_for_their_kind(router: Router) -> None:
    recorded = load_recording([RECORDINGS / "copy-rules", RECORDINGS / "mirrors-and-rates"])
    assert len(recorded) > 30
    expected = []
    with requests.Session() as session:
        for change, obj in recorded:
            event = to_cloudevent(change, obj, "https://10.96.0.1:443")
            handler = HANDLER_FOR_KIND[(obj["apiVersion"], obj["kind"])]
            resp = router.post(to_http(event), session)
            assert resp.status_code == 200, resp.text
            assert resp.json()["handlers"][0]["handler"] == f"{MODULE}.{handler}"
            expected.append((event.get_id(), handler, obj["kind"], obj["metadata"]["name"]))
    ids = {e[0] for e in expected}
    got = [(r["id"], r["handler"], r["kind"], r["name"]) for r in router.records()
           if r["id"] in ids]
    assert collections.Counter(got) == collections.Counter(expected)
    assert {kind for _, _, kind, _ in got} == {kind for _, kind in HANDLER_FOR_KIND}


def test_structured_mode_over_http_is_handled(router: Router) -> None:
    obj = configmap("structured-cm", "team-a", uid="st-1", resource_version="5")
    resp = router.post(structured(kube_event("add", obj)))
    assert resp.status_code == 200, resp.text
    [rec] = [r for r in router.records() if r["id"] == "st-1/5/add"]
    assert (rec["handler"], rec["namespace"], rec["data_type"]) == (
        "configmaps", "team-a", "dict")
    assert rec["extensions"]["kind"] == "ConfigMap"
    assert rec["time"] == "2026-11-21T07:40:58Z"


def test_handler_exception_is_500_and_the_workers_keep_serving(router: Router) -> None:
    for i in range(6):  # fresh connections, so both workers see failures
        resp = router.post(binary(cloudevent(FAIL_TYPE, {"n": i}, id_=f"fail-{i}")))
        assert resp.status_code == 500
        body = resp.json()
        assert body["id"] == f"fail-{i}"
        assert body["error"] == (f"event fail-{i}: handler(s) failed: {MODULE}.fail: "
                                 f"RuntimeError: deliberate test failure for fail-{i}")
    resp = router.post(binary(cloudevent(UNAVAILABLE_TYPE, {}, id_="down-1")))
    assert resp.status_code == 503
    assert "Kubernetes API unreachable (simulated" in resp.json()["error"]
    after = configmap("after-failures", uid="af", resource_version="1")
    assert router.post(binary(kube_event("add", after))).status_code == 200
    failures = [line for line in router.log_lines()
                if line.get("message", "").startswith(f"handler {MODULE}.fail failed")]
    assert {line["id"] for line in failures} == {f"fail-{i}" for i in range(6)}
    assert all("RuntimeError: deliberate test failure" in line["traceback"]
               for line in failures)
    log = router.process.log()
    assert len(re.findall(r"Booting worker with pid", log)) == 2, log
    assert "Worker exiting" not in log and "WORKER TIMEOUT" not in log


def test_bad_input_over_http_gets_4xx_and_the_router_keeps_serving(router: Router) -> None:
    resp = requests.post(router.url, data=b"{}", timeout=30,
                         headers={"ce-id": "x", "ce-source": "/s", "ce-specversion": "1.0",
                                  "Content-Type": "application/json"})
    assert resp.status_code == 400
    assert resp.json()["error"] == ("missing or empty required CloudEvents attribute(s): "
                                    "'type' (header ce-type)")
    big = b'{"pad": "' + b"x" * (8 * 1024 * 1024) + b'"}'
    resp = requests.post(router.url, data=big, timeout=30,
                         headers={"ce-id": "big", "ce-source": "/s", "ce-type": "test.big",
                                  "ce-specversion": "1.0", "Content-Type": "application/json"})
    assert resp.status_code == 413
    assert resp.json()["error"].startswith("request body is larger than the limit of 8388608")
    chunks = (b"x" * 65536 for _ in range(130))  # 8.1 MiB, chunked: no Content-Length
    resp = requests.post(router.url, data=chunks, timeout=30,
                         headers={"ce-id": "chunked", "ce-source": "/s", "ce-type": "test.big",
                                  "ce-specversion": "1.0", "Content-Type": "text/plain"})
    assert resp.status_code == 413
    assert resp.json()["id"] == "chunked"
    resp = requests.post(router.url, json={"a": 1}, timeout=30)
    assert resp.status_code == 415
    assert resp.json()["error"].startswith("not a CloudEvent: Content-Type 'application/json'")
    assert requests.get(router.url + "/healthz", timeout=5).status_code == 200


def test_one_json_log_line_per_event_on_stderr(router: Router) -> None:
    obj = configmap("logged", "team-b", data={"password": "do-not-log-me"}, uid="lg",
                    resource_version="3")
    assert router.post(binary(kube_event("update", obj))).status_code == 200
    [line] = [line for line in router.log_lines() if line.get("id") == "lg/3/update"]
    assert {k: line[k] for k in ("type", "kind", "namespace", "name", "handlers", "outcome",
                                 "status")} == {
        "type": "dev.knative.apiserver.resource.update", "kind": "ConfigMap",
        "namespace": "team-b", "name": "logged", "handlers": [f"{MODULE}.configmaps"],
        "outcome": "ok", "status": 200}
    assert "duration_ms" in line
    assert "do-not-log-me" not in router.process.log()


def test_readyz_is_200_when_the_api_answers(router: Router) -> None:
    resp = requests.get(router.url + "/readyz", timeout=10)
    assert resp.status_code == 200
    assert resp.json()["ready"] is True


def test_handlers_reach_the_kubernetes_api_from_every_worker(router: Router, api: Any) -> None:
    uid = api.get("v1", "Namespace", "default")["metadata"]["uid"]
    for i in range(6):  # fresh connections, so both workers answer some
        resp = router.post(binary(cloudevent(KUBE_TYPE, {"namespace": "default"}, id_=f"k{i}")))
        assert resp.status_code == 200, resp.text
        assert resp.json()["handlers"][0]["detail"] == f"namespace default: uid {uid}"
    resp = router.post(binary(cloudevent(KUBE_TYPE, {"namespace": "nope"}, id_="k-absent")))
    assert resp.json()["handlers"][0]["detail"] == "namespace nope: absent"


def _sample(text: str, name: str, **labels: str) -> float:
    """The value of one sample in Prometheus text (labels in any order)."""
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        raw = line[len(name) + 1:line.rindex("}")]
        found = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', raw))
        if found == labels:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_metrics_add_up_across_workers(router: Router) -> None:
    text = requests.get(router.url + "/metrics", timeout=10).text
    labels = {"type": SLOW_TYPE, "kind": "", "outcome": "ok"}
    before = _sample(text, "eventop_events_total", **labels)
    handler = f"{MODULE}.slow"
    before_h = _sample(text, "eventop_handler_duration_seconds_count", handler=handler)
    sent = 0
    pids: set[int] = set()

    def send(n: int) -> int:
        return router.post(binary(cloudevent(SLOW_TYPE, {"n": n}, id_=f"slow-{n}"))).status_code

    with ThreadPoolExecutor(max_workers=12) as pool:
        for _ in range(20):  # until events landed in two different workers
            statuses = list(pool.map(send, range(sent, sent + 12)))
            assert statuses == [200] * 12
            sent += 12
            pids = {r["pid"] for r in router.records() if r["handler"] == "slow"}
            if len(pids) >= 2:
                break
    assert len(pids) >= 2, "all events were served by one worker; cannot check aggregation"
    # Scrape several times: each scrape may reach either worker, and each must see all.
    for _ in range(4):
        text = requests.get(router.url + "/metrics", timeout=10).text
        assert _sample(text, "eventop_events_total", **labels) == before + sent
        assert _sample(text, "eventop_handler_duration_seconds_count",
                       handler=handler) == before_h + sent
        assert _sample(text, "eventop_kube_requests_total", verb="version",
                       resource="", code="200", manager="eventop") >= 1


def test_router_starts_and_reports_an_unreachable_api(tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    process = RouterProcess({"EVENTOP_BUILTIN_HANDLERS": "none", "EVENTOP_HANDLERS": MODULE,
                             "EVENTOP_TEST_RECORD": str(tmp_path / "r.jsonl"),
                             "EVENTOP_KUBE_URL": dead}, workers=1, log_dir=str(tmp_path))
    try:
        resp = requests.get(process.url + "/readyz", timeout=10)
        assert resp.status_code == 503
        assert f"Kubernetes API unreachable at {dead}" in resp.json()["reason"]
        assert requests.get(process.url + "/healthz", timeout=5).status_code == 200
        headers, body = binary(kube_event("add", configmap(uid="dead", resource_version="1")))
        resp = requests.post(process.url, headers=headers, data=body, timeout=10)
        assert resp.status_code == 200  # the recording handler needs no API
        warnings = wait_until(lambda: [
            json.loads(line) for line in process.log().splitlines()
            if line.startswith("{") and "Kubernetes API unreachable" in line], 30)
        assert warnings and warnings[0]["level"] == "warning"
        assert "/readyz answers 503" in warnings[0]["message"]
    finally:
        process.stop()
