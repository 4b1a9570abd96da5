"""What the install promises about its workloads, read off the rendered manifests: hardened
containers, probes and ports that match the router, one ServiceAccount per component, the
watcher and the CronJob aimed at the router's Service, and a NetworkPolicy that admits them."""

from __future__ import annotations

import os
import re

import pytest

from tests.install.support import (
    containers,
    env_of,
    find,
    group_of,
    needs_kubectl,
    pod_template,
    render,
)

pytestmark = needs_kubectl

NS = "eventop-system"
ROUTER_URL = f"http://eventop-router.{NS}.svc.cluster.local"


def workloads(directory: str) -> list[dict]:
    return [o for o in render(directory) if pod_template(o) is not None]


@pytest.mark.parametrize("directory", ["deploy", "knative"])
def test_every_container_is_hardened(directory: str) -> None:
    """Non-root, read-only root filesystem, no privilege escalation, no capabilities,
    RuntimeDefault seccomp, requests and limits; a writable /tmp where the filesystem is not."""
    assert workloads(directory)
    for obj in workloads(directory):
        spec = pod_template(obj)["spec"]
        pod_sc = spec.get("securityContext") or {}
        volumes = {v["name"]: v for v in spec.get("volumes") or []}
        for c in containers(obj):
            where = f"{obj['kind']} {obj['metadata']['name']}/{c['name']}"
            sc = c.get("securityContext") or {}
            assert sc.get("allowPrivilegeEscalation") is False, where
            assert sc.get("readOnlyRootFilesystem") is True, where
            assert sc.get("capabilities", {}).get("drop") == ["ALL"], where
            assert not sc.get("capabilities", {}).get("add"), where
            assert (sc.get("runAsNonRoot") or pod_sc.get("runAsNonRoot")) is True, where
            seccomp = sc.get("seccompProfile") or pod_sc.get("seccompProfile") or {}
            assert seccomp.get("type") == "RuntimeDefault", where
            assert sc.get("privileged") is not True, where
            resources = c.get("resources") or {}
            assert {"cpu", "memory"} <= set(resources.get("requests") or {}), where
            assert "memory" in (resources.get("limits") or {}), where
            if c["image"].startswith("ghcr.io/eventop/"):
                mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts") or []}
                assert "/tmp" in mounts and "emptyDir" in volumes[mounts["/tmp"]], where
                assert str(sc.get("runAsUser") or pod_sc.get("runAsUser")) == "10001", where


