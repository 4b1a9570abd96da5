"""Pure helpers over Kubernetes objects."""

import pytest

from kube import label_selector_string, owner_reference, selector_matches, set_condition


def test_label_selector_string_renders_match_labels_and_expressions():
    sel = {"matchLabels": {"b": "2", "a": "1"},
           "matchExpressions": [{"key": "tier", "operator": "In", "values": ["x", "y"]},
                                {"key": "skip", "operator": "DoesNotExist"}]}
    assert label_selector_string(sel) == "a=1,b=2,tier in (x,y),!skip"


def test_selector_matches_evaluates_every_operator():
    sel = {"matchLabels": {"a": "1"},
           "matchExpressions": [{"key": "t", "operator": "NotIn", "values": ["bad"]},
                                {"key": "e", "operator": "Exists"}]}
    assert selector_matches(sel, {"a": "1", "e": ""})
    assert not selector_matches(sel, {"a": "1", "e": "", "t": "bad"})
    assert not selector_matches(sel, {"a": "1"})
    assert selector_matches(None, {})


def test_unknown_selector_operator_is_an_error():
    with pytest.raises(ValueError, match="Maybe"):
        selector_matches({"matchExpressions": [{"key": "k", "operator": "Maybe"}]}, {})


def test_condition_transition_time_moves_only_when_status_changes():
    c1 = set_condition(None, "Ready", True, "Ok", "", "t1")
    c2 = set_condition(c1, "Ready", True, "Ok", "again", "t2")
    c3 = set_condition(c2, "Ready", False, "Broken", "x", "t3")
    assert c2[0]["lastTransitionTime"] == "t1"
    assert c3[0]["lastTransitionTime"] == "t3"


def test_owner_reference_points_at_owner_uid_as_controller():
    ref = owner_reference({"apiVersion": "eventop.dev/v1", "kind": "CopyRule",
                           "metadata": {"name": "r", "uid": "u1"}})
    assert ref == {"apiVersion": "eventop.dev/v1", "kind": "CopyRule", "name": "r",
                   "uid": "u1", "controller": True, "blockOwnerDeletion": True}
