"""Admission of PersistentVolumeClaim updates, as the real server answers them.

A claim's spec is immutable after creation except ``resources.requests`` of a bound claim,
which may only grow; a refused change is answered with the go-cmp diff the real server
prints (``tests/recordings/errors/apply-422-pvc-resize-unbound.json``), so a test reads the
same text as on a cluster.
"""

from __future__ import annotations

import json
import re
from typing import Any

from eventop.localkube.errors import cause

Obj = dict[str, Any]


def _q(value: Any) -> str:
    return json.dumps(value)


_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}


def parse_quantity(text: Any) -> float:
    """Bytes in a quantity such as ``10Gi``, ``500M``, ``1e3`` (0 if unparsable)."""
    m = re.fullmatch(r"([0-9.]+)([a-zA-Z]*)", str(text).strip())
    if not m:
        return 0.0
    number, suffix = float(m.group(1)), m.group(2)
    if suffix in _BINARY:
        return number * _BINARY[suffix]
    if suffix in _DECIMAL:
        return number * 10 ** _DECIMAL[suffix]
    return 0.0


def _go_quantity(text: str) -> str:
    m = re.fullmatch(r"([0-9]+)([a-zA-Z]*)", text.strip())
    if m and m.group(2) in _BINARY:
        value = int(m.group(1)) * _BINARY[m.group(2)]
        return (f"{{i: resource.int64Amount{{value: {value}}}, s: {_q(text)}, "
                f'Format: "BinarySI"}}')
    if m and m.group(2) in _DECIMAL:
        scale = _DECIMAL[m.group(2)]
        amount = f"value: {int(m.group(1))}" + (f", scale: {scale}" if scale else "")
        return f'{{i: resource.int64Amount{{{amount}}}, s: {_q(text)}, Format: "DecimalSI"}}'
    return f'{{s: {_q(text)}}}'


def _go_resource_list(prefix: str, indent: str, name: str, values: Obj | None) -> list[str]:
    if not values:
        return [f"{prefix}{indent}{name}: nil,"]
    lines = [f"{prefix}{indent}{name}: core.ResourceList{{"]
    for key in sorted(values):
        lines.append(f"{prefix}{indent}\ts{_q(key)}: {_go_quantity(str(values[key]))},")
    lines.append(f"{prefix}{indent}}},")
    return lines


def _pvc_diff(old: Obj, new: Obj) -> str:
    """The go-cmp rendering the real server prints for a refused PVC spec change.

    Exact for the common case (only ``resources.requests`` changed), approximate otherwise.
    """
    modes = old.get("accessModes")
    modes_text = "{" + ", ".join(_q(m) for m in modes) + "}" if modes else "nil"
    sel = "nil" if not old.get("selector") else "&v1.LabelSelector{...}"
    sc = old.get("storageClassName")
    res_old, res_new = old.get("resources") or {}, new.get("resources") or {}
    lines = ["  core.PersistentVolumeClaimSpec{",
             f"  \tAccessModes: {modes_text},",
             f"  \tSelector:    {sel},",
             "  \tResources: core.ResourceRequirements{"]
    lines += _go_resource_list("  ", "\t\t", "Limits", res_old.get("limits"))
    if res_old.get("requests") != res_new.get("requests"):
        lines += _go_resource_list("- ", "\t\t", "Requests", res_old.get("requests"))
        lines += _go_resource_list("+ ", "\t\t", "Requests", res_new.get("requests"))
    else:
        lines += _go_resource_list("  ", "\t\t", "Requests", res_old.get("requests"))
    lines += ["  \t},",
              f"  \tVolumeName:       {_q(old.get('volumeName', ''))},",
              f"  \tStorageClassName: {'nil' if sc is None else '&' + _q(sc)},",
              "  \t... // 3 identical fields",
              "  }", ""]
    # go-cmp marks its report with non-breaking spaces so it cannot be mistaken for code.
    return "\n".join(_nbsp(line) for line in lines)


def _nbsp(line: str) -> str:
    return line[0].replace(" ", "\xa0") + "\xa0" + line[2:] if len(line) >= 2 else line


def pvc_update(old: Obj, new: Obj) -> list[Obj]:
    old_spec, new_spec = old.get("spec") or {}, new.get("spec") or {}
    bound = (old.get("status") or {}).get("phase") == "Bound"

    def without_requests(spec: Obj) -> Obj:
        out = json.loads(json.dumps(spec))
        (out.get("resources") or {}).pop("requests", None)
        if bound:
            out.pop("volumeName", None)
        return out

    if old_spec == new_spec:
        return []
    if not bound or without_requests(old_spec) != without_requests(new_spec):
        message = ("Forbidden: spec is immutable after creation except resources.requests "
                   "for bound claims\n" + _pvc_diff(old_spec, new_spec))
        return [cause("FieldValueForbidden", "spec", message)]
    old_size = ((old_spec.get("resources") or {}).get("requests") or {}).get("storage")
    new_size = ((new_spec.get("resources") or {}).get("requests") or {}).get("storage")
    if parse_quantity(new_size) < parse_quantity(old_size):
        return [cause("FieldValueForbidden", "spec.resources.requests.storage",
                      "Forbidden: field can not be less than previous value")]
    return []
