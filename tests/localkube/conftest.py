"""Fixtures for localkube's own tests: a fast-bookmarking server and a raw HTTP client.

Most tests drive localkube through ``eventop.kube.Kube`` (the official client over HTTP); exact
error bodies and watch lines are read with ``requests`` so nothing reshapes them.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from eventop.kube import Kube
from eventop.localkube import LocalKube
from tests.localkube.support import Http
from tests.support.apiserver import local_kube_server


@pytest.fixture
def lk() -> Iterator[LocalKube]:
    with local_kube_server(bookmark_interval=0.1) as server:
        yield server


@pytest.fixture
def k(lk: LocalKube) -> Kube:
    return Kube.connect(url=lk.url)


@pytest.fixture
def http(lk: LocalKube) -> Iterator[Http]:
    client = Http(lk.url)
    yield client
    client.close()
