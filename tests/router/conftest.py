"""Fixtures of the router app tests: a registry of recording handlers, a stand-in Kubernetes
API, and Flask's test client of the app made of them."""

from __future__ import annotations

import pytest
from flask.testing import FlaskClient

from eventop.router.app import create_app
from tests.router.support import FakeKube, Recorder


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
def fake_kube() -> FakeKube:
    return FakeKube()


@pytest.fixture
def client(recorder: Recorder, fake_kube: FakeKube) -> FlaskClient:
    return create_app(registry=recorder.registry, kube=fake_kube).test_client()
