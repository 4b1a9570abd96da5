"""How eventop configures the official client for a long-running controller."""

from __future__ import annotations

import ssl
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import urllib3.connection
from kubernetes import client as k8s_client

from eventop.kube import Kube, errors
from eventop.kube.connection import api_client
from tests.support.tls import self_signed, tls_server


def test_credentials_are_refreshed_at_most_once_a_minute(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kubeconfig loader re-applies its whole configuration before every request (and
    re-installs its hook while doing so); eventop lets it through once a minute."""
    from types import SimpleNamespace

    from eventop.kube import connection

    clock = [1000.0]
    monkeypatch.setattr(connection.time, "monotonic", lambda: clock[0])
    calls: list[float] = []
    configuration = SimpleNamespace()

    def loader_hook(conf: SimpleNamespace) -> None:
        calls.append(clock[0])
        conf.refresh_api_key_hook = loader_hook  # what the loader's _set_config does

    configuration.refresh_api_key_hook = connection._at_most_every(60.0, loader_hook)
    for step in range(130):  # a request every second for 130 s
        clock[0] = 1000.0 + step
        configuration.refresh_api_key_hook(configuration)
    assert calls == [1000.0, 1060.0, 1120.0]
    assert configuration.refresh_api_key_hook is not loader_hook


def _client(url: str, *, ca: str | None = None, verify: bool = True) -> Kube:
    config = k8s_client.Configuration()
    config.host = url
    config.verify_ssl = verify
    config.ssl_ca_cert = ca
    config.connection_pool_maxsize = 16
    return Kube(api_client(config), timeout=(5.0, 5.0))


def _version(kube: Kube) -> str:
    return str(kube.request("GET", "/version", verb="get")["gitVersion"])


def _shared_context(kube: Kube) -> ssl.SSLContext:
    """The TLS context every connection of ``kube`` is made with."""
    context: ssl.SSLContext = kube.api.rest_client.pool_manager.connection_pool_kw["ssl_context"]
    return context


def test_new_connections_share_one_tls_context_loaded_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Eight requests at once open eight TLS connections; the CA is loaded into one context
    once, not into a context per connection (urllib3's way, 16-19 ms of CPU each when it is
    the system's whole bundle)."""
    built: list[object] = []
    per_connection = urllib3.connection.create_urllib3_context

    def counting(*args: object, **kwargs: object) -> object:
        built.append(args)
        return per_connection(*args, **kwargs)

    monkeypatch.setattr(urllib3.connection, "create_urllib3_context", counting)
    with tls_server(tmp_path) as server:
        kube = _client(server.url(), ca=str(server.ca))
        barrier = threading.Barrier(8)

        def version(_: int) -> str:
            barrier.wait(5)
            return _version(kube)

        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(version, range(8)))
        assert answers == ["v1.24.0-test"] * 8
        assert len(server.connections) == 8
    assert built == []  # urllib3 built no context of its own: every connection used ours
    assert _shared_context(kube).cert_store_stats()["x509_ca"] == 1  # the server's, once


def test_the_shared_context_still_checks_the_certificate_and_the_host_name(
        tmp_path: Path) -> None:
    """Verification is what it was: the right CA and address pass; an untrusted certificate
    or a name the certificate does not carry fail with a clear error; skipping verification
    (``insecure-skip-tls-verify``) accepts the same server with no CA."""
    with tls_server(tmp_path) as server:
        assert _version(_client(server.url(), ca=str(server.ca)))

        other_ca, _ = self_signed(tmp_path, "other")
        with pytest.raises(errors.Unavailable, match="CERTIFICATE_VERIFY_FAILED"):
            _version(_client(server.url(), ca=str(other_ca)))
        with pytest.raises(errors.Unavailable, match="localhost"):
            _version(_client(server.url("localhost"), ca=str(server.ca)))
        insecure = _client(server.url("localhost"), verify=False)
        assert _version(insecure)
        assert _shared_context(insecure).cert_store_stats()["x509"] == 0  # nothing unused
