"""The engine's writes against the local API server (eventop.engine.apiserver.KubeWriter)."""

from __future__ import annotations

from typing import Any

import pytest

from eventop.engine.apiserver import Echoes, KubeWriter
from eventop.kube import Kube, NotFound
from eventop.kube.informer import Cache


def test_removing_a_finalizer_from_a_parent_already_gone_is_done_not_a_failure(
        kube: Kube) -> None:
    """A run that read its parent from a cache that had not yet seen an earlier run remove
    the last finalizer (and the API server delete the parent) finds it gone: done."""
    parent: Any = kube.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
        "name": "held", "namespace": "default", "finalizers": ["eventop.dev/test"]}})
    writer = KubeWriter(kube, Cache(kube, []), Echoes())
    current = writer.set_finalizer(parent, "eventop.dev/test", False)
    kube.delete("v1", "ConfigMap", "held", "default")
    assert kube.get_or_none("v1", "ConfigMap", "held", "default") is None
    assert writer.set_finalizer(parent, "eventop.dev/test", False) is parent
    assert current["metadata"].get("finalizers") is None
    with pytest.raises(NotFound):  # adding one to a parent that is gone is no success
        writer.set_finalizer(parent, "eventop.dev/test", True)
