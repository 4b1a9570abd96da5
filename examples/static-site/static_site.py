"""StaticSite: a few pages served by nginx in the cluster, as an eventop desired-state handler.

For each StaticSite the handler wants three objects, and the engine makes them so (creates
what is missing, updates what differs, deletes what is no longer wanted, under the field
manager ``eventop-static-sites``):

* a ConfigMap ``<name>-pages`` holding the pages;
* a Deployment ``<name>`` running the web server with the pages mounted; a checksum of the
  pages in its pod template rolls the pods when the pages change;
* a Service ``<name>`` in front of it.

The status says where the site is served and whether its replicas are ready; it is written
only when it changes. A page name that can not be a file name is an invalid spec: reported in
status, nothing written. Load it into eventop's router with ``EVENTOP_HANDLERS=static_site``
(or the path of this file).
"""

from __future__ import annotations

import hashlib
import json
import re
from datetime import UTC, datetime
from typing import Any

from eventop.engine import Controller, Desired, Outcome, Reads, SpecError
from eventop.handlers import Registry

Obj = dict[str, Any]
API_VERSION = "example.com/v1"
CHECKSUM = "example.com/pages-checksum"
PAGE_NAME = re.compile(r"^[-._a-zA-Z0-9]+$")
MAX_PAGES_BYTES = 900 * 1024  # a ConfigMap holds at most 1 MiB in all

registry = Registry()
sites = Controller(
    "static-sites",
    parent=f"{API_VERSION}/StaticSite",
    owns=["v1/ConfigMap", "v1/Service", "apps/v1/Deployment"],
    registry=registry,
)


def pages_of(site: Obj) -> dict[str, str]:
    """The pages asked for; :class:`SpecError` for a name that is not a plain file name."""
    pages: dict[str, str] = dict(site["spec"]["pages"])
    for name in pages:
        if not PAGE_NAME.match(name) or name in (".", ".."):
            raise SpecError(f"page name {name!r} is not a plain file name (letters, digits, "
                            "'-', '_' and '.')", reason="InvalidPageName")
    if len(json.dumps(pages).encode()) > MAX_PAGES_BYTES:
        raise SpecError(f"the pages hold more than {MAX_PAGES_BYTES // 1024} KiB; a "
                        "ConfigMap holds at most 1 MiB", reason="PagesTooLarge")
    return pages


def children(site: Obj, pages: dict[str, str]) -> list[Obj]:
    meta, spec = site["metadata"], site["spec"]
    name, ns = meta["name"], meta["namespace"]
    labels = {"app.kubernetes.io/name": "static-site", "app.kubernetes.io/instance": name}
    checksum = hashlib.sha256(json.dumps(pages, sort_keys=True).encode()).hexdigest()[:16]
    return [
        {"apiVersion": "v1", "kind": "ConfigMap",
         "metadata": {"name": f"{name}-pages", "namespace": ns, "labels": labels},
         "data": pages},
        {"apiVersion": "apps/v1", "kind": "Deployment",
         "metadata": {"name": name, "namespace": ns, "labels": labels},
         "spec": {
             "replicas": spec.get("replicas", 1),
             "selector": {"matchLabels": labels},
             "template": {
                 "metadata": {"labels": labels, "annotations": {CHECKSUM: checksum}},
                 "spec": {
                     "containers": [{
                         "name": "web",
                         "image": spec.get("image", "nginx:1.27-alpine"),
                         "ports": [{"name": "http", "containerPort": 80}],
                         "readinessProbe": {"httpGet": {"path": "/", "port": "http"}},
                         "resources": {"requests": {"cpu": "10m", "memory": "16Mi"},
                                       "limits": {"memory": "64Mi"}},
                         "volumeMounts": [{"name": "pages", "readOnly": True,
                                           "mountPath": "/usr/share/nginx/html"}],
                     }],
                     "volumes": [{"name": "pages",
                                  "configMap": {"name": f"{name}-pages"}}],
                 },
             },
         }},
        {"apiVersion": "v1", "kind": "Service",
         "metadata": {"name": name, "namespace": ns, "labels": labels},
         "spec": {"selector": labels,
                  "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}},
    ]


def status(site: Obj, pages: dict[str, str], reads: Reads, outcome: Outcome) -> Obj:
    """Where the site is served and whether it is ready (from the Deployment in the cache)."""
    meta = site["metadata"]
    wanted = site["spec"].get("replicas", 1)
    deployment = next(iter(reads.children("apps/v1/Deployment")), None)
    ready = int(((deployment or {}).get("status") or {}).get("readyReplicas") or 0)
    if outcome.conflicts:
        condition = ("False", "NameTaken", f"{outcome.conflicts[0]} exists and is not this "
                     "site's: rename the site or remove that object")
    elif outcome.errors:
        condition = ("False", "WriteRefused", str(outcome.errors[0]))
    elif ready >= wanted:
        condition = ("True", "Serving", f"{ready} of {wanted} replicas ready")
    else:
        condition = ("False", "Starting", f"{ready} of {wanted} replicas ready")
    return {"observedGeneration": meta.get("generation"),
            "url": f"http://{meta['name']}.{meta['namespace']}.svc.cluster.local",
            "pages": len(pages), "readyReplicas": ready,
            "conditions": [ready_condition(site, *condition)]}


def ready_condition(site: Obj, value: str, reason: str, message: str) -> Obj:
    """The Ready condition, its lastTransitionTime kept while its status stays the same (so
    an unchanged site's status is unchanged, and not written again)."""
    before = next((c for c in (site.get("status") or {}).get("conditions") or []
                   if c.get("type") == "Ready"), {})
    since = before.get("lastTransitionTime") if before.get("status") == value else None
    return {"type": "Ready", "status": value, "reason": reason, "message": message,
            "lastTransitionTime": since or datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")}


@sites.reconcile
def desired(site: Obj, reads: Reads) -> Desired:
    pages = pages_of(site)
    return Desired(children=children(site, pages),
                   status=lambda outcome: status(site, pages, reads, outcome))
