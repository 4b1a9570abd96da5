"""Fan-out benchmark: one CopyRule source copied into N namespaces on the local API server.

Prints, for each phase, wall time, API requests by verb and the writes made, so the cost of
an event can be compared with the targets of issue 4: one write per target namespace, no
namespace listing per event where avoidable, and zero writes when a resync finds nothing
changed. Asserts nothing (benchmarks print; tests assert).

    .venv/bin/python bench/copy_fanout.py [--namespaces 1000]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from eventop.handlers.copy_rules import desired  # noqa: E402
from eventop.handlers.events import Event  # noqa: E402
from eventop.handlers.registry import registry  # noqa: E402
from eventop.kube import Kube  # noqa: E402
from eventop.localkube import LocalKube  # noqa: E402

Obj = dict[str, Any]
SOURCE = {"apiVersion": "v1", "kind": "ConfigMap",
          "metadata": {"name": "registry-config", "namespace": "default",
                       "labels": {"copyrator": "true"}},
          "data": {"mirror": "mirror.internal:5000"}}
RULE = {"apiVersion": "eventop.dev/v1", "kind": "CopyRule", "metadata": {"name": "main-rule"},
        "spec": {"ruleType": "configmap", "namespaces": ["default"],
                 "selector": {"matchLabels": {"copyrator": "true"}}}}


def verb(method: str, query: str) -> str:
    if method == "GET":
        return "list" if "limit=" in query else "get"
    if method == "PATCH":
        return "patch/apply"
    return {"POST": "create", "PUT": "update", "DELETE": "delete"}.get(method, method)


def _is_copy_path(path: str) -> bool:
    """A ConfigMap path (collection for a create, object otherwise) outside the source's
    namespace: ``/api/v1/namespaces/<ns>/configmaps[/<name>]``."""
    parts = path.split("/")
    return len(parts) >= 6 and parts[5] == "configmaps" and parts[4] != "default"


class Phase:
    def __init__(self, server: LocalKube, title: str) -> None:
        self.server, self.title = server, title

    def __enter__(self) -> Phase:
        self.start_req = len(self.server.requests)
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        wall = time.perf_counter() - self.start
        served = self.server.requests[self.start_req:]
        by_verb = Counter(verb(r[0], r[2]) for r in served)
        writes = [r for r in served if r[0] != "GET"]
        copy_writes = [r for r in writes if _is_copy_path(r[1])]
        targets = len({r[1].split("/")[4] for r in copy_writes}) or 1
        ns_lists = sum(1 for r in served if r[0] == "GET" and r[1] == "/api/v1/namespaces")
        print(f"{self.title}\n  wall {wall:8.3f} s   requests {len(served):6d}  "
              f"{dict(sorted(by_verb.items()))}\n"
              f"  writes {len(writes):6d} (copies {len(copy_writes)}, "
              f"{len(copy_writes) / targets:.2f} per target namespace written)   "
              f"namespace list pages (500 a page) {ns_lists}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--namespaces", type=int, default=1000)
    args = parser.parse_args()
    ours = registry  # only handlers.copy_rules is imported: only its handlers registered

    with LocalKube(crd_dir=str(REPO / "crds")) as server:
        kube = Kube.connect(url=server.url)

        def deliver(change: str, obj: Obj) -> None:
            for outcome in ours.dispatch(Event.for_object(change, obj), kube):
                if not outcome.ok:
                    raise SystemExit(f"handler failed: {outcome.detail}")

        names = [f"team-{i:04d}" for i in range(args.namespaces)]
        for name in names:
            server.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
        rule = server.put(RULE)
        deliver("add", rule)  # no sources yet: nothing to copy
        print(f"one source, {args.namespaces} target namespaces, local API server {server.url}")

        with Phase(server, "1. source created: its event copies it everywhere"):
            deliver("add", server.put(SOURCE))
        copies = server.list("v1", "ConfigMap", label_selector=desired.copies_selector(rule))
        print(f"  converged: {len(copies)} copies")

        with Phase(server, f"2. echo: the {len(copies)} copy-created events come back"):
            for obj in copies:
                deliver("add", obj)

        with Phase(server, "3. resync, nothing changed: rule + source + every namespace"):
            deliver("update", server.get("eventop.dev/v1", "CopyRule", "main-rule"))
            deliver("update", server.get("v1", "ConfigMap", "registry-config", "default"))
            for name in names:
                deliver("update", server.get("v1", "Namespace", name))

        changed = dict(SOURCE, data={"mirror": "mirror.internal:5001"})
        with Phase(server, "4. source changed: every copy updated"):
            deliver("update", server.put(changed))

        with Phase(server, "5. one new namespace"):
            deliver("add", server.put({"apiVersion": "v1", "kind": "Namespace",
                                       "metadata": {"name": "team-new"}}))

        with Phase(server, "6. source deleted: every copy deleted"):
            last = server.get("v1", "ConfigMap", "registry-config", "default")
            server.remove("v1", "ConfigMap", "registry-config", "default")
            deliver("delete", last)
        left = server.list("v1", "ConfigMap", label_selector=desired.copies_selector(rule))
        print(f"  converged: {len(left)} copies left")


if __name__ == "__main__":
    main()
