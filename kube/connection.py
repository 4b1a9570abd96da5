"""How eventop reaches the API server: the official client's configuration, loaded the way
kubectl loads it, and tuned for a long-running controller (a bounded credential refresh, a
connection per concurrent request, one TLS context for all of them, TCP keepalive)."""

from __future__ import annotations

import os
import ssl
import threading
import time
from typing import Any

from kubernetes import client as k8s_client
from kubernetes import config as k8s_config
from kubernetes.utils.keepalive import tcp_keepalive_socket_options
from urllib3.util.ssl_ import create_urllib3_context

from eventop.kube import errors


def configuration(kubeconfig: str | None = None, context: str | None = None,
                  url: str | None = None) -> k8s_client.Configuration:
    """An explicit URL, a kubeconfig, or in-cluster, as kubectl would choose.

    ``url`` (or ``EVENTOP_KUBE_URL``) is a plain HTTP API server without auth, such as the
    local API server of ``make demo`` and the tests.
    """
    url = url or os.environ.get("EVENTOP_KUBE_URL")
    config = k8s_client.Configuration()
    if url:
        config.host = url.rstrip("/")
    elif kubeconfig or os.environ.get("KUBECONFIG") or os.path.exists(
            os.path.expanduser("~/.kube/config")):
        k8s_config.load_kube_config(config_file=kubeconfig, context=context,
                                    client_configuration=config)
    elif os.environ.get("KUBERNETES_SERVICE_HOST"):
        k8s_config.load_incluster_config(client_configuration=config)
    else:
        raise errors.Unavailable(
            "no Kubernetes API configured: set KUBECONFIG, run in a cluster, "
            "or point EVENTOP_KUBE_URL at a local API server")
    # The kubeconfig and in-cluster loaders re-apply the whole config before every
    # request (to pick up a refreshed token), which re-reads the proxy environment each
    # time: measured, half of the client's CPU per request. Once a minute is enough
    # (tokens are rotated long before they expire; client-go re-reads its token file once a
    # minute too).
    hook = config.refresh_api_key_hook
    if hook is not None:
        config.refresh_api_key_hook = _at_most_every(60.0, hook)
    # One pooled connection per concurrent request: the watcher holds a watch open per
    # resource (8 by default) and router workers run several threads.
    config.connection_pool_maxsize = max(
        int(config.connection_pool_maxsize or 0), 64)
    # TCP keepalive on every connection, watches above all: a peer that vanished
    # without a FIN or RST (a node gone, a NAT entry dropped) is noticed in
    # 30 + 3 x 10 s instead of never. A connection kept open but silent is the read
    # timeout's job (see eventop.watcher.watch.WatchSettings).
    config.socket_options = tcp_keepalive_socket_options(idle=30, interval=10,
                                                                count=3)
    return config


def api_client(config: k8s_client.Configuration) -> k8s_client.ApiClient:
    """The official client for ``config``, its connections sharing one TLS context.

    urllib3, as the official client drives it, builds a TLS context for every new
    connection and loads its trust store into it: the operating system's whole CA bundle
    when the kubeconfig names no CA (or skips verification), measured at 16-19 ms of CPU
    per connection against 1 ms for the handshake itself. A burst of writes opens a
    connection per concurrent request, so a router cold after start paid that dozens of
    times within a second, in its own process, while its first copies waited. client-go builds
    one ``tls.Config`` per transport; so does this: the same verification (CA, hostname,
    client certificate), loaded once.
    """
    client = k8s_client.ApiClient(config)
    if config.host.startswith("https:"):
        pools = client.rest_client.pool_manager.connection_pool_kw
        pools["ssl_context"] = tls_context(config)
        for loaded in ("ca_certs", "ca_cert_data", "cert_file", "key_file"):
            pools.pop(loaded, None)  # in the context already: not loaded per connection
    return client


def tls_context(config: k8s_client.Configuration) -> ssl.SSLContext:
    """What urllib3 would build for each connection from ``config``, built once."""
    verify = bool(config.verify_ssl)
    context = create_urllib3_context(cert_reqs=ssl.CERT_REQUIRED if verify else ssl.CERT_NONE)
    if verify:
        if config.ssl_ca_cert or config.ca_cert_data:
            context.load_verify_locations(cafile=config.ssl_ca_cert, cadata=config.ca_cert_data)
        else:
            context.load_default_certs()
    if config.cert_file:
        context.load_cert_chain(config.cert_file, config.key_file)
    return context


def _at_most_every(seconds: float, hook: Any) -> Any:
    """``hook``, called at most once in ``seconds`` (thread-safe)."""
    lock = threading.Lock()
    last = [-float("inf")]

    def throttled(configuration: Any) -> None:
        now = time.monotonic()
        if now - last[0] < seconds:
            return
        with lock:
            if now - last[0] >= seconds:
                hook(configuration)
                last[0] = now
                # The loader's hook re-applies its configuration, itself included: stay.
                configuration.refresh_api_key_hook = throttled
    return throttled
