"""What the fault suite keeps busy: copy rules, a registry mirror and an exchange rate, changed
the way users change them, with what the cluster must end up as.

Every change goes to the real API server as the outside world's write (its own field
manager). The workload keeps, next to it, what each change asks of eventop:

* :meth:`Workload.unmet` lists every expectation the cluster does not meet yet (a copy
  missing or stale, a copy of a deleted source still there, the rate ConfigMap on an old
  currency, the mirror's StatefulSet on an old upstream). Empty means converged; anything
  left once the deadline passed is a **lost change**.
* :attr:`Workload.justified` counts, per resource, the writes those changes justify at most
  (a source change: one write per target; a new namespace: one per source; a hand edit: one
  restore), and :attr:`Workload.touched` the world's own edits of eventop's objects. A
  redelivered or replayed event must change nothing: more modifications of eventop's
  objects than both together is a **duplicate side effect**.
"""

from __future__ import annotations

import contextlib
import random
from collections import Counter
from typing import Any

from demo.provider import EUR_RATES
from eventop.handlers.mirrors.build import Names
from eventop.kube import Kube, KubeError

Obj = dict[str, Any]
CURRENCIES = ["USD", "GBP", "CHF", "JPY"]
UPSTREAMS = ["https://registry-1.docker.io", "https://mirror.gcr.io", "https://quay.io"]


def namespace(name: str, labels: dict[str, str] | None = None) -> Obj:
    return {"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": name, "labels": dict(labels or {})}}


