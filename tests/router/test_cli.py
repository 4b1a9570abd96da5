"""``python -m eventop.router``'s options and the gunicorn settings they become (no server
started)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

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
                   "--graceful-timeout", "--log-level", "--log-format"):
        assert option in text
    for variable in ("PORT", "WEB_CONCURRENCY", "EVENTOP_THREADS", "EVENTOP_KUBE_URL",
                     "EVENTOP_HANDLERS", "EVENTOP_MAX_BODY_BYTES", "PROMETHEUS_MULTIPROC_DIR",
                     "EVENTOP_LOG_LEVEL", "EVENTOP_LOG_FORMAT"):
        assert variable in text
    assert "POST /" in text and "/readyz" in text and "/metrics" in text


# Read by the router's code but not settings a user gives: the pod's own name, and how the
# router knows it runs in a cluster (both in --help's text anyway where they matter).
NOT_SETTINGS = {"HOSTNAME", "KUBERNETES_SERVICE_HOST"}


def _variables_read_by(*rooms: str) -> set[str]:
    found: set[str] = set()
    for room in rooms:
        for path in (REPO / room).rglob("*.py"):
            found |= set(re.findall(r"""os\.environ(?:\.get\(|\[)\s*["']([A-Z_]+)["']""",
                                    path.read_text()))
    return found - NOT_SETTINGS


def test_help_names_every_built_in_handler() -> None:
    from eventop.handlers import BUILTIN

    text = " ".join(cli.build_parser().format_help().split())
    names = ", ".join(b.removeprefix("eventop.handlers.") for b in BUILTIN)
    assert f"comma-separated ({names})" in text


def test_help_lists_every_environment_variable_the_router_reads() -> None:
    text = cli.build_parser().format_help()
    read = _variables_read_by("router", "handlers", "kube")
    assert {"EVENTOP_BUILTIN_HANDLERS", "RATES_API_URL", "EVENTOP_KUBE_URL"} <= read
    assert sorted(v for v in read if v not in text) == []


def _readme_variables(used_by: str) -> set[str]:
    """The variables the README's configuration table lists for a component."""
    names: set[str] = set()
    for line in (REPO / "README.md").read_text().splitlines():
        cells = [c.strip() for c in line.split("|")]
        if len(cells) > 3 and cells[1].startswith("`") and used_by in cells[2]:
            names |= set(re.findall(r"`([A-Z_]+)`", cells[1]))
    return names


def test_help_lists_every_variable_the_readme_says_it_lists() -> None:
    from eventop.watcher.cli import build_parser as watcher_parser

    router_vars, watcher_vars = _readme_variables("router"), _readme_variables("watcher")
    assert {"WEB_CONCURRENCY", "EVENTOP_BUILTIN_HANDLERS", "EVENTOP_LOG_FORMAT"} <= router_vars
    assert {"K_SINK", "EVENTOP_RESOURCES"} <= watcher_vars
    router_help = cli.build_parser().format_help()
    run = watcher_parser()._subparsers._group_actions[0].choices["run"]  # type: ignore[union-attr]
    assert sorted(v for v in router_vars if v not in router_help) == []
    assert sorted(v for v in watcher_vars if v not in run.format_help()) == []


def _router(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m eventop.router`` with ``env`` added (nothing else of eventop's set)."""
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("EVENTOP_", "PORT", "WEB_CONCURRENCY", "PROMETHEUS_"))}
    return subprocess.run(
        [sys.executable, "-m", "eventop.router", "--host", "127.0.0.1", "--port", "0", *args],
        env={**base, "EVENTOP_KUBE_URL": "http://127.0.0.1:9", **env}, cwd=REPO,
        capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(("env", "args", "said"), [
    ({"WEB_CONCURRENCY": "abc"}, [],
     "WEB_CONCURRENCY: expected an integer of at least 1, not 'abc'"),
    ({"EVENTOP_THREADS": "0"}, [], "EVENTOP_THREADS: expected an integer of at least 1, not 0"),
    ({"EVENTOP_LOG_LEVEL": "verbose"}, [],
     "EVENTOP_LOG_LEVEL: expected one of debug, info, warning, error, critical, not 'verbose'"),
    ({"EVENTOP_LOG_FORMAT": "xml"}, [], "EVENTOP_LOG_FORMAT: expected one of json, text, "
                                        "not 'xml'"),
    ({}, ["--port", "99999"], "argument --port: expected an integer from 0 to 65535, not 99999"),
    ({}, ["--log-level", "verbose"], "argument --log-level: expected one of debug, info"),
    ({"EVENTOP_BUILTIN_HANDLERS": "bogus"}, [],
     "EVENTOP_BUILTIN_HANDLERS: unknown built-in handler(s) bogus; choose from copy_rules, "),
    ({"EVENTOP_HANDLERS": "no_such_module_anywhere"}, [],
     "EVENTOP_HANDLERS: no module named 'no_such_module_anywhere'"),
    ({"EVENTOP_HANDLERS": "/nonexistent/handlers.py"}, [],
     "EVENTOP_HANDLERS: there is no file '/nonexistent/handlers.py'"),
    ({"EVENTOP_KUBE_URL": "localhost:8001"}, [],
     "EVENTOP_KUBE_URL: expected an http:// or https:// URL, not 'localhost:8001'"),
    ({"RATES_API_URL": "api.frankfurter.dev"}, [],
     "RATES_API_URL: expected an http:// or https:// URL, not 'api.frankfurter.dev'"),
    ({"KUBECONFIG": "/nonexistent/config", "EVENTOP_KUBE_URL": ""}, [],
     "KUBECONFIG: no such file /nonexistent/config"),
    ({"EVENTOP_MAX_BODY_BYTES": "lots"}, [],
     "EVENTOP_MAX_BODY_BYTES must be a number of bytes, not 'lots'"),
    ({"EVENTOP_CACHE_WAIT_SECONDS": "-1"}, [],
     "EVENTOP_CACHE_WAIT_SECONDS must be a positive number of seconds, not '-1'"),
    ({"EVENTOP_RUN_ON_WATCH": "maybe"}, [], "EVENTOP_RUN_ON_WATCH must be true, false or leader, "
                                            "not 'maybe'"),
    # a misspelt token variable would leave the router open to anyone
    ({"EVENTOP_ROUTR_TOKEN": "s3cret"}, [], "environment variable not read by eventop: "
     "EVENTOP_ROUTR_TOKEN (did you mean EVENTOP_ROUTER_TOKEN?)"),
])
def test_configuration_mistakes_are_one_line_and_exit_status_2(
        env: dict[str, str], args: list[str], said: str) -> None:
    proc = _router(env, *args)
    assert proc.returncode == 2, proc.stderr
    [line] = proc.stderr.splitlines()
    assert line.startswith("python -m eventop.router: error: ")
    assert said in line
    assert proc.stdout == ""


@pytest.mark.parametrize(("source", "said"), [
    ("from eventop.engine import Controller, Desired\n"
     "c = Controller('noreg', parent='example.com/v1/TeamQuota', owns=['v1/ResourceQuota'])\n"
     "c.reconcile(lambda tq, reads: Desired([]))\n",
     "defines the controller(s) c but does not register them: give the module a `registry = "
     "Registry()` and pass Controller(..., registry=registry)"),
    ("import json\n", "registers no handler: decorate a function with @on(...)"),
])
def test_a_handler_module_that_registers_nothing_is_one_line_and_exit_status_2(
        tmp_path: Path, source: str, said: str) -> None:
    """Such a router was ready, and the watcher watched nothing, silently (a user's trial:
    Controller(...) without registry=registry)."""
    module = tmp_path / "teamquota.py"
    module.write_text(source)
    proc = _router({"EVENTOP_HANDLERS": str(module), "EVENTOP_BUILTIN_HANDLERS": "none"})
    assert proc.returncode == 2, proc.stderr
    [line] = proc.stderr.splitlines()
    assert line.startswith(f"python -m eventop.router: error: EVENTOP_HANDLERS: "
                           f"{str(module)!r} ")
    assert said in line


def test_a_misspelt_built_in_kind_is_one_line_and_exit_status_2(tmp_path: Path,
                                                                 local_kube: Any) -> None:
    """No CRD can add a kind to a built-in group: the router used to turn ready, saying the
    handler "waits for v1/ConfigMapp to be served", and never run it (a user's trial)."""
    module = tmp_path / "typo.py"
    module.write_text(
        "from eventop.engine import Controller, Desired\n"
        "from eventop.handlers import Registry\n"
        "registry = Registry()\n"
        "c = Controller('typo', parent='v1/Namespace', owns=['v1/ConfigMapp'],\n"
        "               registry=registry)\n"
        "c.reconcile(lambda ns, reads: Desired([]))\n")
    proc = _router({"EVENTOP_HANDLERS": str(module), "EVENTOP_BUILTIN_HANDLERS": "none",
                    "EVENTOP_KUBE_URL": local_kube.url})
    assert proc.returncode == 2, proc.stderr
    [line] = proc.stderr.splitlines()
    assert line == (
        "python -m eventop.router: error: typo declare(s) v1/ConfigMapp, which the API server "
        "does not serve: no CustomResourceDefinition can add a kind to a built-in group; check "
        "the spelling in owns=/reads=/@on (did you mean v1/ConfigMap?)")


def test_a_kubeconfig_the_workers_could_not_load_is_one_line_and_exit_status_2(
        tmp_path: Path) -> None:
    # No current context: the watcher refuses it at start; so does the router now, instead of
    # serving and never turning ready
    config = tmp_path / "config"
    config.write_text("apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\n"
                      "users: []\n")
    proc = _router({"KUBECONFIG": str(config), "EVENTOP_KUBE_URL": ""})
    assert proc.returncode == 2, proc.stderr
    [line] = proc.stderr.splitlines()
    assert line.startswith("python -m eventop.router: error: cannot configure Kubernetes "
                           "access from the kubeconfig: ConfigException: ")


def test_the_flag_wins_over_an_invalid_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    served: list[ServerOptions] = []
    monkeypatch.setattr("eventop.router.server.serve", served.append)
    monkeypatch.setenv("PORT", "99999")
    _unset_but_restored(monkeypatch, "PROMETHEUS_MULTIPROC_DIR")
    assert cli.main(["--port", "8080"]) == 0
    assert served[0].port == 8080


def test_a_handler_module_that_fails_to_import_is_named_with_its_line(tmp_path: Path) -> None:
    (tmp_path / "broken_handlers.py").write_text(
        "from eventop import on\n\n"
        "@on('dev.knative.apiserver.*', api_version='v1', kind='ConfigMap')\n"
        "def annotate(event, kube):\n    return 'ok'\n\n"
        "SETTINGS = load_settings()\n")
    proc = _router({"EVENTOP_HANDLERS": "broken_handlers",
                    "PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO}"})
    assert proc.returncode == 2, proc.stderr
    [line] = proc.stderr.splitlines()
    assert line == (
        "python -m eventop.router: error: EVENTOP_HANDLERS: importing 'broken_handlers' "
        "failed: NameError: name 'load_settings' is not defined "
        f"({tmp_path / 'broken_handlers.py'}, line 7)")


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


def test_defaults_are_port_8080_one_worker_with_threads(
        monkeypatch: pytest.MonkeyPatch) -> None:
    served: list[ServerOptions] = []
    monkeypatch.setattr("eventop.router.server.serve", served.append)
    for name in ("PORT", "WEB_CONCURRENCY", "EVENTOP_THREADS", "PROMETHEUS_MULTIPROC_DIR"):
        _unset_but_restored(monkeypatch, name)
    cli.main([])
    [options] = served
    assert (options.port, options.workers, options.threads) == (8080, 1, 32)
    assert options.host == ("0.0.0.0" if cli.in_container() else "127.0.0.1")
    # one worker keeps its metrics in memory: no directory of files
    assert options.metrics_dir_owned is None and "PROMETHEUS_MULTIPROC_DIR" not in os.environ


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


def test_invalid_port_variable_is_reported(monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("PORT", "http")
    with pytest.raises(SystemExit) as exited:
        cli.main([])
    assert exited.value.code == 2
    assert capsys.readouterr().err == (
        "python -m eventop.router: error: PORT: expected an integer from 0 to 65535, "
        "not 'http' (--help lists the options)\n")


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


def test_a_host_that_is_not_this_machines_is_one_line_and_exit_status_2() -> None:
    proc = subprocess.run([sys.executable, "-m", "eventop.router", "--host", "999.1.1.1",
                           "--port", "0"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.startswith("python -m eventop.router: error: --host '999.1.1.1': ")
    assert len(proc.stderr.splitlines()) == 1


def test_a_port_in_use_is_one_line_not_five_attempts() -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = _router({}, "--port", str(port))
    assert proc.returncode == 1
    assert proc.stderr == (f"python -m eventop.router: error: port {port} on 127.0.0.1 is in "
                           "use (another router?): choose another --port or PORT\n")


@pytest.mark.parametrize(("workers", "given", "run_on_watch"), [
    ("1", None, None), ("2", None, "false"), ("2", "true", "true")])
def test_several_workers_leave_runs_to_the_events_unless_told_otherwise(
        monkeypatch: pytest.MonkeyPatch, workers: str, given: str | None,
        run_on_watch: str | None) -> None:
    """Each worker has its own cache and watch: runs started from the watch would run in
    every worker."""
    monkeypatch.setattr("eventop.router.server.serve", lambda options: None)
    _unset_but_restored(monkeypatch, "PROMETHEUS_MULTIPROC_DIR")
    _unset_but_restored(monkeypatch, "EVENTOP_RUN_ON_WATCH")
    if given is not None:
        monkeypatch.setenv("EVENTOP_RUN_ON_WATCH", given)
    assert cli.main(["--workers", workers]) == 0
    assert os.environ.get("EVENTOP_RUN_ON_WATCH") == run_on_watch


def test_a_token_no_http_header_can_carry_is_refused_at_start(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("EVENTOP_ROUTER_TOKEN", "s3cr\u20act")
    assert cli.main(["--port", "0"]) == 2
    assert capsys.readouterr().err == (
        "python -m eventop.router: error: EVENTOP_ROUTER_TOKEN has a non-ASCII character at "
        "position 5: it is sent in an HTTP header, which carries printable ASCII only (a "
        "base64 or hex token, e.g. from `openssl rand -hex 32`)\n")


def test_a_metrics_directory_that_can_not_be_made_is_refused_at_start(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    _unset_but_restored(monkeypatch, "PROMETHEUS_MULTIPROC_DIR")
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path / "file"))
    assert cli.main(["--port", "0", "--workers", "2"]) == 2
    assert capsys.readouterr().err == (
        f"python -m eventop.router: error: PROMETHEUS_MULTIPROC_DIR='{tmp_path / 'file'}' can "
        "not hold the workers' metric files: File exists; point it at a writable directory, "
        "or unset it for a fresh one\n")
