"""The mirrors' tests run on a local API server that collects objects whose owner is gone,
as a real cluster's garbage collector does: a run that read a mirror just before it was
deleted may still create a child (its Service), and a test must not depend on which came
first. Two of these tests failed now and then on such a Service, left behind."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture
def local_kube() -> Iterator[object]:
    from tests.support.apiserver import local_kube_server

    with local_kube_server(gc_dangling=True) as server:
        yield server
