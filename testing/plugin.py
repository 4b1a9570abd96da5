"""The pytest plugin of eventop's test kit, registered through the ``pytest11`` entry point:
installed with eventop, its fixtures are there in any project's tests, no import needed.

Configure it in your ``pytest.ini`` / ``pyproject.toml`` (``[tool.pytest.ini_options]``)::

    eventop_handlers = handlers.py          # EVENTOP_HANDLERS: modules or .py files
    eventop_crds = crds/                    # CRD files or folders to install
    eventop_resources = v1/secrets          # the watcher's resources, if not what
                                            # your handlers listen to (the default)

Fixtures (each per test):

* ``eventop_cluster``: an API server (:class:`eventop.testing.Cluster`): a fresh local one
  with your CRDs, or, when ``EVENTOP_TEST_KUBECONFIG`` names a kubeconfig, that real cluster
  (your CRDs applied there; what the test ``put`` there, and was not there before, is
  deleted after it, while the router still runs, so that your finalizers are let go);
* ``eventop_router``: the router running your handlers against it (:class:`Pipeline`): you
  post events, or replay a recording in order, shuffled or duplicated;
* ``eventop_pipeline``: the router and the watcher: you change the cluster, the watcher
  posts what changed, as in production;
* ``eventop_env``: extra environment for those processes (override it in a conftest.py);
  ``eventop_handlers``, ``eventop_crds``, ``eventop_resources``: the settings above, as
  fixtures you may override per test module.

Nothing is imported from eventop until a fixture is used, so the plugin costs nothing in
test runs that do not use it.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

KUBECONFIG_VARIABLE = "EVENTOP_TEST_KUBECONFIG"
DELETE_WAIT = 60.0  # how long what a test put into a real cluster may take to go


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini("eventop_handlers", "eventop test kit: your handler modules or .py files, "
                  "comma-separated (the router's EVENTOP_HANDLERS)", default="")
    parser.addini("eventop_builtin_handlers", "eventop test kit: built-in handlers to run too "
                  "(EVENTOP_BUILTIN_HANDLERS; default none)", default="none")
    parser.addini("eventop_crds", "eventop test kit: CRD files or folders to install",
                  type="paths", default=[])
    parser.addini("eventop_resources", "eventop test kit: what the watcher watches "
                  "(EVENTOP_RESOURCES; default: every kind the handlers listen to)", default="")


def _ini_path(config: pytest.Config, value: str) -> str:
    """A ``.py`` file named in the ini file is relative to it (as ``eventop_crds`` is)."""
    if value.endswith(".py") and not os.path.isabs(value) and config.inipath is not None:
        return str(config.inipath.parent / value)
    return value


@pytest.fixture
def eventop_handlers(pytestconfig: pytest.Config) -> str:
    """``EVENTOP_HANDLERS`` for the router (ini ``eventop_handlers``)."""
    entries = [e.strip() for e in str(pytestconfig.getini("eventop_handlers")).split(",")]
    return ",".join(_ini_path(pytestconfig, e) for e in entries if e)


@pytest.fixture
def eventop_crds(pytestconfig: pytest.Config) -> list[Path]:
    """CRD files or folders to install (ini ``eventop_crds``)."""
    return list(pytestconfig.getini("eventop_crds"))


@pytest.fixture
def eventop_resources(pytestconfig: pytest.Config) -> str | None:
    """The watcher's ``EVENTOP_RESOURCES`` (ini ``eventop_resources``), or None."""
    return str(pytestconfig.getini("eventop_resources")).strip() or None


@pytest.fixture
def eventop_env() -> dict[str, str]:
    """Extra environment for the router and the watcher; override to add some."""
    return {}


@pytest.fixture
def eventop_cluster(eventop_crds: list[Path]) -> Iterator[Any]:
    """A fresh local API server with your CRDs, or the cluster of EVENTOP_TEST_KUBECONFIG."""
    from eventop.testing.cluster import LocalCluster, RealCluster

    kubeconfig = os.environ.get(KUBECONFIG_VARIABLE)
    cluster = RealCluster(kubeconfig, eventop_crds) if kubeconfig else LocalCluster(eventop_crds)
    try:
        yield cluster
    finally:
        try:
            _delete_made(cluster)
        finally:
            cluster.close()


def _delete_made(cluster: Any) -> None:
    """What the test put into a real cluster goes with the test (warned about if it stays)."""
    left = cluster.delete_made(DELETE_WAIT)
    if left:
        warnings.warn(f"eventop test kit: still there {DELETE_WAIT:g}s after the test "
                      f"deleted them: {', '.join(left)} (held by a finalizer?)", stacklevel=1)


def _pipeline(request: pytest.FixtureRequest, cluster: Any, watcher: bool) -> Iterator[Any]:
    from eventop.testing.pipeline import Pipeline

    config = request.config
    pipeline = Pipeline(cluster, request.getfixturevalue("eventop_handlers"),
                        builtin=str(config.getini("eventop_builtin_handlers")) or "none",
                        watcher=watcher,
                        resources=request.getfixturevalue("eventop_resources"),
                        env=request.getfixturevalue("eventop_env"),
                        cwd=config.rootpath,
                        # pytest keeps the logs of its last few runs there, and removes older
                        log_dir=str(request.getfixturevalue("tmp_path")))
    try:
        yield pipeline
    finally:
        try:
            _delete_made(cluster)  # while the router runs: it lets go of its finalizers
        finally:
            pipeline.close()


@pytest.fixture
def eventop_router(request: pytest.FixtureRequest, eventop_cluster: Any) -> Iterator[Any]:
    """The router running your handlers against ``eventop_cluster``; you send the events."""
    yield from _pipeline(request, eventop_cluster, watcher=False)


@pytest.fixture
def eventop_pipeline(request: pytest.FixtureRequest, eventop_cluster: Any) -> Iterator[Any]:
    """The router and the watcher against ``eventop_cluster``: change the cluster, and the
    watcher posts the changes."""
    yield from _pipeline(request, eventop_cluster, watcher=True)
