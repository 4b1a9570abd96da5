"""``make demo``: the whole pipeline on this machine, then a report of what the handlers did.

By default it starts an embedded local API server (``localkube``) and a loopback stand-in for
the rates provider, so it needs neither a cluster nor the internet, and never touches one:
an exported ``KUBECONFIG`` is ignored. Only ``--cluster`` runs it against a real cluster
(``--kubeconfig PATH``, else ``$KUBECONFIG``, else ``~/.kube/config``; the CRDs must be
installed: ``kubectl apply -k crds/``), with the public rates API, in a namespace of its own.

Either way: the router runs under gunicorn, the watcher lists and watches the API server and
posts CloudEvents to the router, the world changes (the shipped recordings are replayed and the
example resources applied), and the demo waits until the handlers converged, prints the objects
they created and exits 0, or 1 with one line per thing that did not happen. SIGTERM or Ctrl-C
stops everything it started.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import tempfile
import time
import warnings
from pathlib import Path
from types import FrameType

from urllib3.exceptions import InsecureRequestWarning

from demo.world import REPO, Expectations, LocalWorld, World, load_examples, report
from eventop.cli import ConfigError, Parser, http_url, number
from eventop.cli import report as report_error
from eventop.testing.processes import RouterProcess, WatcherProcess

PROG = "python -m demo"


class Failed(Exception):
    """A step of the demo did not happen; the message says which and why, on one line."""


class Stopped(BaseException):
    """SIGTERM arrived: unwind, so that everything started is stopped (a BaseException, like
    KeyboardInterrupt, so that no step mistakes it for its own failure)."""


_requested: list[int] = []  # the signal, once one arrived


def _on_signal(signum: int, frame: FrameType | None) -> None:
    """Raise :class:`Stopped` where the main thread is. Python swallows an exception raised
    inside a finalizer or ``__del__``, so :func:`check_stop` also looks at the flag."""
    _requested.append(signum)
    raise Stopped(signum)


def check_stop() -> None:
    """Raise :class:`Stopped` if a stop was asked for (called between the demo's steps)."""
    if _requested:
        raise Stopped(_requested[0])


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog=PROG, description=__doc__,
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cluster", action="store_true",
                        help="run against a real cluster instead of the embedded local API "
                             "server (it creates a namespace eventop-demo and objects in it)")
    parser.add_argument("--kubeconfig", default=None, metavar="PATH",
                        help="with --cluster: the cluster's kubeconfig (default: $KUBECONFIG, "
                             "else ~/.kube/config)")
    parser.add_argument("--timeout", type=number(above=0), default=90.0,
                        help="seconds to wait for the handlers to converge (default 90)")
    parser.add_argument("--keep-running", action="store_true",
                        help="after the report, leave everything running until Ctrl-C or "
                             "SIGTERM, and print the kubectl command to look around")
    return parser


def cluster_kubeconfig(args: argparse.Namespace) -> str:
    """The kubeconfig ``--cluster`` runs against; it must exist."""
    path = args.kubeconfig or os.environ.get("KUBECONFIG") or str(Path("~/.kube/config"))
    path = os.path.expanduser(path.split(os.pathsep)[0])
    if not os.path.isfile(path):
        raise ConfigError(f"--cluster: kubeconfig {path} does not exist (pass --kubeconfig "
                          "PATH, or set KUBECONFIG)")
    return path


