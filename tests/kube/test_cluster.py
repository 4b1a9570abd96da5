"""Kube's LIST against a real API server (``pytest -m cluster``)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from eventop.kube import Kube

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
