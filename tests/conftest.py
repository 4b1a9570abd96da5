"""Shared fixtures: a fresh local API server per test, the full pipeline, and the real cluster.

``local_kube``/``kube``: the local stand-in for kube-apiserver, over HTTP.
``pipeline``: local API server + router under gunicorn; override ``pipeline_env`` in a test
module to give the router extra environment (e.g. ``RATES_API_URL``).
``cluster_pipeline``: the same against ``EVENTOP_TEST_KUBECONFIG``; tests using it must be
marked ``cluster`` and are skipped without that variable.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("EVENTOP_TEST_KUBECONFIG"):
        return
    skip = pytest.mark.skip(reason="cluster suite: set EVENTOP_TEST_KUBECONFIG to run it")
    for item in items:
        if "cluster" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def local_kube() -> Iterator[object]:
    from tests.support.apiserver import local_kube_server

    with local_kube_server() as server:
        yield server


@pytest.fixture
def kube(local_kube: object) -> object:
    from eventop.kube import Kube

    return Kube.connect(url=local_kube.url)  # type: ignore[attr-defined]


@pytest.fixture
def pipeline_env() -> dict[str, str]:
    """Extra environment for the router process; override in a module to change it."""
    return {}


@pytest.fixture
def pipeline(local_kube: object, pipeline_env: dict[str, str]) -> Iterator[object]:
    from tests.support.pipeline import LocalPipeline

    pipe = LocalPipeline(local_kube, pipeline_env)
    try:
        yield pipe
    finally:
        pipe.close()


@pytest.fixture
def cluster_pipeline(pipeline_env: dict[str, str]) -> Iterator[object]:
    kubeconfig = os.environ.get("EVENTOP_TEST_KUBECONFIG")
    if not kubeconfig:
        pytest.skip("cluster suite: set EVENTOP_TEST_KUBECONFIG to run it")
    from tests.support.pipeline import ClusterPipeline

    pipe = ClusterPipeline(kubeconfig, pipeline_env)
    try:
        yield pipe
    finally:
        pipe.close()
