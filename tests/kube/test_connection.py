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
