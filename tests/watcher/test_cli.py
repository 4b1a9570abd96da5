"""``python -m eventop.watcher replay`` and ``emit``: what the CronJob and the replay tests
rely on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from eventop.cli import ConfigError
from eventop.kube.resources import ResourceTable
from eventop.watcher.cli import build_parser, check_resources, main
from eventop.watcher.recording import load_recording
from eventop.watcher.specs import ResourceSpec, parse_resources

REC = Path(__file__).resolve().parents[1] / "recordings"
REPO = Path(__file__).resolve().parents[2]
FAST = ["--backoff-base", "0.01", "--backoff-max", "0.05", "--sink-timeout", "1"]


def test_replaying_a_recording_twice_sends_the_same_ids_in_order(sink, capsys) -> None:
    args = ["replay", str(REC / "copy-rules"), str(REC / "mirrors-and-rates"),
            "--sink", sink.url, *FAST]
    assert main(args) == 0
    first = sink.ids()
    assert main(args) == 0
    second = sink.ids()[len(first):]
    expected = [f"{o['metadata']['uid']}/{o['metadata']['resourceVersion']}/{c}"
                for c, o in load_recording([REC / "copy-rules", REC / "mirrors-and-rates"])]
    assert first == second == expected
    assert f"{len(expected)} of {len(expected)} events accepted" in capsys.readouterr().out


def test_replay_retries_transient_failures_and_fails_on_refusal(sink, capsys) -> None:
    sink.fail(2, 503)
    assert main(["replay", str(REC / "copy-rules" / "api_v1_secrets.watch.jsonl"),
                 "--sink", sink.url, *FAST]) == 0
    assert len(sink.ids()) == 2
    sink.fail(1, 400)
    assert main(["replay", str(REC / "copy-rules" / "api_v1_secrets.watch.jsonl"),
                 "--sink", sink.url, *FAST]) == 1
    assert "1 of 2 events accepted" in capsys.readouterr().out


def test_emit_posts_one_refresh_event_with_its_data(sink) -> None:
    sink.fail(1, 500)
    assert main(["emit", "dev.eventop.exchangerates.refresh", "--sink", sink.url,
                 "--data", '{"currency": "CHF"}', "--source", "cron", *FAST]) == 0
    (got,) = sink.accepted
    assert got.type == "dev.eventop.exchangerates.refresh"
    assert got.headers["ce-source"] == "cron"
    assert json.loads(got.body) == {"currency": "CHF"}


def test_emit_of_a_type_no_handler_wants_fails_naming_the_type(sink, capsys) -> None:
    # The router answers 202 to a type no handler wants: a mistyped CronJob type must not
    # report success every hour while nothing is refreshed. (The router's own answer.)
    from eventop.handlers.registry import Registry
    from eventop.router.app import create_app

    typo = "dev.eventop.exchangerate.refresh"
    answer = create_app(Registry()).test_client().post("/", data=b"{}", headers={
        "ce-id": "1", "ce-source": "cron", "ce-specversion": "1.0", "ce-type": typo,
        "Content-Type": "application/json"})
    assert answer.status_code == 202
    sink.answer(202, answer.data)
    assert main(["emit", typo, "--sink", sink.url, *FAST]) == 1
    assert f"no handler wants type {typo!r} (HTTP 202)" in capsys.readouterr().out


def test_emit_taken_with_202_by_a_knative_broker_is_a_success(sink, capsys) -> None:
    sink.answer(202, b"")  # a Broker's ingress answers 202 to every event it takes
    assert main(["emit", "dev.eventop.exchangerates.refresh", "--sink", sink.url, *FAST]) == 0
    assert "accepted by" in capsys.readouterr().out


def test_run_refuses_a_read_timeout_not_above_the_watch_timeout(capsys) -> None:
    assert main(["run", "--sink", "http://127.0.0.1:9/", "--read-timeout", "10",
                 "--watch-timeout", "45"]) == 2
    err = capsys.readouterr().err
    assert "--read-timeout (10, EVENTOP_READ_TIMEOUT_SECONDS) must be above --watch-timeout" \
        in err and len(err.strip().splitlines()) == 1


def test_emit_exit_code_reports_a_sink_that_never_accepts() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "eventop.watcher", "emit", "dev.eventop.exchangerates.refresh",
         "--sink", "http://127.0.0.1:9/", "--max-attempts", "2", *FAST],
        cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert "NOT accepted" in proc.stdout


def test_emit_without_a_sink_says_how_to_give_one(monkeypatch, capsys) -> None:
    monkeypatch.delenv("K_SINK", raising=False)
    assert main(["emit", "x"]) == 2
    assert capsys.readouterr().err == ("python -m eventop.watcher emit: error: no sink: pass "
                                       "--sink URL or set K_SINK (the router's URL)\n")


def test_sink_and_intervals_come_from_the_environment(monkeypatch) -> None:
    monkeypatch.setenv("K_SINK", "http://router")
    monkeypatch.setenv("EVENTOP_RESYNC_SECONDS", "42")
    monkeypatch.setenv("EVENTOP_RESOURCES", "v1/configmaps@team-a apps/v1/daemonsets:a=b,c=d")
    args = build_parser().parse_args(["run"])
    assert args.sink == "http://router" and args.resync_seconds == 42.0
    assert [str(s) for s in parse_resources(args.resources)] == [
        "v1/configmaps@team-a", "apps/v1/daemonsets:a=b,c=d"]


def test_resource_specs_parse_every_documented_form() -> None:
    assert ResourceSpec.parse("configmaps") == ResourceSpec("", "v1", "configmaps")
    assert ResourceSpec.parse("eventop.dev/v1/copyrules") == ResourceSpec(
        "eventop.dev", "v1", "copyrules")
    spec = ResourceSpec.parse("apps/v1/statefulsets@ns1:app.kubernetes.io/managed-by=eventop")
    assert (spec.namespace, spec.label_selector) == ("ns1", "app.kubernetes.io/managed-by=eventop")
    with pytest.raises(ValueError, match="group/"):
        ResourceSpec.parse("statefulsets.apps")
    assert ResourceSpec.parse("example.com/v1/Team").plural == "Team"  # a kind: discovered


def test_emit_waits_longer_than_the_refresh_handler_may_take(monkeypatch) -> None:
    """A refresh retried while the first still runs would hit the provider twice."""
    from eventop.handlers.exchange_rates.provider import FrankfurterClient

    monkeypatch.delenv("EVENTOP_SINK_TIMEOUT_SECONDS", raising=False)
    args = build_parser().parse_args(["emit", "dev.eventop.exchangerates.refresh"])
    assert args.sink_timeout > FrankfurterClient().refresh_budget


def test_a_sink_that_is_not_an_http_url_is_refused_at_start(capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["emit", "x", "--sink", "router:8080"])
    assert exited.value.code == 2
    assert capsys.readouterr().err == (
        "python -m eventop.watcher emit: error: argument --sink: expected an http:// or "
        "https:// URL, not 'router:8080' (--help lists the options)\n")


def test_a_proxy_the_watcher_can_not_use_is_one_line_at_start(monkeypatch, capsys) -> None:
    monkeypatch.setenv("HTTP_PROXY", "socks5://proxy.example:1080")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    assert main(["emit", "x", "--sink", "http://router.example/"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("python -m eventop.watcher emit: error: cannot post to the sink "
                          "http://router.example/ through the proxy "
                          "'socks5://proxy.example:1080'")
    assert "HTTP_PROXY, HTTPS_PROXY or ALL_PROXY" in err and "NO_PROXY" in err


def _watcher(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("EVENTOP_", "K_SINK", "KUBECONFIG"))}
    return subprocess.run([sys.executable, "-m", "eventop.watcher", *args],
                          env={**base, "HOME": "/nonexistent", **env}, cwd=REPO,
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(("args", "env", "said"), [
    (["run", "--sink", "http://router"], {"EVENTOP_RESYNC_SECONDS": "hourly"},
     "EVENTOP_RESYNC_SECONDS: expected a number of at least 0, not 'hourly'"),
    (["run", "--sink", "http://router"], {"EVENTOP_LOG_LEVEL": "verbose"},
     "EVENTOP_LOG_LEVEL: expected one of debug, info, warning, error, critical, not 'verbose'"),
    (["run", "--sink", "http://router"], {"EVENTOP_LEADER_ELECT": "maybe"},
     "EVENTOP_LEADER_ELECT: expected true or false, not 'maybe'"),
    (["run", "--sink", "http://router", "--read-timeout", "nan"], {},
     "argument --read-timeout: expected a number greater than 0, not 'nan'"),
    (["run", "--sink", "http://router", "--max-in-flight", "0"], {},
     "argument --max-in-flight: expected an integer of at least 1, not 0"),
    (["run"], {"K_SINK": "router:8080"},
     "K_SINK: expected an http:// or https:// URL, not 'router:8080'"),
    (["run", "--sink", "http://router", "--resource", "apps/v1/statefulsets/x"], {},
     "--resource/EVENTOP_RESOURCES: cannot read resource 'apps/v1/statefulsets/x'"),
    (["run", "--sink", "http://router"], {"KUBECONFIG": "/nonexistent/kubeconfig"},
     "--kubeconfig/KUBECONFIG: no such file /nonexistent/kubeconfig"),
    (["run", "--sink", "http://router", "--leader-elect", "--renew-deadline", "20"], {},
     "leader election needs --retry-period (2) < --renew-deadline (20) < --lease-seconds (15)"),
    (["replay", "x", "--backoff-base", "5", "--backoff-max", "1"], {"K_SINK": "http://r"},
     "--backoff-max (1) is shorter than --backoff-base (5)"),
    (["record", "out", "--resource", "v1/configmaps", "--seconds", "0"], {},
     "argument --seconds: expected an integer of at least 1, not 0"),
    (["run", "--sink", "http://router"], {"EVENTOP_LOG_LEVL": "debug"},
     "environment variable not read by eventop: EVENTOP_LOG_LEVL (did you mean "
     "EVENTOP_LOG_LEVEL?)"),
])
def test_configuration_mistakes_are_one_line_and_exit_status_2(args, env, said) -> None:
    proc = _watcher(*args, **env)
    assert proc.returncode == 2, proc.stderr
    [line] = proc.stderr.splitlines()
    assert line.startswith(f"python -m eventop.watcher {args[0]}: error: ")
    assert said in line


def test_a_resource_no_crd_can_add_fails_at_start_instead_of_retrying(local_kube) -> None:
    proc = _watcher("run", "--sink", "http://127.0.0.1:9", "--kube-url", local_kube.url,
                    "--resource", "v1/configmaps", "--resource", "foo")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == (
        "python -m eventop.watcher run: error: resource v1/foo: the API server does not serve "
        "'foo' in v1, and no CustomResourceDefinition can add it there; write "
        "[group/]version/plural as `kubectl api-resources` lists them, e.g. v1/configmaps or "
        "apps/v1/statefulsets\n")


def test_a_custom_resource_not_installed_yet_is_waited_for_not_refused(kube) -> None:
    """Its CRD may be installed after the watcher starts; the watch loop waits for it."""
    check_resources(kube, [ResourceSpec.parse("example.com/v1/widgets"),
                                   ResourceSpec.parse("apps/v1/statefulsets")])
    with pytest.raises(ConfigError, match="'statefulset' in apps/v1"):
        check_resources(kube, [ResourceSpec.parse("apps/v1/statefulset")])


def test_a_built_in_resource_named_by_its_kind_as_derived_from_handlers_is_accepted(
        kube) -> None:
    """The watch list derived from handlers names a kind the static table does not know by
    its kind (``v1/ResourceQuota`` before the table had it): found by discovery, as the
    watch loop finds it, never refused as a typo."""
    kube.resources = ResourceTable(())  # nothing known without asking the API server
    check_resources(kube, [ResourceSpec("", "v1", "ResourceQuota"),
                           ResourceSpec("rbac.authorization.k8s.io", "v1", "RoleBinding")])
    with pytest.raises(ConfigError, match="'NoSuchKind' in v1"):
        check_resources(kube, [ResourceSpec("", "v1", "NoSuchKind")])


def test_a_label_selector_the_api_server_refuses_is_one_line_at_start(kube) -> None:
    with pytest.raises(ConfigError, match=r"resource v1/configmaps:app in \(a: the API server "
                                          r"refuses the label selector 'app in \(a'"):
        check_resources(kube, [ResourceSpec.parse("v1/configmaps:app in (a")])
    check_resources(kube, [ResourceSpec.parse("v1/configmaps:app in (a,b)")])


def test_a_namespace_that_does_not_exist_is_warned_about_once_and_still_watched(
        kube, caplog: pytest.LogCaptureFixture) -> None:
    """``v1/configmaps@nosuchns`` watched nothing, silently: a typo looked like a quiet
    namespace. It may also be created later, so it is a warning, not a refusal."""
    specs = [ResourceSpec.parse("v1/configmaps@nosuchns"),
             ResourceSpec.parse("v1/secrets@nosuchns"), ResourceSpec.parse("v1/configmaps@default")]
    with caplog.at_level("WARNING", logger="eventop.watcher"):
        check_resources(kube, specs)
    assert [r.getMessage() for r in caplog.records] == [
        "namespace 'nosuchns' does not exist: v1/configmaps@nosuchns, v1/secrets@nosuchns "
        "watch(es) nothing until it is created (check the spelling in EVENTOP_RESOURCES or "
        "--resource)"]


@pytest.mark.parametrize("status", [401, 403])
def test_a_selected_resource_the_watchers_credentials_may_not_list_is_left_to_the_watch_loop(
        kube, monkeypatch: pytest.MonkeyPatch, status: int) -> None:
    """A ServiceAccount trimmed of StatefulSets (selected by the mirrors' label) crashed the
    watcher with a traceback; unselected resources got the watch loop's retry line."""
    from eventop.kube import errors

    def refused(*_args, **_kwargs):
        raise errors.KubeError(f"{status} refused", status=status)

    monkeypatch.setattr(kube, "pages", refused)
    check_resources(kube, [ResourceSpec.parse("apps/v1/statefulsets:app=x")])


def test_an_unreachable_api_server_is_waited_for_at_start() -> None:
    """The API server may come up after the watcher (it then retries with backoff)."""
    from eventop.kube import Kube

    down = Kube.connect(url="http://127.0.0.1:9")
    check_resources(down, [ResourceSpec.parse("foo")])


def test_emit_and_the_deliverer_send_the_router_token_when_one_is_set(sink, monkeypatch) -> None:
    from eventop.events import to_cloudevent
    from eventop.watcher.delivery import Deliverer, Outgoing

    monkeypatch.setenv("EVENTOP_ROUTER_TOKEN", "t0ken")
    assert main(["emit", "dev.eventop.exchangerates.refresh", "--sink", sink.url, *FAST]) == 0
    d = Deliverer(sink.url, lanes=1, headers={"Authorization": "Bearer t0ken"}).start()
    try:
        item = Outgoing.of(to_cloudevent("add", {"apiVersion": "v1", "kind": "ConfigMap",
                                                 "metadata": {"name": "a", "namespace": "n",
                                                              "uid": "u", "resourceVersion": "1"}},
                                         "test"))
        assert d.submit(item, timeout=1) and d.join(10)
    finally:
        d.stop()
    assert [r.headers.get("authorization") for r in sink.accepted] == ["Bearer t0ken"] * 2


@pytest.mark.parametrize(("token", "what"), [
    ("tökén", "a non-ASCII character at position 2"),
    ("abc\ndef", "a control character at position 4"),
])
@pytest.mark.parametrize("command", [["emit", "x"], ["run", "--resource", "v1/namespaces"],
                                     ["replay", str(REC / "copy-rules")]])
def test_a_token_no_http_header_can_carry_is_refused_before_anything_is_sent(
        monkeypatch, capsys, sink, command: list[str], token: str, what: str) -> None:
    monkeypatch.setenv("EVENTOP_ROUTER_TOKEN", token)
    assert main([*command, "--sink", sink.url, *FAST]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"python -m eventop.watcher {command[0]}: error: "
                          f"EVENTOP_ROUTER_TOKEN has {what}: it is sent in an HTTP header")
    assert token.split("\n")[0] not in err  # a secret: never printed
    assert sink.ids() == []


def test_replay_refuses_a_path_that_holds_no_recording(sink, capsys, tmp_path) -> None:
    (tmp_path / "notes.txt").write_text("not a watch file")
    assert main(["replay", str(tmp_path), "--sink", sink.url, *FAST]) == 2
    assert main(["replay", str(tmp_path / "missing"), "--sink", sink.url, *FAST]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"python -m eventop.watcher replay: error: no watch files (*.jsonl, as `record` "
        f"writes them) in {tmp_path}",
        f"python -m eventop.watcher replay: error: recording {tmp_path / 'missing'} does not "
        "exist"]
    assert sink.ids() == []


def test_record_refuses_an_output_path_it_can_not_create(capsys, tmp_path) -> None:
    (tmp_path / "file").write_text("")
    assert main(["record", str(tmp_path / "file" / "sub"), "--resource", "v1/configmaps",
                 "--seconds", "1"]) == 2
    assert capsys.readouterr().err == (
        f"python -m eventop.watcher record: error: cannot write the recording into "
        f"{tmp_path / 'file' / 'sub'}: Not a directory\n")


def test_emit_refuses_an_empty_type_in_one_line(sink, capsys) -> None:
    assert main(["emit", "", "--sink", sink.url, *FAST]) == 2
    assert capsys.readouterr().err == (
        "python -m eventop.watcher emit: error: not a valid CloudEvent: Attribute 'type' must "
        "not be None or empty\n")
    assert sink.ids() == []


@pytest.mark.parametrize(("args", "said"), [
    (["--resource", "v1/configmaps@Bad_NS"],
     "--resource/EVENTOP_RESOURCES: resource 'v1/configmaps@Bad_NS': 'Bad_NS' after '@' can "
     "not be a namespace"),
    (["--leader-elect", "--lease-name", "Bad_Name"],
     "argument --lease-name: expected an object name"),
    (["--leader-elect", "--lease-namespace", "a.b"],
     "argument --lease-namespace: expected a namespace name"),
])
def test_names_no_object_can_have_are_refused_at_start(capsys, args: list[str],
                                                       said: str) -> None:
    """Else the watcher would watch an empty namespace, or retry its Lease, forever."""
    try:
        status = main(["run", "--sink", "http://127.0.0.1:9", *args])
    except SystemExit as exited:  # argparse's own refusal
        status = exited.code  # type: ignore[assignment]
    assert status == 2
    assert capsys.readouterr().err.startswith(f"python -m eventop.watcher run: error: {said}")


def run_on_kubeconfig(text: str, name: str, tmp_path, monkeypatch, capsys) -> tuple[Path, str]:
    """``watcher run`` with KUBECONFIG naming a file holding ``text``: it must exit 2; the
    file and what was said on stderr."""
    config = tmp_path / name
    config.write_text(text)
    monkeypatch.setenv("KUBECONFIG", str(config))
    monkeypatch.delenv("EVENTOP_KUBE_URL", raising=False)
    assert main(["run", "--sink", "http://127.0.0.1:9"]) == 2
    return config, capsys.readouterr().err


def test_a_file_that_is_no_kubeconfig_at_all_is_named_in_one_line(capsys, tmp_path,
                                                                    monkeypatch) -> None:
    """KUBECONFIG=/etc/passwd read "TypeError: 'str' object does not support item
    assignment": true, and no help."""
    config, err = run_on_kubeconfig("root:x:0:0:root:/root:/bin/bash\n", "passwd", tmp_path,
                                    monkeypatch, capsys)
    assert err == (f"python -m eventop.watcher run: error: --kubeconfig/KUBECONFIG: {config} "
                   "is not a kubeconfig (a YAML mapping with clusters, users and contexts, as "
                   "`kubectl config view` shows)\n")


def test_a_malformed_kubeconfig_is_said_in_one_line(capsys, tmp_path, monkeypatch) -> None:
    """The YAML parser's message spans lines; the user gets one."""
    _config, err = run_on_kubeconfig("apiVersion: v1\nclusters: [\n  - a\n", "kubeconfig",
                                     tmp_path, monkeypatch, capsys)
    assert err.count("\n") == 1
    assert err.startswith("python -m eventop.watcher run: error: cannot configure Kubernetes "
                          "access: ParserError: while parsing a flow node expected")
