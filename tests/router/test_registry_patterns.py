"""Which event types an ``@on`` pattern matches: shell-style, as ``fnmatch.fnmatchcase`` says.

The registry compiles a registration's patterns once (it is asked for every event the router
receives); what they match must stay what each pattern matches on its own.
"""

from __future__ import annotations

import fnmatch

from hypothesis import given, settings
from hypothesis import strategies as st

from eventop.handlers.events import Event
from eventop.handlers.registry import Registry

ALPHABET = "ab.*?[]!-\n"


@settings(max_examples=300, deadline=None)
@given(patterns=st.lists(st.text(ALPHABET, min_size=1, max_size=6), min_size=1, max_size=3),
       type_=st.text("ab.-\n", max_size=6))
def test_an_event_type_matches_as_fnmatch_matches_any_of_the_patterns(
        patterns: list[str], type_: str) -> None:
    registry = Registry()
    registry.on(*patterns)(lambda event, kube: None)
    wanted = bool(registry.matching(Event(id="1", type=type_, source="test")))
    assert wanted == any(fnmatch.fnmatchcase(type_, p) for p in patterns)


def test_a_kube_pattern_matches_every_change_and_nothing_else() -> None:
    registry = Registry()
    registry.on("dev.knative.apiserver.resource.*")(lambda event, kube: None)
    for change in ("add", "update", "delete"):
        assert registry.matching(Event(id="1", type=f"dev.knative.apiserver.resource.{change}",
                                       source="test",
                                       data={"apiVersion": "v1", "kind": "ConfigMap",
                                             "metadata": {"name": "a"}}))
    assert not registry.matching(Event(id="1", type="dev.knative.apiserver.ref.add",
                                       source="test"))
