"""``python -m eventop.router``'s options and the gunicorn settings they become (no server
started)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from eventop.router import __main__ as cli
from eventop.router.server import ServerOptions

REPO = Path(__file__).resolve().parents[2]


def _unset_but_restored(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """Unset ``name`` now and put back its current state (set or unset) after the test,
    even if the code under test sets it (``main`` sets PROMETHEUS_MULTIPROC_DIR)."""
    monkeypatch.setenv(name, "placeholder")
    monkeypatch.delenv(name)


def test_help_documents_every_option_and_environment_variable() -> None:
    text = cli.build_parser().format_help()
    for option in ("--host", "--port", "--workers", "--threads", "--timeout",
                   "--graceful-timeout", "--log-level"):
        assert option in text
    for variable in ("PORT", "WEB_CONCURRENCY", "EVENTOP_THREADS", "EVENTOP_KUBE_URL",
                     "EVENTOP_HANDLERS", "EVENTOP_MAX_BODY_BYTES", "PROMETHEUS_MULTIPROC_DIR"):
        assert variable in text
    assert "POST /" in text and "/readyz" in text and "/metrics" in text


@pytest.mark.parametrize("bad", ["0", "-2", "two"])
def test_non_positive_worker_count_is_refused(bad: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["--workers", bad])
    assert "--workers" in capsys.readouterr().err


def test_container_is_detected_from_the_kubernetes_service_variable(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    assert cli.in_container()


def test_outside_a_container_the_router_binds_loopback_by_default(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setattr(os.path, "exists", lambda path: False)
    assert not cli.in_container()


def test_port_workers_and_threads_come_from_the_environment(
        monkeypatch: pytest.MonkeyPatch) -> None:
    served: list[ServerOptions] = []
    monkeypatch.setattr("eventop.router.server.serve", served.append)
    monkeypatch.setenv("PORT", "9191")
    monkeypatch.setenv("WEB_CONCURRENCY", "3")
    monkeypatch.setenv("EVENTOP_THREADS", "1")
    _unset_but_restored(monkeypatch, "PROMETHEUS_MULTIPROC_DIR")
    assert cli.main(["--host", "127.0.0.1"]) == 0
    [options] = served
    assert (options.host, options.port, options.workers, options.threads) == (
        "127.0.0.1", 9191, 3, 1)
    # the temporary metrics directory was made for this run, and removed after it
    assert options.metrics_dir_owned and not os.path.exists(options.metrics_dir_owned)


def test_flags_win_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    served: list[ServerOptions] = []
    monkeypatch.setattr("eventop.router.server.serve", served.append)
    monkeypatch.setenv("PORT", "9191")
    monkeypatch.setenv("WEB_CONCURRENCY", "3")
    _unset_but_restored(monkeypatch, "PROMETHEUS_MULTIPROC_DIR")
    cli.main(["--host", "::1", "--port", "7000", "--workers", "5", "--threads", "8",
              "--timeout", "90", "--graceful-timeout", "10"])
    [options] = served
    assert (options.port, options.workers, options.threads, options.timeout,
            options.graceful_timeout) == (7000, 5, 8, 90, 10)
    assert options.gunicorn_settings()["bind"] == ["[::1]:7000"]


def test_defaults_are_port_8080_two_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    served: list[ServerOptions] = []
    monkeypatch.setattr("eventop.router.server.serve", served.append)
    for name in ("PORT", "WEB_CONCURRENCY", "EVENTOP_THREADS", "PROMETHEUS_MULTIPROC_DIR"):
        _unset_but_restored(monkeypatch, name)
    cli.main([])
    [options] = served
    assert (options.port, options.workers, options.threads) == (8080, 2, 4)
    assert options.host == ("0.0.0.0" if cli.in_container() else "127.0.0.1")


def test_workers_finish_before_the_kubelet_kills_the_pod(monkeypatch: pytest.MonkeyPatch) -> None:
    """gunicorn's graceful shutdown must end inside the pod's termination grace period."""
    import yaml

    served: list[ServerOptions] = []
    monkeypatch.setattr("eventop.router.server.serve", served.append)
    _unset_but_restored(monkeypatch, "PROMETHEUS_MULTIPROC_DIR")
    cli.main([])
    [options] = served
    [deployment] = [d for d in yaml.safe_load_all((REPO / "deploy" / "router.yaml").read_text())
                    if d and d["kind"] == "Deployment"]
    grace = deployment["spec"]["template"]["spec"].get("terminationGracePeriodSeconds", 30)
    assert options.graceful_timeout < grace
    assert ServerOptions(host="127.0.0.1", port=1).graceful_timeout < 30  # Kubernetes' default


def test_invalid_port_variable_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PORT", "http")
    with pytest.raises(SystemExit, match="PORT must be an integer, not 'http'"):
        cli.main([])


def test_given_metrics_directory_is_emptied_of_stale_files(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "counter_123.db").write_bytes(b"old")
    (tmp_path / "keep.txt").write_text("not ours")
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    assert cli.prepare_metrics_dir() is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.txt"]


def test_gunicorn_settings_use_threads_and_disable_the_control_socket() -> None:
    settings = ServerOptions(host="127.0.0.1", port=8080, workers=2, threads=4).gunicorn_settings()
    assert settings["bind"] == ["127.0.0.1:8080"]
    assert (settings["workers"], settings["threads"], settings["worker_class"]) == (
        2, 4, "gthread")
    assert settings["control_socket_disable"] is True
    assert settings["accesslog"] is None
    single = ServerOptions(host="0.0.0.0", port=1, threads=1).gunicorn_settings()
    assert single["worker_class"] == "sync"


def test_app_factory_is_loadable_by_plain_gunicorn(monkeypatch: pytest.MonkeyPatch) -> None:
    """``gunicorn 'router.app:create_app()'`` resolves the app exactly like this."""
    from flask import Flask
    from gunicorn.util import import_app

    monkeypatch.setenv("EVENTOP_BUILTIN_HANDLERS", "none")
    app = import_app("eventop.router.app:create_app()")
    assert isinstance(app, Flask)
    assert {"/", "/events", "/healthz", "/readyz", "/metrics"} <= {
        rule.rule for rule in app.url_map.iter_rules()}


def test_starting_the_cli_imports_no_prometheus_client_before_the_metrics_dir_is_set() -> None:
    """Multiprocess metrics only work if the variable is set before the first import."""
    import subprocess
    import sys

    code = ("import sys, eventop.router.__main__; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('prometheus_client', 'flask') or m.startswith(('eventop.kube', "
            "'eventop.handlers'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).resolve().parents[2])
    assert out.stdout.strip() == "[]"
