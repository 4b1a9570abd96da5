"""Watches: resume from a resourceVersion, bookmarks, 410, selectors, faults."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest
import requests

from eventop.kube import Kube, errors
from eventop.localkube import LocalKube
from tests.localkube.support import REPO, Http, RawWatch, cm

CMS = "/api/v1/namespaces/default/configmaps"


def _types(events: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(e["type"], e["object"]["metadata"].get("name", "")) for e in events]


def test_a_watch_from_a_version_sends_only_what_happened_after_it(
        lk: LocalKube, k: Kube, http: Http) -> None:
    k.create(cm("before"))
    rv = str(lk.resource_version)
    k.create(cm("after"))
    k.patch("v1", "ConfigMap", "after", "default", {"data": {"k": "2"}})
    k.delete("v1", "ConfigMap", "after", "default")
    events = http.watch(CMS, resourceVersion=rv, timeoutSeconds=0.3)
    assert _types(events) == [("ADDED", "after"), ("MODIFIED", "after"), ("DELETED", "after")]
    rvs = [int(e["object"]["metadata"]["resourceVersion"]) for e in events]
    assert rvs == sorted(set(rvs)) and rvs[-1] == lk.resource_version


def test_deleted_events_carry_the_last_state_with_a_new_version(lk: LocalKube, k: Kube,
                                                               http: Http) -> None:
    obj = k.create(cm("x", data={"last": "state"}))
    k.delete("v1", "ConfigMap", "x", "default")
    [deleted] = http.watch(CMS, resourceVersion=obj["metadata"]["resourceVersion"],
                           timeoutSeconds=0.3)
    assert deleted["type"] == "DELETED"
    assert deleted["object"]["data"] == {"last": "state"}
    assert int(deleted["object"]["metadata"]["resourceVersion"]) > \
        int(obj["metadata"]["resourceVersion"])


@pytest.mark.parametrize("rv", ["", "0"])
def test_a_watch_without_a_version_starts_with_the_current_state(k: Kube, http: Http,
                                                                 rv: str) -> None:
    k.create(cm("x"))
    events = http.watch(CMS, resourceVersion=rv, timeoutSeconds=0.3)
    assert sorted(_types(events)) == [("ADDED", "kube-root-ca.crt"), ("ADDED", "x")]


def test_bookmarks_carry_the_latest_version(lk: LocalKube, k: Kube, http: Http) -> None:
    rv = str(lk.resource_version)
    k.create({"apiVersion": "v1", "kind": "Secret",
              "metadata": {"name": "s", "namespace": "default"}, "data": {"a": "YQ=="}})
    events = http.watch(CMS, resourceVersion=rv, allowWatchBookmarks="true",
                        timeoutSeconds=0.5)
    assert events and {e["type"] for e in events} == {"BOOKMARK"}
    assert {e["object"]["metadata"]["resourceVersion"] for e in events} == {
        str(lk.resource_version)}


def test_no_bookmarks_unless_asked(lk: LocalKube, http: Http) -> None:
    assert http.watch(CMS, resourceVersion=lk.resource_version, timeoutSeconds=0.4) == []


def test_a_label_selector_watch_sees_objects_enter_and_leave_the_selection(
        lk: LocalKube, k: Kube, http: Http) -> None:
    rv = str(lk.resource_version)
    k.create(cm("x"))
    k.patch("v1", "ConfigMap", "x", "default", {"metadata": {"labels": {"pick": "me"}}})
    k.patch("v1", "ConfigMap", "x", "default", {"data": {"k": "2"}})
    k.patch("v1", "ConfigMap", "x", "default", {"metadata": {"labels": {"pick": None}}})
    events = http.watch(CMS, resourceVersion=rv, labelSelector="pick=me", timeoutSeconds=0.3)
    assert _types(events) == [("ADDED", "x"), ("MODIFIED", "x"), ("DELETED", "x")]
    assert events[2]["object"]["metadata"]["labels"] == {"pick": "me"}
    assert events[2]["object"]["metadata"]["resourceVersion"] == str(lk.resource_version)


def test_namespaced_watches_see_only_their_namespace(lk: LocalKube, k: Kube,
                                                     http: Http) -> None:
    rv = str(lk.resource_version)
    k.create(cm("here"))
    k.create(cm("there", "kube-public"))
    assert _types(http.watch(CMS, resourceVersion=rv, timeoutSeconds=0.3)) == [("ADDED", "here")]
    everywhere = http.watch("/api/v1/configmaps", resourceVersion=rv, timeoutSeconds=0.3)
    assert _types(everywhere) == [("ADDED", "here"), ("ADDED", "there")]


def test_watches_are_per_resource(lk: LocalKube, k: Kube, http: Http) -> None:
    rv = str(lk.resource_version)
    k.create(cm("x"))
    assert http.watch("/api/v1/namespaces/default/secrets", resourceVersion=rv,
                      timeoutSeconds=0.3) == []


def test_a_version_older_than_the_history_window_is_410_expired() -> None:
    with LocalKube(crd_dir=REPO / "crds", history=3) as server:
        http = Http(server.url)
        start = server.resource_version
        for i in range(8):
            server.put(cm(f"c{i}"))
        [event] = http.watch(CMS, resourceVersion=start, timeoutSeconds=1)
        recent = http.watch(CMS, resourceVersion=server.resource_version - 1,
                            timeoutSeconds=0.2)
        http.close()
    assert event["type"] == "ERROR" and event["object"]["code"] == 410
    assert event["object"]["reason"] == "Expired"
    assert _types(recent) == [("ADDED", "c7")]


def test_a_watch_that_falls_behind_the_history_gets_410_and_ends() -> None:
    with LocalKube(crd_dir=REPO / "crds", history=2) as server:
        raw = RawWatch(server.url, f"{CMS}?watch=1&resourceVersion={server.resource_version}")
        server.hang_watches(True)
        raw.read(0.2)
        for i in range(10):
            server.put(cm(f"c{i}"))
        server.hang_watches(False)
        text = raw.read_until(b"0\r\n\r\n")
        raw.close()
    assert b'"reason":"Expired"' in text and b'"code":410' in text


def test_watches_end_cleanly_at_their_timeout(lk: LocalKube, http: Http) -> None:
    with http.session.get(http.url + CMS, params={"watch": "1", "timeoutSeconds": "1",
                                                  "resourceVersion": lk.resource_version},
                          stream=True, timeout=10) as resp:
        assert list(resp.iter_lines()) == []  # ended by the server, terminating chunk sent


def test_break_watches_cuts_open_streams_mid_way(lk: LocalKube, k: Kube) -> None:
    k.create(cm("x"))
    failures: list[BaseException] = []
    got: list[bytes] = []
    connected = threading.Event()

    def watch() -> None:
        try:
            with requests.get(lk.url + CMS, params={"watch": "1", "resourceVersion": "0"},
                              stream=True, timeout=10) as resp:
                for line in resp.iter_lines():
                    got.append(line)
                    connected.set()
        except requests.exceptions.RequestException as exc:
            failures.append(exc)

    thread = threading.Thread(target=watch)
    thread.start()
    assert connected.wait(5)
    lk.break_watches()
    thread.join(5)
    assert not thread.is_alive()
    assert failures and isinstance(failures[0], requests.exceptions.ChunkedEncodingError)


def test_hung_watches_send_nothing_until_released(lk: LocalKube, k: Kube) -> None:
    raw = RawWatch(lk.url, f"{CMS}?watch=1&allowWatchBookmarks=true&resourceVersion="
                           f"{lk.resource_version}")
    raw.read_until(b"BOOKMARK")
    lk.hang_watches(True)
    # A bookmark already on its way may still land: read until the stream is quiet. Bounded,
    # so a watch that never hangs (a bookmark every 0.1 s) still reaches the assertion.
    for _ in range(10):
        if not raw.read(0.3):
            break
    raw.buffer = b""
    k.create(cm("x"))
    assert raw.read(0.5) == b""  # no event, no bookmark (interval 0.1s)
    lk.hang_watches(False)
    text = raw.read_until(b'"ADDED"')
    raw.close()
    assert b'"name":"x"' in text


def test_unavailable_answers_503_to_everything(lk: LocalKube, k: Kube) -> None:
    lk.set_unavailable(True)
    with pytest.raises(errors.Unavailable):
        k.get("v1", "Namespace", "default")
    status = requests.get(lk.url + "/api/v1/namespaces", timeout=5)
    assert status.status_code == 503 and status.json()["reason"] == "ServiceUnavailable"
    lk.set_unavailable(False)
    assert k.get("v1", "Namespace", "default")["metadata"]["name"] == "default"
    assert ("GET", "/api/v1/namespaces/default", "", 503) in lk.requests


def test_watch_events_for_custom_resources_have_sorted_keys(lk: LocalKube, k: Kube,
                                                            http: Http) -> None:
    rv = str(lk.resource_version)
    k.create({"apiVersion": "eventop.dev/v1", "kind": "ExchangeRate",
              "metadata": {"name": "usd", "namespace": "default"}, "spec": {"currency": "USD"}})
    [line] = http.watch_lines("/apis/eventop.dev/v1/exchangerates", resourceVersion=rv,
                              timeoutSeconds=0.3)
    event = json.loads(line)
    assert line.startswith(b'{"type":"ADDED","object":{"apiVersion":"eventop.dev/v1"')
    assert json.dumps(event["object"], separators=(",", ":"), sort_keys=True).encode() in line


def test_the_official_client_resumes_a_watch_through_kube(lk: LocalKube, k: Kube) -> None:
    (page,) = k.pages(k.resource("v1", "ConfigMap"), "default")
    items, rv = page["items"], page["metadata"]["resourceVersion"]
    k.create(cm("x"))
    res = k.resource("v1", "ConfigMap")
    lines = list(k.iter_watch(res, "default", [("resourceVersion", rv),
                                               ("timeoutSeconds", 1)], timeout=(2, 5)))
    assert [json.loads(line)["type"] for line in lines] == ["ADDED"]
    assert len(items) == 1


def test_a_watch_opened_on_a_hung_server_gets_nothing_until_released(lk: LocalKube) -> None:
    lk.hang_watches(True)
    raw = RawWatch(lk.url, f"{CMS}?watch=1")
    raw.read_until(b"200 OK")
    assert b"ADDED" not in raw.buffer + raw.read(0.3)
    lk.hang_watches(False)
    text = raw.read_until(b'"ADDED"')
    raw.close()
    assert b"kube-root-ca.crt" in text


def test_a_watch_is_logged_once_when_it_starts(lk: LocalKube, http: Http) -> None:
    lk.requests.clear()
    http.watch(CMS, resourceVersion=lk.resource_version, timeoutSeconds=0.1)
    assert lk.requests == [("GET", CMS, f"watch=true&resourceVersion={lk.resource_version}"
                            "&timeoutSeconds=0.1", 200)]


def test_concurrent_writers_produce_one_gapless_ordered_stream(lk: LocalKube) -> None:
    start = lk.resource_version
    failures: list[Exception] = []

    def writer(n: int) -> None:
        kube = Kube.connect(url=lk.url)
        try:
            for i in range(40):
                kube.apply(cm(f"w{n}", data={"i": str(i)}))
        except Exception as exc:  # reported by the assertion below
            failures.append(exc)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    http = Http(lk.url)
    events = http.watch(CMS, resourceVersion=start, timeoutSeconds=0.3)
    http.close()
    assert failures == []
    rvs = [int(e["object"]["metadata"]["resourceVersion"]) for e in events]
    assert rvs == list(range(start + 1, start + 1 + 160))
    for n in range(4):
        mine = [e["object"]["data"]["i"] for e in events
                if e["object"]["metadata"]["name"] == f"w{n}"]
        assert mine == [str(i) for i in range(40)]