class Workload:
    def __init__(self, world: Kube, run_id: str, targets: int = 3) -> None:
        self.world = world
        self.id = run_id
        self.label = {"eventop.dev/fault-run": run_id}
        self.src = f"fault-{run_id}-src"
        self.rates_ns = f"fault-{run_id}-rates"
        self.mirror_ns = f"fault-{run_id}-mirror"
        self.targets = [f"fault-{run_id}-t{i}" for i in range(targets)]
        self.cm_sources: dict[str, dict[str, str]] = {"app-config": {"v": "0"},
                                                      "feature-flags": {"v": "0"}}
        self.secret_data = {"token": "djA="}  # base64 "v0"
        self.currency = "USD"
        self.upstream = UPSTREAMS[0]
        self.host_port = random.randint(20000, 29999)
        self.justified: Counter[str] = Counter()
        self.touched: Counter[str] = Counter()  # the world's own edits of eventop's objects
        self.upstream_changes = 0
        self.changes = 0
        self.rates_reachable = True  # False: the provider is down, no rate to expect

    # -- the objects ---------------------------------------------------------------------

    def _rule(self, kind: str) -> Obj:
        return {"apiVersion": "eventop.dev/v1", "kind": "CopyRule",
                "metadata": {"name": f"fault-{self.id}-{kind}"},
                "spec": {"ruleType": kind, "namespaces": [self.src],
                         "selector": {"matchLabels": {"fault-copy": "true"}},
                         "targetNamespaces": {"selector": {"matchLabels": self.label}}}}

    def _cm(self, name: str) -> Obj:
        return {"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": name, "namespace": self.src,
                             "labels": {"fault-copy": "true"}},
                "data": dict(self.cm_sources[name])}

    def _secret(self) -> Obj:
        return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                "metadata": {"name": "registry-token", "namespace": self.src,
                             "labels": {"fault-copy": "true"}},
                "data": dict(self.secret_data)}

    def _rate(self) -> Obj:
        return {"apiVersion": "eventop.dev/v1", "kind": "ExchangeRate",
                "metadata": {"name": "rate", "namespace": self.rates_ns},
                "spec": {"currency": self.currency}}

    def _mirror(self) -> Obj:
        return {"apiVersion": "eventop.dev/v1", "kind": "RegistryMirror",
                "metadata": {"name": "hub", "namespace": self.mirror_ns},
                "spec": {"upstream": self.upstream, "hostPort": self.host_port}}

    def put(self, obj: Obj) -> Obj:
        return self.world.apply(obj, force=True)

    # -- the story -------------------------------------------------------------------------

    def setup(self) -> None:
        self.put(namespace(self.src))
        for t in self.targets:
            self.put(namespace(t, self.label))
        for name in self.cm_sources:
            self.put(self._cm(name))
        self.put(self._secret())
        self.put(self._rule("configmap"))
        self.put(self._rule("secret"))
        self.put(namespace(self.rates_ns))
        self.put(self._rate())
        self.put(namespace(self.mirror_ns, {"pod-security.kubernetes.io/enforce": "privileged"}))
        self.put(self._mirror())
        self.justified["configmaps"] += len(self.cm_sources) * len(self.targets) + 1
        self.justified["secrets"] += len(self.targets)

    def change(self) -> str:
        """Make the next change of a fixed cycle; returns what it did (for the log)."""
        step = self.changes % 8
        self.changes += 1
        n = self.changes
        if step in (0, 5):
            name = "app-config" if step == 0 else "feature-flags"
            self.cm_sources[name] = {"v": str(n)}
            self.put(self._cm(name))
            self.justified["configmaps"] += len(self.targets)
            return f"source {name} v={n}"
        if step == 1:
            ns = f"fault-{self.id}-t{len(self.targets)}"
            self.targets.append(ns)
            self.put(namespace(ns, self.label))
            self.justified["configmaps"] += len(self.cm_sources)
            self.justified["secrets"] += 1
            return f"new namespace {ns}"
        if step == 2:
            self.secret_data = {"token": f"djEw{n:04d}"}
            self.put(self._secret())
            self.justified["secrets"] += len(self.targets)
            return "secret changed"
        if step == 3:
            target = random.choice(self.targets)
            with contextlib.suppress(KubeError):  # not copied there yet: nothing to edit
                self.world.patch("v1", "ConfigMap", "app-config", target, {"data": {"v": "hand"}})
                self.justified["configmaps"] += 1
                self.touched["configmaps"] += 1
            return f"copy edited by hand in {target}"
        if step == 4:
            target = random.choice(self.targets)
            if self.world.delete("v1", "ConfigMap", "feature-flags", target):
                self.justified["configmaps"] += 1
                self.touched["configmaps"] += 1
            return f"copy deleted by hand in {target}"
        if step == 6:
            self.currency = CURRENCIES[(CURRENCIES.index(self.currency) + 1) % len(CURRENCIES)]
            self.put(self._rate())
            self.justified["configmaps"] += 1
            return f"rate currency {self.currency}"
        self.upstream = UPSTREAMS[(UPSTREAMS.index(self.upstream) + 1) % len(UPSTREAMS)]
        self.upstream_changes += 1
        self.put(self._mirror())
        return f"mirror upstream {self.upstream}"

    # -- the verdict -----------------------------------------------------------------------

    def unmet(self) -> list[str]:
        """Every expectation the cluster does not meet now."""
        get = self.world.get_or_none
        missing = []
        for t in self.targets:
            for name, data in self.cm_sources.items():
                copy = get("v1", "ConfigMap", name, t)
                if copy is None or copy.get("data") != data:
                    missing.append(f"ConfigMap {t}/{name} {data}: "
                                   f"{'missing' if copy is None else copy.get('data')}")
            secret = get("v1", "Secret", "registry-token", t)
            if secret is None or secret.get("data") != self.secret_data:
                missing.append(f"Secret {t}/registry-token")
        cm = get("v1", "ConfigMap", "rate", self.rates_ns)
        want = (self.currency, EUR_RATES[self.currency])
        if self.rates_reachable and (
                cm is None or (cm["data"].get("currency"), cm["data"].get("rate")) != want):
            missing.append(f"rate ConfigMap {want}: {cm and cm.get('data')}")
        sts = get("apps/v1", "StatefulSet", Names.of("hub").statefulset, self.mirror_ns)
        if self.upstream_url(sts) != self.upstream:
            missing.append(f"mirror StatefulSet upstream {self.upstream}: "
                           f"{self.upstream_url(sts)}")
        return missing

    @staticmethod
    def upstream_url(sts: Obj | None) -> str | None:
        if sts is None:
            return None
        for env in sts["spec"]["template"]["spec"]["containers"][0].get("env") or []:
            if env["name"] == "REGISTRY_PROXY_REMOTEURL":
                return str(env.get("value"))
        return None

    def mirror_generation(self) -> int:
        """The StatefulSet's generation: bumped once per spec change the server saw."""
        sts = self.world.get("apps/v1", "StatefulSet", Names.of("hub").statefulset,
                             self.mirror_ns)
        return int(sts["metadata"]["generation"])

    def cleanup(self) -> None:
        for kind in ("configmap", "secret"):
            with contextlib.suppress(KubeError):
                self.world.delete("eventop.dev/v1", "CopyRule", f"fault-{self.id}-{kind}")
        for ns in [self.src, self.rates_ns, self.mirror_ns, *self.targets]:
            with contextlib.suppress(KubeError):
                self.world.delete("v1", "Namespace", ns)
