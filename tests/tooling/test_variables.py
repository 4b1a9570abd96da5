"""Every EVENTOP_* variable is known to the check that refuses misspelt ones."""

from __future__ import annotations

import re
from pathlib import Path

from eventop import variables
from tests.tooling import REPO, tracked_files

NAME = re.compile(r"\bEVENTOP_[A-Z0-9_]*[A-Z0-9]\b")


def _named_in(paths: list[Path]) -> dict[str, str]:
    found: dict[str, str] = {}
    for path in paths:
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        for name in NAME.findall(text):
            found.setdefault(name, str(path.relative_to(REPO)))
    return found


def _tracked() -> list[Path]:
    return [p for p in tracked_files() if p != REPO / "eventop" / "variables.py"]


def test_every_variable_the_code_docs_and_manifests_name_is_known_to_the_check() -> None:
    """A variable added to a command but not to eventop.variables would make that command
    refuse to start when the variable is set: this catches it first. (Tests may name
    misspelt variables on purpose, so they are not read.)"""
    named = _named_in([p for p in _tracked() if p.relative_to(REPO).parts[0] != "tests"])
    assert {n: where for n, where in named.items() if n not in variables.KNOWN} == {}


def test_every_known_variable_is_read_somewhere() -> None:
    named = _named_in(_tracked())
    assert sorted(variables.KNOWN - set(named)) == []


def test_a_misspelt_variable_is_named_with_the_closest_one_eventop_reads() -> None:
    env = {"EVENTOP_ROUTR_TOKEN": "s3cret", "EVENTOP_LOG_LEVEL": "debug", "HOME": "/root"}
    assert variables.unknown(env) == ["EVENTOP_ROUTR_TOKEN"]
    assert "EVENTOP_ROUTR_TOKEN (did you mean EVENTOP_ROUTER_TOKEN?)" in variables.describe(
        ["EVENTOP_ROUTR_TOKEN"])
    assert "(did you mean" not in variables.describe(["EVENTOP_SOMETHING_ELSE_ENTIRELY"])


def test_the_service_link_variables_kubernetes_sets_for_a_service_are_not_misspellings() -> None:
    """A Service named eventop-router in the pod's namespace: the kubelet adds these."""
    links = {"EVENTOP_ROUTER_SERVICE_HOST": "10.96.0.7", "EVENTOP_ROUTER_SERVICE_PORT": "80",
             "EVENTOP_ROUTER_SERVICE_PORT_HTTP": "80", "EVENTOP_ROUTER_PORT": "tcp://10.96.0.7:80",
             "EVENTOP_ROUTER_PORT_80_TCP": "tcp://10.96.0.7:80",
             "EVENTOP_ROUTER_PORT_80_TCP_PROTO": "tcp", "EVENTOP_ROUTER_PORT_80_TCP_PORT": "80",
             "EVENTOP_ROUTER_PORT_80_TCP_ADDR": "10.96.0.7"}
    assert variables.unknown(links) == []
    # ...but only with the SERVICE_HOST that always comes with them
    assert variables.unknown({"EVENTOP_ROUTR_PORT": "80"}) == ["EVENTOP_ROUTR_PORT"]
    assert variables.unknown({**links, "EVENTOP_ROUTR_PORT": "80"}) == ["EVENTOP_ROUTR_PORT"]
