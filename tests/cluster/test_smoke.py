"""Cluster smoke scenario: CRDs from crds/ on a real API server, router, one replayed event.

Runs only with ``EVENTOP_TEST_KUBECONFIG`` (``make cluster-test``); the default suite skips it.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from demo.provider import EUR_RATES, RatesStandIn
from eventop.testing.cluster import load_crds

pytestmark = pytest.mark.cluster
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def rates_url() -> Iterator[str]:
    with RatesStandIn() as rates:
        yield rates.url


@pytest.fixture
def pipeline_env(rates_url: str) -> dict[str, str]:
    return {"RATES_API_URL": rates_url}


@pytest.fixture
def installed_crds(cluster_pipeline) -> list[str]:
    """Apply every CRD of crds/ (as the admin would) and wait until each is Established."""
    cluster_pipeline.cluster.install_crds([REPO / "crds"])
    return [crd["metadata"]["name"] for crd in load_crds([REPO / "crds"])]


def test_crds_apply_and_become_established(installed_crds):
    assert sorted(installed_crds) == ["copyrules.eventop.dev", "databases.eventop.dev",
                                      "exchangerates.eventop.dev", "registrymirrors.eventop.dev"]


def test_replayed_exchange_rate_event_fills_its_configmap(cluster_pipeline, installed_crds):
    ns = f"eventop-smoke-{uuid.uuid4().hex[:6]}"
    cluster_pipeline.cluster.put({"apiVersion": "v1", "kind": "Namespace",
                                  "metadata": {"name": ns}})
    try:
        rate = cluster_pipeline.cluster.put({
            "apiVersion": "eventop.dev/v1", "kind": "ExchangeRate",
            "metadata": {"name": "smoke-usd", "namespace": ns}, "spec": {"currency": "USD"}})
        assert cluster_pipeline.post("add", rate) == 200
        cm = cluster_pipeline.cluster.wait_for(
            lambda: cluster_pipeline.cluster.kube.get_or_none("v1", "ConfigMap", "smoke-usd", ns),
            what="ConfigMap smoke-usd")
        assert cm["data"]["rate"] == EUR_RATES["USD"]
        assert cm["metadata"]["ownerReferences"][0]["uid"] == rate["metadata"]["uid"]
    finally:
        cluster_pipeline.cluster.remove("v1", "Namespace", ns)