def main(argv: list[str] | None = None) -> int:
    if hasattr(sys.stdout, "reconfigure"):  # each line as it happens, also into a pipe
        sys.stdout.reconfigure(line_buffering=True)
    try:
        args = build_parser().parse_args(argv)
        if args.kubeconfig and not args.cluster:
            raise ConfigError("--kubeconfig is only used with --cluster (without it the demo "
                              "runs on the embedded local API server)")
        kubeconfig = cluster_kubeconfig(args) if args.cluster else None
        if os.environ.get("RATES_API_URL", "").strip():
            try:
                http_url(os.environ["RATES_API_URL"])
            except argparse.ArgumentTypeError as exc:
                raise ConfigError(f"RATES_API_URL: {exc}") from None
    except ConfigError as exc:
        return report_error(PROG, exc)

    signal.signal(signal.SIGTERM, _on_signal)
    finished = False
    with contextlib.ExitStack() as stack:  # on the way out: stops all that was started
        try:
            code = run(args, kubeconfig, stack)
            finished = True
            if code == 0 and args.keep_running:
                print("\nrunning; Ctrl-C (or SIGTERM) stops everything")
                while True:
                    check_stop()
                    time.sleep(0.5)
            return code
        except Failed as exc:
            print(f"{PROG}: {exc}", file=sys.stderr)
            return 1
        except (Stopped, KeyboardInterrupt) as exc:
            signum = exc.args[0] if isinstance(exc, Stopped) else signal.SIGINT
            print(f"{PROG}: {signal.Signals(signum).name}: stopping what the demo started",
                  file=sys.stderr)
            return 0 if finished else 128 + int(signum)
        finally:  # stopping takes a few seconds: a second signal must not cut it short
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, signal.SIG_IGN)


def run(args: argparse.Namespace, kubeconfig: str | None, stack: contextlib.ExitStack) -> int:
    """Start everything (each registered on ``stack`` to be stopped), change the world, wait,
    report. Raises :class:`Failed` for a step that did not happen."""
    log_dir = tempfile.mkdtemp(prefix="eventop-demo-")
    world: World
    if kubeconfig:
        from demo.world import ClusterWorld

        print(f"eventop demo — against the cluster of {kubeconfig} (--cluster)")
        # urllib3 warns on every request when the kubeconfig turns TLS verification off: the
        # line below says it once instead.
        warnings.filterwarnings("ignore", category=InsecureRequestWarning)
        try:
            world = ClusterWorld(kubeconfig)
        except Exception as exc:
            raise Failed(f"cannot use the cluster of {kubeconfig}: {_one_line(exc)}; nothing "
                         "was started") from None
        env = {"KUBECONFIG": kubeconfig}
        print(f"  [1/5] API server              {world.kube.host} (the cluster's)")
        if not world.kube.api.configuration.verify_ssl:
            print("  (the kubeconfig turns TLS verification off: insecure-skip-tls-verify)")
        print("  [2/5] rates API               "
              f"{os.environ.get('RATES_API_URL') or 'the public one (Frankfurter)'}")
    else:
        world, env = start_local(stack, log_dir)

    try:
        router = RouterProcess(env, log_dir=log_dir, cwd=REPO)
    except Exception as exc:
        raise Failed(f"the router did not start: {_one_line(exc)}") from None
    stack.callback(router.stop, keep_log=True)
    check_stop()
    print(f"  [3/5] router (gunicorn)       {router.url}  log: {router.log_path}")
    watcher = WatcherProcess(router.url, {**env, "EVENTOP_RESYNC_SECONDS": "30"},
                             log_dir=log_dir, cwd=REPO)
    stack.callback(watcher.stop, keep_log=True)
    check_stop()
    print(f"  [4/5] watcher                 sink={router.url}  log: {watcher.log_path}")

    local = isinstance(world, LocalWorld)
    expect = Expectations(played=local, namespaces=None if local else world.namespaces())
    try:
        if isinstance(world, LocalWorld):
            changes = world.replay_recordings(REPO / "tests" / "recordings", expect)
            print(f"  [5/5] world: replayed {changes} recorded changes (copy-rules, "
                  "mirrors-and-rates) and applied the examples in crds/examples/")
        else:
            print("  [5/5] world: applied the examples in crds/examples/ "
                  f"(namespace {world.namespace}); not the CopyRules, which act on every "
                  "namespace, nor the Databases, whose finalizer needs a router running after "
                  "the demo's stopped")
        world.apply_examples(load_examples(REPO / "crds" / "examples"), expect)
    except Exception as exc:
        raise Failed(f"changing the world failed: {_one_line(exc)}") from None

    start = time.monotonic()
    check_stop()
    missing = expect.wait(world.kube, args.timeout,
                          abort=lambda: check_stop() or _exited(router) or _exited(watcher),
                          step=lambda: play(world) if isinstance(world, LocalWorld) else None)
    print(f"\nconverged in {time.monotonic() - start:.1f}s" if not missing
          else f"\nNOT converged after {time.monotonic() - start:.0f}s")
    report(world.kube, world.namespaces(), local=local)
    if not isinstance(world, LocalWorld):
        print(f"\neverything is in namespace {world.namespace}; remove it with "
              f"`kubectl delete namespace {world.namespace}`")
    if router.returncode is None:
        print(f"\nrate refresh event (what the CronJob sends): {world.refresh(router.url)}")
    if missing:
        print("\nwhat did not happen:")
        for line in missing:
            print(f"  - {line}")
        print(f"\nlogs: {router.log_path} {watcher.log_path}")
        return 1
    if args.keep_running and local:
        print("\nlook around (the local API server has no kubelet: pods stay Pending):\n"
              f"  kubectl --kubeconfig {world.kubeconfig} get copyrules,registrymirrors,"
              "exchangerates,databases -A")
    return 0


