"""In-process access (what test fixtures use to play the outside world) and the CLI."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import pytest
import requests

from eventop.kube import Kube
from eventop.localkube import ApiError, LocalKube
from tests.localkube.support import REPO, Http, cm


def test_put_creates_then_replaces_with_events_like_an_api_write(lk: LocalKube,
                                                                 http: Http) -> None:
    rv = str(lk.resource_version)
    first = lk.put(cm("x", data={"a": "1"}))
    second = lk.put(cm("x", data={"a": "2"}))
    assert first["metadata"]["uid"] == second["metadata"]["uid"]
    events = http.watch("/api/v1/configmaps", resourceVersion=rv, timeoutSeconds=0.3)
    assert [(e["type"], e["object"]["data"]) for e in events] == [
        ("ADDED", {"a": "1"}), ("MODIFIED", {"a": "2"})]


def test_put_keeps_recorded_identity_status_and_generation(lk: LocalKube) -> None:
    recorded = {"apiVersion": "eventop.dev/v1", "kind": "RegistryMirror",
                "metadata": {"name": "hub", "namespace": "registry-mirrors", "uid": "u-1",
                             "generation": 2, "creationTimestamp": "2026-11-21T07:42:44Z"},
                "spec": {"upstream": "https://registry-1.docker.io", "hostPort": 5001},
                "status": {"endpoint": "localhost:5001"}}
    stored = lk.put(recorded)
    assert stored["metadata"]["uid"] == "u-1"
    assert stored["metadata"]["generation"] == 2
    assert stored["metadata"]["creationTimestamp"] == "2026-11-21T07:42:44Z"
    assert stored["status"] == {"endpoint": "localhost:5001"}
    assert lk.get("v1", "Namespace", "registry-mirrors") is not None  # created on demand


def test_put_with_another_uid_replaces_the_object_by_delete_and_create(lk: LocalKube,
                                                                      http: Http) -> None:
    old = lk.put(cm("x"))
    rv = str(lk.resource_version)
    new = cm("x")
    new["metadata"]["uid"] = "new-uid"
    lk.put(new)
    events = http.watch("/api/v1/configmaps", resourceVersion=rv, timeoutSeconds=0.3)
    assert [(e["type"], e["object"]["metadata"]["uid"]) for e in events] == [
        ("DELETED", old["metadata"]["uid"]), ("ADDED", "new-uid")]


def test_put_refuses_what_the_api_would_refuse(lk: LocalKube) -> None:
    with pytest.raises(ApiError, match="Unsupported value"):
        lk.put({"apiVersion": "eventop.dev/v1", "kind": "ExchangeRate",
                "metadata": {"name": "x", "namespace": "default"}, "spec": {"currency": "EUR"}})


def test_get_list_and_remove(lk: LocalKube) -> None:
    lk.put(cm("a", labels={"t": "1"}))
    lk.put(cm("b"))
    assert lk.get("v1", "ConfigMap", "a", "default")["metadata"]["labels"] == {"t": "1"}
    assert lk.get("v1", "ConfigMap", "nope", "default") is None
    assert [o["metadata"]["name"] for o in lk.list("v1", "ConfigMap", "default", "t=1")] == ["a"]
    removed = lk.remove("v1", "ConfigMap", "a", "default")
    assert removed is not None and removed["metadata"]["name"] == "a"
    assert lk.remove("v1", "ConfigMap", "a", "default") is None
    assert lk.wait_idle()


def test_returned_objects_are_copies(lk: LocalKube) -> None:
    lk.put(cm("a"))
    lk.get("v1", "ConfigMap", "a", "default")["data"]["k"] = "mutated"  # type: ignore[index]
    assert lk.get("v1", "ConfigMap", "a", "default")["data"] == {"k": "v"}  # type: ignore[index]


def test_stop_closes_every_connection_and_thread() -> None:
    before = set(threading.enumerate())
    server = LocalKube(crd_dir=REPO / "crds")
    url = server.start()
    kube = Kube.connect(url=url)
    kube.list("v1", "Namespace")  # leaves an idle keep-alive connection open
    watching = requests.get(url + "/api/v1/configmaps", params={"watch": "1"}, stream=True,
                            timeout=5)
    server.stop()
    watching.close()
    assert set(threading.enumerate()) <= before
    with pytest.raises(requests.exceptions.ConnectionError):
        requests.get(url + "/version", timeout=2)


def test_the_cli_prints_its_url_and_stops_on_sigterm() -> None:
    proc = subprocess.Popen([sys.executable, "-m", "eventop.localkube", "--port", "0"], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:")
        assert requests.get(url + "/version", timeout=5).json()["gitVersion"].startswith("v1.24")
        names = [i["name"] for i in
                 requests.get(url + "/apis/eventop.dev/v1", timeout=5).json()["resources"]]
        assert "exchangerates" in names
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0


def test_the_cli_explains_a_busy_port(lk: LocalKube) -> None:
    result = subprocess.run([sys.executable, "-m", "eventop.localkube", "--port", str(lk.port)],
                            cwd=REPO, capture_output=True, text=True, timeout=30,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.returncode == 1 and "cannot start" in result.stderr


def test_many_objects_list_and_watch_without_trouble(lk: LocalKube) -> None:
    kube = Kube.connect(url=lk.url)
    for i in range(2000):
        lk.put(cm(f"c{i:05d}", f"ns-{i % 20}"))
    pages = list(kube.pages(kube.resource("v1", "ConfigMap")))
    items, rv = [i for p in pages for i in p["items"]], pages[-1]["metadata"]["resourceVersion"]
    assert len(items) == 2000 + 24  # plus a kube-root-ca.crt per namespace
    http = Http(lk.url)
    lk.put(cm("late"))
    events = http.watch("/api/v1/configmaps", resourceVersion=rv, timeoutSeconds=0.3)
    http.close()
    assert [e["object"]["metadata"]["name"] for e in events] == ["late"]
