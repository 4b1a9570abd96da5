"""Shared fixtures: a fresh local API server per test, the full pipeline, and the real cluster.

``local_kube``/``kube``: the local stand-in for kube-apiserver, over HTTP.
``pipeline``: the test kit's :class:`eventop.testing.Pipeline` (router under gunicorn,
every built-in handler) on ``local_kube``; override ``pipeline_env`` in a test module to give
the router extra environment (e.g. ``RATES_API_URL``, ``EVENTOP_BUILTIN_HANDLERS``).
``cluster_pipeline``: the same against ``EVENTOP_TEST_KUBECONFIG``; tests using it must be
marked ``cluster`` and are skipped without that variable.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

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
def pipeline_workers() -> int:
    """The router's gunicorn workers: two by default, the harder case of two replicas on one
    object. A test of what one process remembers (its own writes' echoes) parametrizes it
    to 1, the deployed default: with two, the other worker's watch hides a lost event."""
    return 2


def _pipeline(cluster: object, env: dict[str, str], log_dir: object, workers: int) -> object:
    """The kit's Pipeline (:mod:`eventop.testing`), running every built-in handler unless
    ``env`` picks some (``EVENTOP_BUILTIN_HANDLERS``), with ``workers`` gunicorn workers
    that, as deploy/'s replicas do, elect the one whose watch starts runs."""
    from eventop.handlers import BUILTIN
    from eventop.testing import Pipeline

    env = {"EVENTOP_RUN_ON_WATCH": "leader", **env}
    builtin = env.pop("EVENTOP_BUILTIN_HANDLERS",
                      ",".join(name.rpartition(".")[2] for name in BUILTIN))
    return Pipeline(cluster, builtin=builtin, env=env, workers=workers, log_dir=str(log_dir))


@pytest.fixture
def pipeline(local_kube: object, pipeline_env: dict[str, str], pipeline_workers: int,
             tmp_path: object) -> Iterator[object]:
    from eventop.testing import LocalCluster

    pipe = _pipeline(LocalCluster(local=local_kube), pipeline_env, tmp_path, pipeline_workers)
    try:
        yield pipe
    finally:
        pipe.close()  # type: ignore[attr-defined]


@pytest.fixture
def cluster_pipeline(pipeline_env: dict[str, str], pipeline_workers: int,
                     tmp_path: object) -> Iterator[object]:
    kubeconfig = os.environ.get("EVENTOP_TEST_KUBECONFIG")
    if not kubeconfig:
        pytest.skip("cluster suite: set EVENTOP_TEST_KUBECONFIG to run it")
    from eventop.testing import RealCluster

    # The CRDs as this checkout has them, served before the test starts (on a fresh cluster,
    # a test run alone would otherwise create its objects before anything installed them).
    crds = Path(__file__).resolve().parents[1] / "crds"
    pipe = _pipeline(RealCluster(kubeconfig, [crds]), pipeline_env, tmp_path,
                     pipeline_workers)
    try:
        yield pipe
    finally:
        pipe.close()  # type: ignore[attr-defined]
