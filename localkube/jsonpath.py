"""The JSONPath subset of CRD printer columns: ``.a.b``, ``['a.b']``, ``[0]``, ``[*]`` and
filters ``[?(@.type=="Ready")]``.

The real server accepts any kubectl JSONPath in ``additionalPrinterColumns`` but only uses
the first value found; these forms cover what CRDs write in practice. A path outside the
subset finds nothing (an empty cell), as a path that matches nothing does on a real server.
"""

from __future__ import annotations

import json
import re
from typing import Any

_STEP = re.compile(r"""\.([A-Za-z0-9_\-]+)           # .name
                     |\[['"]([^'"]+)['"]\]         # ['name']
                     |\[(-?\d+)\]                  # [0]
                     |\[\*\]                       # [*]
                     |\[\?\(@((?:\.[A-Za-z0-9_\-]+)+)\s*(==|!=)\s*(?:"([^"]*)"|'([^']*)'|(-?[\d.]+|true|false))\)\]
                     """, re.VERBOSE)


def find(obj: Any, path: str) -> list[Any]:
    """Every value ``path`` selects in ``obj`` (``{.spec.x}`` braces allowed)."""
    path = path.strip()
    if path.startswith("{") and path.endswith("}"):
        path = path[1:-1]
    values = [obj]
    pos = 0
    while pos < len(path):
        m = _STEP.match(path, pos)
        if m is None:
            return []
        pos = m.end()
        values = [v for cur in values for v in _step(cur, m)]
    return values


def _step(cur: Any, m: re.Match[str]) -> list[Any]:
    name = m.group(1) or m.group(2)
    if name is not None:
        return [cur[name]] if isinstance(cur, dict) and name in cur else []
    if m.group(3) is not None:
        index = int(m.group(3))
        return [cur[index]] if isinstance(cur, list) and -len(cur) <= index < len(cur) else []
    if m.group(4) is None:  # [*]
        if isinstance(cur, list):
            return list(cur)
        return list(cur.values()) if isinstance(cur, dict) else []
    if not isinstance(cur, list):
        return []
    keys = m.group(4).split(".")[1:]
    wanted: Any = m.group(6) if m.group(6) is not None else m.group(7)
    if wanted is None:
        wanted = json.loads(m.group(8))
    out = []
    for item in cur:
        value: Any = item
        for key in keys:
            value = value.get(key) if isinstance(value, dict) else None
        if (value == wanted) == (m.group(5) == "=="):
            out.append(item)
    return out
