"""The StaticSite handler, tested twice: its pure function in an in-memory world (no
server, milliseconds), and as it runs, with eventop's test kit: the router and the watcher as
real processes against a local API server (or the cluster named by EVENTOP_TEST_KUBECONFIG).
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from static_site import CHECKSUM, sites

from eventop.engine.testing import World
from eventop.testing import eventually

HERE = Path(__file__).parent
SITE = {"apiVersion": "example.com/v1", "kind": "StaticSite",
        "metadata": {"name": "docs", "namespace": "web", "generation": 1},
        "spec": {"pages": {"index.html": "<h1>Docs</h1>"}, "replicas": 2,
                 "image": "nginx:1.27-alpine"}}


def condition(site: dict) -> tuple[str, str]:
    [ready] = [c for c in site["status"]["conditions"] if c["type"] == "Ready"]
    return ready["status"], ready["reason"]


# -- the pure function, in memory ---------------------------------------------------------

def test_a_site_gets_its_pages_server_and_service() -> None:
    world = World([SITE])
    world.converge(sites)
    pages = world.get("v1/ConfigMap", "docs-pages", "web")
    assert pages["data"] == {"index.html": "<h1>Docs</h1>"}
    deployment = world.get("apps/v1/Deployment", "docs", "web")
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["template"]["spec"]["volumes"][0]["configMap"]["name"] == \
        "docs-pages"
    assert world.get("v1/Service", "docs", "web")["spec"]["ports"][0]["port"] == 80
    site = world.get("example.com/v1/StaticSite", "docs", "web")
    assert site["status"]["url"] == "http://docs.web.svc.cluster.local"
    assert condition(site) == ("False", "Starting")  # no replica ready yet


def test_the_site_is_ready_once_its_replicas_are() -> None:
    world = World([SITE])
    world.converge(sites)
    deployment = copy.deepcopy(world.get("apps/v1/Deployment", "docs", "web"))
    deployment["status"] = {"replicas": 2, "readyReplicas": 2}  # as the controllers would
    world.put(deployment)
    world.changed(sites, world.get("apps/v1/Deployment", "docs", "web"))
    site = world.get("example.com/v1/StaticSite", "docs", "web")
    assert condition(site) == ("True", "Serving") and site["status"]["readyReplicas"] == 2


def test_new_pages_roll_the_pods_and_a_converged_site_costs_no_write() -> None:
    world = World([SITE])
    world.converge(sites)
    before = world.get("apps/v1/Deployment", "docs", "web")
    world.put({**SITE, "metadata": {**SITE["metadata"], "generation": 2},
               "spec": {**SITE["spec"], "pages": {"index.html": "<h1>Docs 2</h1>"}}})
    world.converge(sites)
    after = world.get("apps/v1/Deployment", "docs", "web")
    checksum = (before["spec"]["template"]["metadata"]["annotations"][CHECKSUM],
                after["spec"]["template"]["metadata"]["annotations"][CHECKSUM])
    assert checksum[0] != checksum[1]
    writes = len(world.writes)
    world.reconcile(sites, "docs", "web")
    assert len(world.writes) == writes


def test_a_page_name_that_is_not_a_file_name_is_reported_and_nothing_is_written() -> None:
    world = World([{**SITE, "spec": {"pages": {"../etc/passwd": "x"}}}])
    world.reconcile(sites, "docs", "web")
    site = world.get("example.com/v1/StaticSite", "docs", "web")
    assert condition(site) == ("False", "InvalidPageName")
    assert world.get("apps/v1/Deployment", "docs", "web") is None


# -- as it runs: router and watcher, with the test kit ------------------------------------

def test_the_router_and_the_watcher_build_a_new_site(eventop_pipeline) -> None:
    cluster = eventop_pipeline.cluster
    cluster.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "web"}})
    cluster.put(SITE)
    eventually(lambda: cluster.get("apps/v1/Deployment", "docs", "web"), 60, "a Deployment")
    eventually(lambda: cluster.get("v1/Service", "docs", "web"), 60, "a Service")
    site = eventually(lambda: (s := cluster.get("example.com/v1/StaticSite", "docs", "web"))
                      and s.get("status") and s, 60, "a status")
    assert site["status"]["url"] == "http://docs.web.svc.cluster.local"
    eventually(lambda: [line for line in eventop_pipeline.events_logged()  # the router's log
                        if line["message"].startswith("add StaticSite web/docs: static-sites")],
               30, "the router's line for the site's event")
    # New pages: the engine applies the ConfigMap it created (the API server keeps that
    # create apart from applies, as it keeps field managers: a real one's rules)
    cluster.put({**site, "spec": {**SITE["spec"], "pages": {"index.html": "<h1>v2</h1>"}}})
    eventually(lambda: (cluster.get("v1/ConfigMap", "docs-pages", "web") or {}).get("data")
               == {"index.html": "<h1>v2</h1>"}, 60, "the new pages")


@pytest.mark.parametrize("order", ["in_order", "shuffled", "duplicated"])
def test_a_recorded_session_converges_whatever_the_delivery_order(eventop_router,
                                                                   order: str) -> None:
    """recording/: sites created, changed and deleted on a real API server, recorded
    with ``python -m eventop.watcher record``; each order leaves the same objects."""
    answers = eventop_router.replay(HERE / "recording", order=order)
    assert set(answers) <= {200, 202}
    cluster = eventop_router.cluster
    left = sorted((o["kind"], o["metadata"]["name"])
                  for kind in ("v1/ConfigMap", "v1/Service", "apps/v1/Deployment")
                  for o in cluster.list(kind, "web")
                  if o["metadata"]["name"] != "kube-root-ca.crt")
    assert left == [("ConfigMap", "blog-pages"), ("Deployment", "blog"), ("Service", "blog")]
