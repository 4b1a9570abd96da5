"""RBAC is derived from the code, and the manifests must grant exactly that: no less, no more.

* Router: the built-in handlers run through the router's real Flask app (in this process, so
  every API request is seen with the line of code that made it) against the local API server,
  over scenarios that reach their API calls: the recorded copy-rules and mirrors-and-rates
  traffic, a scheduled refresh, a provider failure (Warning Events, created then counted), a
  mirror's StatefulSet changing, copies edited and deleted by hand. Every request is mapped to
  the (apiGroup, resource, verb) the API server authorizes; the ownerReferences the router
  writes add ``update`` on the owners' ``finalizers``. A static scan lists every
  ``kube.<method>(...)`` call in ``handlers/`` and ``router/``; one the scenarios did not reach
  fails the test (its permissions could not be derived), unless :data:`NOT_REACHED` explains it.
* Watcher: ``python -m eventop.watcher run`` (the image's command) against the local API server;
  its list and watch requests, as served, are the permissions it needs.
* Refresh CronJob: ``python -m eventop.watcher emit`` makes no API request at all, so its
  ServiceAccount has no binding and mounts no token.
* ApiServerSource: Knative requires get, list and watch on each resource it watches, which
  must be the watcher's resources.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.install.rbac import (
    Access,
    KubeRecorder,
    Site,
    access_of,
    granted,
    kube_call_sites,
    reached,
)
from tests.install.scenarios import builtin_registry, traced_router
from tests.install.support import (
    REPO,
    Sink,
    command_of,
    env_of,
    find,
    needs_kubectl,
    pod_template,
    render,
)

pytestmark = needs_kubectl

NAMESPACE = "eventop-system"

# Call sites the scenarios can not reach, each with why its permissions are still covered.
# Keep this empty where possible: an entry here is a permission derived by hand.
NOT_REACHED: dict[str, str] = {}


# -- helpers ---------------------------------------------------------------------------------

def plurals() -> dict[tuple[str, str], tuple[str, str]]:
    from eventop.kube.resources import BUILTIN

    return {(r.api_version, r.kind): (r.group, r.plural) for r in BUILTIN}


def served_accesses(local_kube: Any) -> set[Access]:
    found: set[Access] = set()
    for method, path, query, _status in list(local_kube.requests):
        found |= access_of(method, path, query)
    return found


def manifest_run(local_kube: Any, kind: str, name: str, sink: Sink
                 ) -> tuple[list[str], dict[str, str]]:
    """The command and environment of the deploy/ container ``kind``/``name``, aimed at the
    local API server and ``sink``: whatever the manifest turns on (leader election, say) is
    what the derivation sees."""
    container, = pod_template(find(render("deploy"), kind, name))["spec"]["containers"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBECONFIG", "EVENTOP_"))}
    env.update(env_of(container))
    env.update(EVENTOP_KUBE_URL=local_kube.url, PYTHONPATH=str(REPO), KUBECONFIG=os.devnull,
               K_SINK=sink.url)
    return command_of(container, env), env


@pytest.fixture(scope="module")
def router_trace() -> Iterator[KubeRecorder]:
    with traced_router() as trace:
        yield trace


# -- router ----------------------------------------------------------------------------------

def cache_accesses() -> set[Access]:
    """list and watch of every kind a built-in controller declares: the router's cache holds
    them, whether or not the local API server of the scenarios serves them (Jobs, say)."""
    table = plurals()
    found = set()
    for ctl in builtin_registry().controllers:
        for kind in ctl.kinds():
            group, plural = table[kind.key]
            found |= {Access(group, plural, "list"), Access(group, plural, "watch")}
    return found


def derived_router_accesses(trace: KubeRecorder) -> set[Access]:
    return trace.accesses() | trace.owner_finalizer_accesses(plurals()) | cache_accesses() | \
        trace.reads_after_create()


def test_router_is_granted_exactly_what_its_handlers_use(router_trace: KubeRecorder) -> None:
    need = derived_router_accesses(router_trace)
    have = granted(render("deploy"), "eventop-router", NAMESPACE)
    missing, unused = sorted(map(str, need - have)), sorted(map(str, have - need))
    assert not missing, "the router needs these, add them to its role: " + "; ".join(missing)
    assert not unused, "granted to the router but never used, remove: " + "; ".join(unused)


def test_knative_router_gets_the_same_permissions() -> None:
    assert granted(render("knative"), "eventop-router", NAMESPACE) == granted(
        render("deploy"), "eventop-router", NAMESPACE)


def test_every_kube_call_in_the_router_and_handlers_was_reached(
        router_trace: KubeRecorder) -> None:
    """A call the scenarios never made is a permission nobody derived."""
    sites = [s for room in ("handlers", "engine", "router") for s in kube_call_sites(room)]
    assert sites, "the static scan found no kube calls: is it still looking at the code?"
    missed = {str(s) for s in set(sites) - reached(sites, router_trace.calls)}
    unexplained = sorted(m for m in missed if m.split(" ")[0] not in NOT_REACHED)
    assert not unexplained, ("add a scenario reaching these (or explain in NOT_REACHED): "
                             + "; ".join(unexplained))


def test_router_scenarios_exercised_every_handler_kind(router_trace: KubeRecorder) -> None:
    """The derivation saw each handler's writes (a silently broken scenario would not)."""
    writes = {(a.resource, a.verb) for a in router_trace.accesses()}
    for resource, verb in (("jobs", "create"), ("cronjobs", "patch"), ("statefulsets", "delete"),
                           ("persistentvolumeclaims", "delete"), ("volumesnapshots", "create"),
                           ("databases", "patch"), ("databases/status", "patch")):
        assert (resource, verb) in writes, (resource, verb)
    for resource in ("statefulsets", "daemonsets", "services", "persistentvolumeclaims"):
        assert (resource, "patch") in writes, resource  # a mirror's objects: applied
    for resource in ("configmaps", "secrets"):  # copies, rates: created, replaced, deleted
        assert {(resource, v) for v in ("create", "update", "delete")} <= writes, resource
    for cr in ("copyrules", "registrymirrors", "exchangerates"):
        assert (f"{cr}/status", "patch") in writes, cr
    assert ("events", "create") in writes and ("events", "patch") in writes


