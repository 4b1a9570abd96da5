"""The kit's Pipeline: the router running a project's handlers, events posted by the test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from eventop.testing import LocalCluster, Pipeline

HANDLER = '''
from eventop import on

@on("dev.knative.apiserver.resource.*", api_version="v1", kind="ConfigMap")
def seen(event, kube):
    return f"saw {event.ref.namespace}/{event.ref.name}"
'''
CM = {"apiVersion": "v1", "kind": "ConfigMap",
      "metadata": {"name": "settings", "namespace": "default"}, "data": {"a": "b"}}


@pytest.fixture
def cluster() -> Iterator[LocalCluster]:
    cluster = LocalCluster()
    try:
        yield cluster
    finally:
        cluster.close()


def test_a_handler_file_is_run_and_its_result_logged(cluster: LocalCluster,
                                                     tmp_path: Path) -> None:
    (tmp_path / "seen.py").write_text(HANDLER)
    with Pipeline(cluster, str(tmp_path / "seen.py"), cwd=tmp_path) as router:
        assert router.post("add", cluster.put(CM)) == 200
        [line] = router.events_logged()
    assert line["results"] == [{"handler": "seen.seen", "outcome": "ok",
                                "detail": "saw default/settings"}]


def test_a_router_token_is_sent_with_every_event(cluster: LocalCluster, tmp_path: Path) -> None:
    (tmp_path / "seen.py").write_text(HANDLER)
    env = {"EVENTOP_ROUTER_TOKEN": "s3cret"}
    with Pipeline(cluster, str(tmp_path / "seen.py"), env=env, cwd=tmp_path) as router:
        assert router.post("add", cluster.put(CM)) == 200
        router._auth = {}  # as a sender without the token
        assert router.post("update", cluster.put(CM)) == 401