def play(world: LocalWorld) -> None:
    """The controllers the local API server lacks, played for the Databases; said, since
    their verdicts are the demo's, not a real controller's."""
    for line in world.play_controllers():
        print(f"  demo plays a controller: {line}")


def start_local(stack: contextlib.ExitStack, log_dir: str) -> tuple[LocalWorld, dict[str, str]]:
    """The embedded local API server and the rates stand-in."""
    from demo.provider import RatesStandIn
    from eventop.testing.cluster import LocalCluster

    if os.environ.pop("KUBECONFIG", None):  # so that no child process can reach that cluster
        print("(KUBECONFIG is set and ignored: pass --cluster to run against that cluster)")
    print("eventop demo — embedded local API server, no cluster needed")
    try:
        # gc_dangling: collect an object whose owner is already gone, as the real garbage
        # collector does. A run planned from the router's cache just before a parent's
        # deletion reached it may create a child after the parent went (the replay deletes
        # a CopyRule while its copies are being made): without it such a copy stays forever.
        local = LocalCluster([REPO / "crds"], gc_dangling=True)
    except Exception as exc:
        raise Failed(f"the local API server did not start: {_one_line(exc)}") from None
    stack.callback(local.close)
    print(f"  [1/5] local API server        {local.url}  (CRDs from crds/ installed)")
    given = os.environ.get("RATES_API_URL", "").strip()  # checked by main
    if given:
        rates_url = given
        print(f"  [2/5] rates provider          {rates_url}  (RATES_API_URL)")
    else:
        rates_url = stack.enter_context(RatesStandIn()).url
        print(f"  [2/5] rates provider stand-in {rates_url}  (set RATES_API_URL for a real one)")
    world = LocalWorld(local, Path(log_dir) / "kubeconfig")
    return world, {"EVENTOP_KUBE_URL": local.url, "RATES_API_URL": rates_url}


def _exited(process: RouterProcess | WatcherProcess) -> str | None:
    """Why waiting is pointless: the process exited (with its last log line)."""
    if process.returncode is None:
        return None
    lines = process.log().strip().splitlines()
    return (f"the {process.name} exited with status {process.returncode}"
            + (f": {lines[-1]}" if lines else "") + f" (log: {process.log_path})")


def _one_line(exc: BaseException) -> str:
    return " ".join(f"{type(exc).__name__}: {exc}".split())


if __name__ == "__main__":
    sys.exit(main())
