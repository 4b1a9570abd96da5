"""``as=Table``: the rows ``kubectl get`` prints, computed by the server as the real one does.

Built-in kinds get the columns of kube-apiserver's printers (``printer_columns.py``, copied
from recorded Tables) with cells computed the same way; custom resources get ``Name``, then
their CRD's ``additionalPrinterColumns`` (JSONPath, typed cells, ``date`` as an age), as
the apiextensions server does. Each row carries the object as ``PartialObjectMetadata``
(``includeObject=Metadata``, the default), whole (``Object``) or not at all (``None``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from eventop.localkube import jsonpath
from eventop.localkube.errors import ApiError
from eventop.localkube.metadata import partial
from eventop.localkube.negotiate import View
from eventop.localkube.printer_columns import COLUMNS
from eventop.localkube.resources import ResourceType

Obj = dict[str, Any]
NAME_DESCRIPTION = COLUMNS["ConfigMap"][0][4]
INCLUDE = ("Metadata", "Object", "None")
ACCESS_MODES = {"ReadWriteOnce": "RWO", "ReadOnlyMany": "ROX", "ReadWriteMany": "RWX",
                "ReadWriteOncePod": "RWOP"}


def table(res: ResourceType, items: list[Obj], list_meta: Obj, view: View,
          include: str = "Metadata", *, headers: bool = True) -> Obj:
    """A Table of ``items`` (one for a GET of one object, a page for a list)."""
    if include not in INCLUDE:
        raise ApiError(400, "BadRequest",
                       f'unable to convert to Table as requested: includeObject "{include}" '
                       "is not one of Metadata, Object or None")
    columns, cells = _columns(res)
    out: Obj = {"kind": "Table", "apiVersion": view.api_version, "metadata": list_meta,
                "columnDefinitions": columns if headers else None, "rows": []}
    for obj in items:
        row: Obj = {"cells": cells(obj)}
        row["object"] = (partial(obj, view.api_version) if include == "Metadata"
                         else obj if include == "Object" else None)
        out["rows"].append(row)
    return out


def _columns(res: ResourceType) -> tuple[list[Obj], Callable[[Obj], list[Any]]]:
    if res.custom:
        printer = res.printer_columns or [
            {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}]
        columns = [_column("Name", "string", "name", 0, NAME_DESCRIPTION)]
        columns += [_column(c["name"], c["type"], c.get("format", ""), c.get("priority", 0),
                            c.get("description") or "Custom resource definition column (in "
                            f"JSONPath format): {c['jsonPath']}") for c in printer]
        return columns, lambda obj: [_meta(obj).get("name", ""),
                                     *(_custom_cell(obj, c) for c in printer)]
    defs = COLUMNS.get(res.kind)
    if defs is None:  # a kind without a printer: the real default is Name and Created At
        return ([_column("Name", "string", "name", 0, NAME_DESCRIPTION),
                 _column("Created At", "date", "", 0, "")],
                lambda obj: [_meta(obj).get("name", ""), _meta(obj).get("creationTimestamp")])
    return [_column(*d) for d in defs], CELLS[res.kind]


def _column(name: str, ctype: str, fmt: str, priority: int, description: str) -> Obj:
    return {"name": name, "type": ctype, "format": fmt, "description": description,
            "priority": priority}


def _custom_cell(obj: Obj, column: Obj) -> Any:
    found = jsonpath.find(obj, column["jsonPath"])
    if not found:
        return None
    value, ctype = found[0], column["type"]
    if value is None:
        return None
    if ctype == "string":
        if isinstance(value, bool):
            return "true" if value else "false"
        return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
    if ctype == "integer" and isinstance(value, int | float) and not isinstance(value, bool):
        return int(value)
    if ctype == "number" and isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if ctype == "boolean" and isinstance(value, bool):
        return value
    if ctype == "date" and isinstance(value, str):
        return age(value) if _parse_time(value) else "<invalid>"
    return None


# -- built-in printers (pkg/printers/internalversion in kube-apiserver) ------------------


def _meta(obj: Obj) -> Obj:
    return obj.get("metadata") or {}


def _spec(obj: Obj) -> Obj:
    return obj.get("spec") or {}


def _status(obj: Obj) -> Obj:
    return obj.get("status") or {}


def _parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        return datetime.strptime(value[:19], "%Y-%m-%dT%H:%M:%S").replace(tzinfo=UTC)
    except ValueError:
        return None


def age(timestamp: str | None) -> str:
    """``translateTimestampSince``: "<unknown>" when unset, else a human duration."""
    when = _parse_time(timestamp)
    if when is None:
        return "<unknown>"
    return human_duration((datetime.now(UTC) - when).total_seconds())


def human_duration(seconds: float) -> str:
    """apimachinery's ``duration.HumanDuration`` (2m59s, 15m, 5h30m, 3d4h, 2y30d)."""
    s = int(seconds)
    if s < -1:
        return "<invalid>"
    if s < 0:
        return "0s"
    if s < 120:
        return f"{s}s"
    minutes = s // 60
    if minutes < 10:
        return f"{minutes}m{s % 60}s" if s % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    hours = minutes // 60
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        return f"{hours // 24}d{hours % 24}h" if hours % 24 else f"{hours // 24}d"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        days = (hours // 24) % 365
        return f"{hours // 24 // 365}y{days}d" if days else f"{hours // 24 // 365}y"
    return f"{hours // 24 // 365}y"


def format_labels(labels: Obj | None) -> str:
    if not labels:
        return "<none>"
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def format_selector(selector: Obj | None) -> str:
    """metav1.FormatLabelSelector."""
    if not selector:
        return "<none>"
    parts = [f"{k}={v}" for k, v in sorted((selector.get("matchLabels") or {}).items())]
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
        if op == "In":
            parts.append(f"{key} in ({','.join(values)})")
        elif op == "NotIn":
            parts.append(f"{key} notin ({','.join(values)})")
        elif op == "Exists":
            parts.append(str(key))
        elif op == "DoesNotExist":
            parts.append(f"!{key}")
    return ",".join(parts) or "<none>"


def _containers(obj: Obj) -> tuple[str, str]:
    containers = ((_spec(obj).get("template") or {}).get("spec") or {}).get("containers") or []
    return (",".join(c.get("name", "") for c in containers),
            ",".join(c.get("image", "") for c in containers))


def _namespace(obj: Obj) -> list[Any]:
    return [_meta(obj).get("name"), _status(obj).get("phase", ""),
            age(_meta(obj).get("creationTimestamp"))]


def _configmap(obj: Obj) -> list[Any]:
    return [_meta(obj).get("name"), len(obj.get("data") or {}) + len(obj.get("binaryData") or {}),
            age(_meta(obj).get("creationTimestamp"))]


def _secret(obj: Obj) -> list[Any]:
    return [_meta(obj).get("name"), obj.get("type", ""), len(obj.get("data") or {}),
            age(_meta(obj).get("creationTimestamp"))]


def _service_account(obj: Obj) -> list[Any]:
    return [_meta(obj).get("name"), len(obj.get("secrets") or []),
            age(_meta(obj).get("creationTimestamp"))]


def _service(obj: Obj) -> list[Any]:
    spec = _spec(obj)
    stype = spec.get("type", "")
    external = ",".join(spec.get("externalIPs") or [])
    if stype == "LoadBalancer":
        ingress = [i.get("ip") or i.get("hostname") for i in
                   ((_status(obj).get("loadBalancer") or {}).get("ingress") or [])]
        external = ",".join([*filter(None, ingress), *(spec.get("externalIPs") or [])]) \
            or "<pending>"
    elif stype == "ExternalName":
        external = spec.get("externalName", "")
    ports = []
    for port in spec.get("ports") or []:
        proto = port.get("protocol", "TCP")
        node = port.get("nodePort")
        ports.append(f"{port.get('port')}:{node}/{proto}" if node
                     else f"{port.get('port')}/{proto}")
    return [_meta(obj).get("name"), stype, spec.get("clusterIP") or "<none>",
            external or "<none>", ",".join(ports) or "<none>",
            age(_meta(obj).get("creationTimestamp")), format_labels(spec.get("selector"))]


def _pvc(obj: Obj) -> list[Any]:
    spec, status, meta = _spec(obj), _status(obj), _meta(obj)
    capacity = modes = ""
    if spec.get("volumeName"):
        modes = ",".join(ACCESS_MODES.get(m, m) for m in status.get("accessModes") or [])
        capacity = (status.get("capacity") or {}).get("storage", "")
    klass = spec.get("storageClassName") or (meta.get("annotations") or {}).get(
        "volume.beta.kubernetes.io/storage-class", "")
    return [meta.get("name"), status.get("phase", ""), spec.get("volumeName", ""), capacity,
            modes, klass, age(meta.get("creationTimestamp")),
            spec.get("volumeMode") or "<unset>"]


def _pod(obj: Obj) -> list[Any]:
    spec, status, meta = _spec(obj), _status(obj), _meta(obj)
    statuses = status.get("containerStatuses") or []
    ready = sum(1 for c in statuses if c.get("ready"))
    restarts = sum(int(c.get("restartCount") or 0) for c in statuses)
    reason = status.get("reason") or status.get("phase") or ""
    for cstatus in statuses:
        state = cstatus.get("state") or {}
        waiting = (state.get("waiting") or {}).get("reason")
        terminated = (state.get("terminated") or {}).get("reason")
        if waiting or terminated:
            reason = waiting or terminated
    if meta.get("deletionTimestamp"):
        reason = "Terminating"
    gates = spec.get("readinessGates") or []
    if gates:
        conditions = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
        passed = sum(1 for g in gates if conditions.get(g.get("conditionType")) == "True")
        gates_cell = f"{passed}/{len(gates)}"
    else:
        gates_cell = "<none>"
    return [meta.get("name"), f"{ready}/{len(spec.get('containers') or [])}", reason,
            str(restarts), age(meta.get("creationTimestamp")), status.get("podIP") or "<none>",
            spec.get("nodeName") or "<none>", status.get("nominatedNodeName") or "<none>",
            gates_cell]


def _event(obj: Obj) -> list[Any]:
    first = age(obj.get("firstTimestamp")) if obj.get("firstTimestamp") \
        else age(obj.get("eventTime"))
    last = age(obj.get("lastTimestamp")) if obj.get("lastTimestamp") else first
    count = obj.get("count") or 0
    series = obj.get("series")
    if series:
        last, count = age(series.get("lastObservedTime")), series.get("count") or 0
    elif not count:
        count = 1
    involved = obj.get("involvedObject") or {}
    kind = str(involved.get("kind", "")).lower()
    target = f"{kind}/{involved['name']}" if involved.get("name") else kind
    source = obj.get("source") or {}
    component = source.get("component") or obj.get("reportingComponent", "")
    host = source.get("host") or obj.get("reportingInstance", "")
    return [last, obj.get("type", ""), obj.get("reason", ""), target,
            involved.get("fieldPath", ""), f"{component}, {host}" if host else component,
            str(obj.get("message", "")).strip(), first, count, _meta(obj).get("name")]


def _deployment(obj: Obj) -> list[Any]:
    spec, status = _spec(obj), _status(obj)
    names, images = _containers(obj)
    return [_meta(obj).get("name"),
            f"{status.get('readyReplicas', 0)}/{spec.get('replicas', 1)}",
            status.get("updatedReplicas", 0), status.get("availableReplicas", 0),
            age(_meta(obj).get("creationTimestamp")), names, images,
            format_selector(spec.get("selector"))]


def _statefulset(obj: Obj) -> list[Any]:
    names, images = _containers(obj)
    return [_meta(obj).get("name"),
            f"{_status(obj).get('readyReplicas', 0)}/{_spec(obj).get('replicas', 1)}",
            age(_meta(obj).get("creationTimestamp")), names, images]


def _daemonset(obj: Obj) -> list[Any]:
    spec, status = _spec(obj), _status(obj)
    names, images = _containers(obj)
    node_selector = ((spec.get("template") or {}).get("spec") or {}).get("nodeSelector")
    return [_meta(obj).get("name"), status.get("desiredNumberScheduled", 0),
            status.get("currentNumberScheduled", 0), status.get("numberReady", 0),
            status.get("updatedNumberScheduled", 0), status.get("numberAvailable", 0),
            format_labels(node_selector), age(_meta(obj).get("creationTimestamp")), names,
            images, format_selector(spec.get("selector"))]


def _job(obj: Obj) -> list[Any]:
    spec, status = _spec(obj), _status(obj)
    succeeded = status.get("succeeded", 0)
    if spec.get("completions") is not None:
        completions = f"{succeeded}/{spec['completions']}"
    else:
        completions = f"{succeeded}/1 of {spec.get('parallelism', 1)}"
    started, finished = _parse_time(status.get("startTime")), _parse_time(
        status.get("completionTime"))
    duration = "" if started is None else human_duration(
        ((finished or datetime.now(UTC)) - started).total_seconds())
    names, images = _containers(obj)
    return [_meta(obj).get("name"), completions, duration,
            age(_meta(obj).get("creationTimestamp")), names, images,
            format_selector(spec.get("selector"))]


def _cronjob(obj: Obj) -> list[Any]:
    spec, status = _spec(obj), _status(obj)
    job_spec = (spec.get("jobTemplate") or {}).get("spec") or {}
    names, images = _containers({"spec": job_spec})
    suspend = spec.get("suspend")
    last = status.get("lastScheduleTime")
    return [_meta(obj).get("name"), spec.get("schedule", ""),
            "<unset>" if suspend is None else str(bool(suspend)),
            len(status.get("active") or []), age(last) if last else "<none>",
            age(_meta(obj).get("creationTimestamp")), names, images,
            format_selector(job_spec.get("selector"))]


def _lease(obj: Obj) -> list[Any]:
    return [_meta(obj).get("name"), _spec(obj).get("holderIdentity", ""),
            age(_meta(obj).get("creationTimestamp"))]


def _crd(obj: Obj) -> list[Any]:
    return [_meta(obj).get("name"), _meta(obj).get("creationTimestamp")]


CELLS: dict[str, Callable[[Obj], list[Any]]] = {
    "Namespace": _namespace, "ConfigMap": _configmap, "Secret": _secret,
    "ServiceAccount": _service_account, "Service": _service, "PersistentVolumeClaim": _pvc,
    "Pod": _pod, "Event": _event, "Deployment": _deployment, "StatefulSet": _statefulset,
    "DaemonSet": _daemonset, "Job": _job, "CronJob": _cronjob, "Lease": _lease,
    "CustomResourceDefinition": _crd,
}
