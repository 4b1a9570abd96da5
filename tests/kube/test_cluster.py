"""Kube against a real API server (``pytest -m cluster``): LIST and the reflector."""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from eventop.kube import Kube
from eventop.kube.reflector import Reflector, Sink, Watched, WatchSettings

pytestmark = pytest.mark.cluster


@pytest.fixture
def kube() -> Iterator[Kube]:
    kubeconfig = os.environ.get("EVENTOP_TEST_KUBECONFIG")
    if not kubeconfig:
        pytest.skip("cluster suite: set EVENTOP_TEST_KUBECONFIG to run it")
    client = Kube.connect(kubeconfig=kubeconfig)
    client.field_manager = "eventop-tests-world"
    yield client


def test_a_filtered_list_holds_every_match_where_the_servers_pagination_drops_some(
        kube: Kube) -> None:
    """1,200 ConfigMaps, one in three labelled: a v1.24 API server asked for pages of 100
    with that label ends the list early (kubernetes/kubernetes#111488); Kube asks for a
    filtered list in one page, and every caller (informers, the watcher) gets all 400."""
    ns = f"pages-{uuid.uuid4().hex[:6]}"
    kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    try:
        def make(i: int) -> None:
            kube.create({"apiVersion": "v1", "kind": "ConfigMap",
                         "metadata": {"name": f"cm-{i:05d}", "namespace": ns,
                                      "labels": {"pick": "yes" if i % 3 == 0 else "no"}},
                         "data": {"v": "x" * 200}})

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(make, range(1200)))
        res = kube.resource("v1", "ConfigMap")
        paged = [item["metadata"]["name"] for page in
                 kube.pages(res, ns, label_selector="pick=yes", limit=100)
                 for item in page["items"]]
        assert len(paged) == 400
        listed = kube.list("v1", "ConfigMap", ns, label_selector="pick=yes")
        assert sorted(o["metadata"]["name"] for o in listed) == sorted(paged)
    finally:
        kube.delete("v1", "Namespace", ns)


def test_an_idle_kinds_watch_stays_open_so_a_change_after_quiet_minutes_is_seen_at_once(
        kube: Kube) -> None:
    """A namespace nobody touches: every watch of it ends empty at its timeoutSeconds (1 s
    here, 45 s by default) and the next one starts at once. Counting those empty streams as
    failures had the reflector sleep ever longer between watches (up to 8-16 s within 20
    quiet seconds here; 15-30 s after five quiet minutes by default), and a change in that
    gap reached the router's cache and the watcher only when the sleep ended."""
    ns = f"idle-{uuid.uuid4().hex[:6]}"
    kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    seen = threading.Event()

    class Probe(Sink):
        def offer(self, change: str, obj: Any, timeout: float) -> bool:
            if obj["metadata"]["name"] == "probe":
                seen.set()
            return True

    stop = threading.Event()
    reflector = Reflector(kube, Watched(kube.resource("v1", "ConfigMap"), ns), Probe(),
                          WatchSettings(watch_timeout=1, read_timeout=5.0), stop).start()
    try:
        time.sleep(20)
        kube.create({"apiVersion": "v1", "kind": "ConfigMap",
                     "metadata": {"name": "probe", "namespace": ns}})
        assert seen.wait(3), "the change waited for the reflector's backoff, not a watch"
    finally:
        stop.set()
        reflector.join(5)
        kube.delete("v1", "Namespace", ns)