def test_static_scan_finds_calls_through_self_kube() -> None:
    rel = [s for room in ("handlers", "engine") for s in kube_call_sites(room)
           if isinstance(s, Site)]
    assert {s.method for s in rel} >= {"get_or_none", "pages", "apply", "patch_status"}


# -- access mapping --------------------------------------------------------------------------

@pytest.mark.parametrize("method,path,query,content_type,expected", [
    ("GET", "/api/v1/namespaces/a/configmaps/x", "", None, {("", "configmaps", "get")}),
    ("GET", "/api/v1/configmaps", "limit=500", None, {("", "configmaps", "list")}),
    ("GET", "/apis/apps/v1/statefulsets", "watch=true&resourceVersion=5", None,
     {("apps", "statefulsets", "watch")}),
    ("GET", "/api/v1/namespaces/team-a", "", None, {("", "namespaces", "get")}),
    ("GET", "/api/v1/namespaces", "", None, {("", "namespaces", "list")}),
    ("PATCH", "/apis/eventop.dev/v1/copyrules/r/status", "", "application/merge-patch+json",
     {("eventop.dev", "copyrules/status", "patch")}),
    ("PATCH", "/api/v1/namespaces/a/secrets/s", "fieldManager=eventop",
     "application/apply-patch+yaml", {("", "secrets", "patch"), ("", "secrets", "create")}),
    ("PUT", "/api/v1/namespaces/a/configmaps/x", "", None, {("", "configmaps", "update")}),
    ("POST", "/api/v1/namespaces/a/events", "", None, {("", "events", "create")}),
    ("DELETE", "/apis/apps/v1/namespaces/a/daemonsets/d", "", None,
     {("apps", "daemonsets", "delete")}),
    ("GET", "/version", "", None, set()),
    ("GET", "/apis/eventop.dev/v1", "", None, set()),
])
def test_requests_map_to_the_permissions_the_api_server_checks(
        method: str, path: str, query: str, content_type: str | None,
        expected: set[tuple[str, str, str]]) -> None:
    assert access_of(method, path, query, content_type) == {Access(*e) for e in expected}


# -- watcher, refresh, ApiServerSource -------------------------------------------------------

def watcher_resources() -> list[Any]:
    """What the watcher watches by default: what the built-in handlers listen to."""
    from eventop.watcher.specs import default_resources

    return default_resources(builtin_registry())


def test_watcher_is_granted_exactly_what_it_lists_and_watches(local_kube: Any) -> None:
    """Run deploy/'s watcher command and environment against the local API server until it
    watches every default resource the local API server serves (it serves no Jobs, say);
    what it asked for must be what the handlers' declarations derive (list and watch of each
    resource), and that is what it is granted. Leader election is off there (one replica),
    so no Lease access; turned on in the manifest, it would be derived here too."""
    from eventop.kube import Kube

    derived = {(s.group, s.plural) for s in watcher_resources()}
    kube = Kube.connect(url=local_kube.url)
    served = {(s.group, s.plural) for s in watcher_resources()
              if any(r.plural == s.plural for r in kube.discover(s.api_version))}
    assert {("", "configmaps"), ("eventop.dev", "copyrules")} <= served
    with Sink() as sink:
        command, env = manifest_run(local_kube, "Deployment", "eventop-watcher", sink)
        proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)
        try:
            watching: set[tuple[str, str]] = set()
            deadline = time.monotonic() + 60
            while watching != served and time.monotonic() < deadline and proc.poll() is None:
                time.sleep(0.1)
                watching = {(a.group, a.resource) for a in served_accesses(local_kube)
                            if a.verb == "watch"}
        finally:
            proc.terminate()
            try:
                _out, err = proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                _out, err = proc.communicate()
    assert watching == served, f"the watcher never watched {served - watching}:\n{err[-2000:]}"
    need = {Access(g, p, v) for g, p in derived for v in ("list", "watch")}
    asked = served_accesses(local_kube)
    assert asked <= need, f"the watcher asked for more than its handlers need: {asked - need}"
    have = granted(render("deploy"), "eventop-watcher", NAMESPACE)
    missing, unused = sorted(map(str, need - have)), sorted(map(str, have - need))
    assert not missing, "the watcher needs these, add them to its role: " + "; ".join(missing)
    assert not unused, "granted to the watcher but never used, remove: " + "; ".join(unused)


