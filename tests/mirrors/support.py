"""Helpers shared by the RegistryMirror tests."""

from __future__ import annotations

from typing import Any

Obj = dict[str, Any]


def container(workload: Obj) -> Obj:
    """The one container of a StatefulSet's or DaemonSet's pod template."""
    (c,) = workload["spec"]["template"]["spec"]["containers"]
    return c


def env_of(workload: Obj) -> dict[str, Obj]:
    """The container's environment, by variable name."""
    return {e["name"]: e for e in container(workload)["env"]}
