"""Fixtures of the fault suite: the cluster, eventop's processes around it, a workload."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from demo.provider import RatesStandIn
from tests.faults.stack import REPO, REPORTED, Cluster, Stack, converge
from tests.faults.workload import Workload
from tests.support.cluster import cluster_script, uncontrollable_reason


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The figures of every fault run, together at the end (CI's log shows them)."""
    if REPORTED:
        terminalreporter.section("fault suite: time to converge, lost changes, side effects")
        for line in REPORTED:
            terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def cluster() -> Cluster:
    kubeconfig = os.environ.get("EVENTOP_TEST_KUBECONFIG")
    if not kubeconfig:
        pytest.skip("cluster suite: set EVENTOP_TEST_KUBECONFIG to run it")
    cluster = Cluster(kubeconfig, os.environ.get("EVENTOP_TEST_CLUSTER_DIR"), cluster_script())
    from eventop.kube import Kube

    admin = Kube.connect(kubeconfig=kubeconfig)
    for path in sorted((REPO / "crds").glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        if doc.get("kind") == "CustomResourceDefinition":
            admin.apply(doc)
    _, left = converge(lambda: admin.missing_kinds({
        ("eventop.dev/v1", "CopyRule"), ("eventop.dev/v1", "ExchangeRate"),
        ("eventop.dev/v1", "RegistryMirror")}), 60)
    assert not left, left
    return cluster


@pytest.fixture
def controllable(cluster: Cluster) -> Cluster:
    """The faults that restart the API server or compact etcd need the cluster this run
    started (``EVENTOP_TEST_CLUSTER_DIR``, as ``.ci/run`` sets it); never someone else's."""
    if not cluster.controllable:
        pytest.skip(uncontrollable_reason(cluster.state_dir, cluster.script))
    return cluster


@pytest.fixture(scope="session")
def rates_url() -> Iterator[str]:
    with RatesStandIn() as rates:
        yield rates.url


@pytest.fixture
def stack(cluster: Cluster, rates_url: str, tmp_path: Path) -> Iterator[Stack]:
    s = Stack(cluster, tmp_path, rates_url)
    try:
        yield s
    finally:
        s.close()


@pytest.fixture
def workload(cluster: Cluster) -> Iterator[Workload]:
    from eventop.kube import Kube

    world = Kube.connect(kubeconfig=cluster.kubeconfig)
    world.field_manager = "eventop-tests-world"
    w = Workload(world, uuid.uuid4().hex[:6])
    try:
        yield w
    finally:
        w.cleanup()
