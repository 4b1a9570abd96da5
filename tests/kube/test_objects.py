"""Pure helpers over Kubernetes objects."""

import pytest

from eventop.kube import label_selector_string, owner_reference, selector_matches, set_condition


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


def test_label_value_keeps_valid_values_and_shortens_long_ones_without_collisions():
    from eventop.kube.objects import LABEL_VALUE, label_value, standard_labels

    assert label_value("my-rule.v2") == "my-rule.v2"
    long_a, long_b = "a" * 100 + ".x", "a" * 100 + ".y"
    for value in (label_value(long_a), label_value(long_a, prefix_chars=55, hash_chars=6)):
        assert len(value) <= 63 and LABEL_VALUE.match(value) and value.startswith("aaaa")
    assert label_value(long_a) != label_value(long_b)
    assert standard_labels("n", long_a, "c")["app.kubernetes.io/instance"] == label_value(long_a)


def test_get_condition_finds_by_type_and_is_none_when_absent():
    from eventop.kube.objects import get_condition

    conditions = set_condition(None, "Ready", True, "Ok", "", "t1")
    conditions = set_condition(conditions, "Degraded", False, "Fine", "", "t1")
    assert get_condition({"conditions": conditions}, "Degraded")["reason"] == "Fine"
    assert get_condition({"conditions": conditions}, "Stalled") is None
    assert get_condition(None, "Ready") is None


def test_a_namespace_of_the_wrong_shape_is_not_terminating_and_no_crash() -> None:
    """An event body with ``status: 0`` crashed a mapping into a 500 (the hostile-input
    property test found it); it reads as not terminating, as Kubernetes would not send it."""
    from eventop.kube.objects import is_terminating

    for shape in (0, None, "x", {"status": 0}, {"metadata": []}, {"status": {"phase": 1}}):
        assert not is_terminating(shape)  # type: ignore[arg-type]
    assert is_terminating({"status": {"phase": "Terminating"}})
    assert is_terminating({"metadata": {"deletionTimestamp": "2026-11-29T07:00:00Z"}})
