"""How eventop configures the official client for a long-running controller."""

from __future__ import annotations

import pytest


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


def _client(url: str, *, ca: str | None = None, verify: bool = True) -> object:
    from kubernetes import client as k8s_client

    from eventop.kube import Kube
    from eventop.kube.connection import api_client

    config = k8s_client.Configuration()
    config.host = url
    config.verify_ssl = verify
    config.ssl_ca_cert = ca
    config.connection_pool_maxsize = 16
    return Kube(api_client(config), timeout=(5.0, 5.0))


def test_new_connections_share_one_tls_context_loaded_once(
        tmp_path: object, monkeypatch: pytest.MonkeyPatch) -> None:
    """Eight requests at once open eight TLS connections; the CA is loaded into one context
    once, not into a context per connection (urllib3's way, 16-19 ms of CPU each when it is
    the system's whole bundle)."""
    from concurrent.futures import ThreadPoolExecutor
    from pathlib import Path

    import urllib3.connection

    from tests.support.tls import tls_server

    built: list[object] = []
    per_connection = urllib3.connection.create_urllib3_context

    def counting(*args: object, **kwargs: object) -> object:
        built.append(args)
        return per_connection(*args, **kwargs)

    monkeypatch.setattr(urllib3.connection, "create_urllib3_context", counting)
    with tls_server(Path(str(tmp_path))) as server:
        kube = _client(server.url(), ca=str(server.ca))
        barrier = __import__("threading").Barrier(8)

        def version(_: int) -> str:
            barrier.wait(5)
            return kube.request("GET", "/version", verb="get")["gitVersion"]  # type: ignore[attr-defined]

        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(version, range(8)))
        assert answers == ["v1.24.0-test"] * 8
        assert len(server.connections) == 8
    assert built == []  # urllib3 built no context of its own: every connection used ours
    context = kube.api.rest_client.pool_manager.connection_pool_kw["ssl_context"]  # type: ignore[attr-defined]
    assert context.cert_store_stats()["x509_ca"] == 1  # the server's certificate, once


def test_the_shared_context_still_checks_the_certificate_and_the_host_name(
        tmp_path: object) -> None:
    """Verification is what it was: the right CA and address pass; an untrusted certificate
    or a name the certificate does not carry fail with a clear error; skipping verification
    (``insecure-skip-tls-verify``) accepts the same server with no CA."""
    from pathlib import Path

    from eventop.kube import errors
    from tests.support.tls import self_signed, tls_server

    directory = Path(str(tmp_path))
    with tls_server(directory) as server:
        trusted = _client(server.url(), ca=str(server.ca))
        assert trusted.request("GET", "/version", verb="get")["gitVersion"]  # type: ignore[attr-defined]

        other_ca, _ = self_signed(directory, "other")
        with pytest.raises(errors.Unavailable, match="CERTIFICATE_VERIFY_FAILED"):
            _client(server.url(), ca=str(other_ca)).request(  # type: ignore[attr-defined]
                "GET", "/version", verb="get")
        with pytest.raises(errors.Unavailable, match="localhost"):
            _client(server.url("localhost"), ca=str(server.ca)).request(  # type: ignore[attr-defined]
                "GET", "/version", verb="get")
        insecure = _client(server.url("localhost"), verify=False)
        assert insecure.request("GET", "/version", verb="get")["gitVersion"]  # type: ignore[attr-defined]
        context = insecure.api.rest_client.pool_manager.connection_pool_kw["ssl_context"]  # type: ignore[attr-defined]
        assert context.cert_store_stats()["x509"] == 0  # nothing loaded that is not used
