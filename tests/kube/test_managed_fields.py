"""The JSON patch that hands a manager's create/update fields to its apply entry."""

from __future__ import annotations

from typing import Any

from eventop.kube.managed_fields import upgrade_patch


def entry(manager: str, operation: str, fields: dict[str, Any], **extra: str) -> dict[str, Any]:
    return {"manager": manager, "operation": operation, "apiVersion": "v1",
            "fieldsType": "FieldsV1", "fieldsV1": fields, **extra}


def test_an_update_entry_alone_becomes_the_apply_entry() -> None:
    managed = [entry("kubectl", "Update", {"f:data": {"f:x": {}}}),
               entry("me", "Update", {"f:data": {"f:a": {}}})]
    assert upgrade_patch(managed, "me") == [
        {"op": "test", "path": "/metadata/managedFields/1/manager", "value": "me"},
        {"op": "test", "path": "/metadata/managedFields/1/operation", "value": "Update"},
        {"op": "replace", "path": "/metadata/managedFields/1/operation", "value": "Apply"},
        {"op": "replace", "path": "/metadata/managedFields/1/fieldsV1",
         "value": {"f:data": {"f:a": {}}}}]


def test_update_fields_join_the_existing_apply_entry_and_the_update_entry_goes() -> None:
    managed = [entry("me", "Apply", {"f:data": {"f:a": {}}}),
               entry("me", "Update", {"f:data": {"f:b": {}}, "f:metadata": {"f:labels": {}}}),
               entry("me", "Update", {"f:status": {}}, subresource="status")]
    ops = upgrade_patch(managed, "me")
    assert ops is not None
    assert {"op": "replace", "path": "/metadata/managedFields/0/fieldsV1",
            "value": {"f:data": {"f:a": {}, "f:b": {}}, "f:metadata": {"f:labels": {}}}} in ops
    assert ops[-1] == {"op": "remove", "path": "/metadata/managedFields/1"}
    assert not any(op["path"].startswith("/metadata/managedFields/2") for op in ops)


def test_nothing_to_hand_over_is_no_patch() -> None:
    assert upgrade_patch([entry("me", "Apply", {}), entry("other", "Update", {})], "me") is None
    assert upgrade_patch([entry("me", "Update", {}, subresource="status")], "me") is None