def test_refresh_job_needs_no_api_access(local_kube: Any) -> None:
    """The CronJob's command (its args, ``$(K_SINK)`` expanded) posts one event and never
    calls the Kubernetes API."""
    with Sink() as sink:
        command, env = manifest_run(local_kube, "CronJob", "eventop-rates-refresh", sink)
        proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert [h.get("ce-type") for h in sink.received] == ["dev.eventop.exchangerates.refresh"]
    assert list(local_kube.requests) == []
    objs = render("deploy")
    assert granted(objs, "eventop-refresh", NAMESPACE) == set()
    pod = find(objs, "CronJob", "eventop-rates-refresh")["spec"]["jobTemplate"]["spec"][
        "template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    assert find(objs, "ServiceAccount", "eventop-refresh")["automountServiceAccountToken"] is False


def test_apiserversource_watches_the_watchers_resources_read_only() -> None:
    """Knative's source watches what the handlers listen to (the optional kinds aside: a
    source for a kind the cluster does not serve would not start), with the same label
    selectors, and may only read them; each kind has its Trigger to the router."""
    objs = render("knative")
    resources = source_resources(objs)
    table = plurals()
    watched = {(*table[(r["apiVersion"], r["kind"])],
                ",".join(f"{k}={v}" for k, v in sorted(
                    (r.get("selector") or {}).get("matchLabels", {}).items())) or None)
               for r in resources}
    assert len(watched) == len(resources)  # each kind in one source only
    assert watched == {(s.group, s.plural, s.label_selector) for s in watcher_resources()
                       if not s.optional}
    need = {Access(g, p, v) for g, p, _ in watched for v in ("get", "list", "watch")}
    for source in (o for o in objs if o["kind"] == "ApiServerSource"):
        assert granted(objs, source["spec"]["serviceAccountName"], NAMESPACE) == need
    exacts = [{k: v for f in t["spec"].get("filters") or [] for k, v in f.get("exact", {}).items()}
              for t in objs if t["kind"] == "Trigger"]
    triggered = {(e["apiversion"], e["kind"]) for e in exacts if "kind" in e}
    assert triggered == {(r["apiVersion"], r["kind"]) for r in resources}


def test_secrets_cross_the_broker_by_name_only() -> None:
    """A Secret's data must not travel through the Broker (its channel may be Kafka topics,
    its dead-letter sink logs whole events): Secrets have a Reference-mode source of their
    own, and every other source sends full objects (the router's cache catch-up uses their
    resourceVersion)."""
    objs = render("knative")
    modes = {(r["apiVersion"], r["kind"]): o["spec"]["mode"]
             for o in objs if o["kind"] == "ApiServerSource" for r in o["spec"]["resources"]}
    assert modes.pop(("v1", "Secret")) == "Reference"
    assert set(modes.values()) == {"Resource"}


def source_resources(objs: list[dict]) -> list[dict]:
    """The resources of every ApiServerSource."""
    return [r for o in objs if o["kind"] == "ApiServerSource" for r in o["spec"]["resources"]]


def test_a_kind_a_handler_listens_to_is_watched_in_both_install_modes() -> None:
    """Every kind a built-in handler listens to reaches the router: the watcher's default
    resources (deploy/) and the ApiServerSource (knative/) both cover it."""
    registry = builtin_registry()
    default = {(k.api_version, k.kind) for k in registry.watched_kinds()}
    knative = {(r["apiVersion"], r["kind"]) for r in source_resources(render("knative"))}
    optional = {(k.api_version, k.kind) for k in registry.watched_kinds() if k.optional}
    table = plurals()
    derived = {table[k] for k in default}
    assert {(s.group, s.plural) for s in watcher_resources()} == derived
    assert default - optional <= knative, f"nobody watches {default - optional - knative}"


@pytest.mark.parametrize("directory", ["deploy", "knative"])
def test_nobody_gets_wildcards_crd_writes_or_escalation(directory: str) -> None:
    for obj in render(directory):
        for rule in obj.get("rules") or []:
            assert "*" not in rule.get("verbs", []) + rule.get("resources", []) + rule.get(
                "apiGroups", []), obj["metadata"]["name"]
            assert not set(rule.get("verbs", [])) & {"escalate", "bind", "impersonate"}
            if "apiextensions.k8s.io" in rule.get("apiGroups", []):
                assert set(rule["verbs"]) <= {"get", "list", "watch"}