def test_plain_mode_namespace_enforces_the_restricted_pod_security_standard() -> None:
    labels = find(render("deploy"), "Namespace", NS)["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    kn = find(render("knative"), "Namespace", NS)["metadata"]["labels"]
    assert kn["pod-security.kubernetes.io/warn"] == "restricted"


def test_router_deployment_serves_on_port_and_probes_it() -> None:
    objs = render("deploy")
    dep = find(objs, "Deployment", "eventop-router")
    assert dep["spec"]["replicas"] == 2
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    assert c["args"][0] == "eventop.router"
    env = env_of(c)
    port = {p["name"]: p["containerPort"] for p in c["ports"]}["http"]
    assert env["PORT"] == str(port) == "8080"
    assert {"WEB_CONCURRENCY", "PROMETHEUS_MULTIPROC_DIR"} <= set(env)
    assert env["PROMETHEUS_MULTIPROC_DIR"].startswith("/tmp/")
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert c[probe]["httpGet"]["port"] in ("http", port)
    svc = find(objs, "Service", "eventop-router")
    (svc_port,) = svc["spec"]["ports"]
    assert svc_port["port"] == 80 and svc_port["targetPort"] in ("http", port)
    pdb = find(objs, "PodDisruptionBudget", "eventop-router")
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert pdb["spec"]["minAvailable"] == 1


def test_watcher_and_refresh_post_to_the_router_service() -> None:
    objs = render("deploy")
    watcher = find(objs, "Deployment", "eventop-watcher")
    assert watcher["spec"]["replicas"] == 1
    (wc,) = watcher["spec"]["template"]["spec"]["containers"]
    assert wc["args"] == ["eventop.watcher", "run"]
    assert env_of(wc)["K_SINK"] == ROUTER_URL
    cron = find(objs, "CronJob", "eventop-rates-refresh")
    spec = cron["spec"]
    assert spec["schedule"] == "0 * * * *"
    assert spec["concurrencyPolicy"] == "Forbid"
    assert spec["startingDeadlineSeconds"] > 0
    assert 0 < spec["successfulJobsHistoryLimit"] <= 5
    assert 0 < spec["failedJobsHistoryLimit"] <= 5
    (rc,) = spec["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    assert rc["args"] == ["eventop.watcher", "emit", "dev.eventop.exchangerates.refresh", "--sink",
                          "$(K_SINK)"]
    assert env_of(rc)["K_SINK"] == ROUTER_URL
    # The URL names the Service that exists, in the namespace it is in, on port 80.
    svc = find(objs, "Service", "eventop-router")
    meta = svc["metadata"]
    assert f"http://{meta['name']}.{meta['namespace']}.svc.cluster.local" == ROUTER_URL


def test_watcher_runs_alone_unless_it_elects_a_leader_and_probes_its_metrics_port(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The watcher's flags as its container gets them (the manifest's env, and
    KUBERNETES_SERVICE_HOST, which the kubelet sets in every pod): more than one replica, or
    a rollout that overlaps two pods, needs leader election; the liveness probe's port is
    the one the metrics server listens on."""
    from eventop.watcher.cli import build_parser

    dep = find(render("deploy"), "Deployment", "eventop-watcher")
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    for name in [k for k in os.environ if k.startswith(("EVENTOP_", "K_SINK"))]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    for name, value in env_of(c).items():
        monkeypatch.setenv(name, value)
    assert c["args"][0] == "eventop.watcher"
    args = build_parser().parse_args(c["args"][1:])
    if not args.leader_elect:
        assert dep["spec"]["replicas"] == 1
        assert dep["spec"]["strategy"]["type"] == "Recreate"
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    probe_port = c["livenessProbe"]["httpGet"]["port"]
    assert args.metrics_port == ports.get(probe_port, probe_port) == 9090


def test_each_component_has_its_own_service_account() -> None:
    objs = render("deploy")
    accounts = {o["metadata"]["name"]: pod_template(o)["spec"].get("serviceAccountName")
                for o in workloads("deploy")}
    assert accounts == {"eventop-router": "eventop-router", "eventop-watcher": "eventop-watcher",
                        "eventop-rates-refresh": "eventop-refresh"}
    for sa in accounts.values():
        find(objs, "ServiceAccount", sa)


def test_network_policy_admits_only_the_watcher_and_the_refresh_job() -> None:
    objs = render("deploy")
    policy = find(objs, "NetworkPolicy", "eventop-router")
    router_labels = find(objs, "Deployment", "eventop-router")["spec"]["template"]["metadata"][
        "labels"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= router_labels.items()
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = policy["spec"]["ingress"]
    assert [p["port"] for p in rule["ports"]] == [8080]
    selectors = [peer["podSelector"]["matchLabels"] for peer in rule["from"]]
    assert all(set(peer) == {"podSelector"} for peer in rule["from"]), "pods of this namespace"
    admitted = set()
    for obj in workloads("deploy"):
        labels = pod_template(obj)["metadata"]["labels"]
        if any(sel.items() <= labels.items() for sel in selectors):
            admitted.add(obj["metadata"]["name"])
    assert admitted == {"eventop-watcher", "eventop-rates-refresh"}


def test_knative_router_matches_gunicorn_concurrency_and_leaves_port_to_knative() -> None:
    ksvc = find(render("knative"), "Service", "eventop-router")
    assert group_of(ksvc) == "serving.knative.dev"
    spec = ksvc["spec"]["template"]["spec"]
    (c,) = spec["containers"]
    env = env_of(c)
    assert "PORT" not in env, "Knative sets PORT itself and rejects a Service that sets it"
    assert spec["containerConcurrency"] == int(env["WEB_CONCURRENCY"]) * int(
        env["EVENTOP_THREADS"])
    assert spec["serviceAccountName"] == "eventop-router"
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz"}
    assert [p["containerPort"] for p in c["ports"]] == [8080]


def test_knative_event_plumbing_routes_everything_to_the_router() -> None:
    objs = render("knative")
    broker = find(objs, "Broker", "eventop")
    delivery = broker["spec"]["delivery"]
    assert delivery["backoffPolicy"] == "exponential" and delivery["retry"] >= 3
    dead_letter = delivery["deadLetterSink"]["ref"]
    find(objs, dead_letter["kind"], dead_letter["name"])
    sources = [o for o in objs if o["kind"] == "ApiServerSource"]
    ping = find(objs, "PingSource", "eventop-rates-refresh")
    for src in (*sources, ping):
        assert src["spec"]["sink"]["ref"]["kind"] == "Broker"
        assert src["spec"]["sink"]["ref"]["name"] == "eventop"
    assert ping["spec"]["schedule"] == "0 * * * *"
    triggers = [o for o in objs if o["kind"] == "Trigger"]
    for trigger in triggers:
        assert trigger["spec"]["broker"] == "eventop"
        assert trigger["spec"]["subscriber"]["ref"]["name"] == "eventop-router"
        assert trigger["spec"]["delivery"]["backoffPolicy"] == "exponential"
        assert trigger["spec"]["delivery"]["deadLetterSink"]["ref"]["name"] == dead_letter["name"]
    kinds = {t["spec"]["filter"]["attributes"].get("kind") for t in triggers}
    assert kinds - {None} == {r["kind"] for src in sources for r in src["spec"]["resources"]}
    for trigger in triggers:
        exact = {k: v for f in trigger["spec"]["filters"] for k, v in f.get("exact", {}).items()}
        prefix = {k: v for f in trigger["spec"]["filters"] for k, v in f.get("prefix", {}).items()}
        if "kind" in exact:
            assert prefix == {"type": "dev.knative.apiserver."}  # Resource and Reference mode
        else:
            assert exact["type"] == "dev.knative.sources.ping"


def test_knative_triggers_pass_the_trigger_webhooks_filter_rules() -> None:
    """What Knative's Trigger webhook checks and a CRD schema does not (knative/eventing
    ``trigger_validation.go``): each ``exact``/``prefix``/``suffix`` dialect holds exactly one
    attribute ("Multiple items found, can have only one key-value"), one dialect per filter,
    and attribute names are lowercase alphanumerics. An ``exact`` with kind and apiversion
    together passed a server-side dry run and would have been refused on every cluster
    running current Knative."""
    name = re.compile(r"^[a-z0-9]+$")
    triggers = [o for o in render("knative") if o["kind"] == "Trigger"]
    assert triggers
    for trigger in triggers:
        where = trigger["metadata"]["name"]
        for i, f in enumerate(trigger["spec"].get("filters") or []):
            dialects = [d for d in ("exact", "prefix", "suffix", "all", "any", "not", "cesql")
                        if d in f]
            assert len(dialects) == 1, (where, i, f)
            if dialects[0] in ("exact", "prefix", "suffix"):
                attrs = f[dialects[0]]
                assert len(attrs) == 1, (where, i, f)
                assert all(name.match(k) for k in attrs), (where, i, f)
        assert all(name.match(k) for k in trigger["spec"]["filter"]["attributes"]), where
