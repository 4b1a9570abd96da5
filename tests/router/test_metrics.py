"""The router's Prometheus metrics (``router/metrics.py``): events counted by type, kind and
outcome, handlers timed, and series bounded whatever a sender invents."""

from __future__ import annotations

import pytest
from flask.testing import FlaskClient

from tests.router.support import (
    HANDLERS,
    binary,
    ce_headers,
    configmap,
    kube_event,
    metric,
    post,
)

# -- counting events ---------------------------------------------------------------------------

def test_malformed_event_is_counted_without_its_sender_chosen_type(client: FlaskClient) -> None:
    before = metric("eventop_events_total", type="", kind="", outcome="invalid")
    client.post("/", headers=ce_headers(ce_source=None, ce_type="attacker.chosen"), data=b"{}")
    assert metric("eventop_events_total", type="", kind="", outcome="invalid") == before + 1
    assert metric("eventop_events_total", type="attacker.chosen", kind="",
                  outcome="invalid") == 0



def test_metrics_count_events_by_type_kind_outcome_and_time_handlers(
        client: FlaskClient) -> None:
    labels = {"type": "dev.knative.apiserver.resource.add", "kind": "ConfigMap",
              "outcome": "ok"}
    handler = f"{HANDLERS}.configmaps"
    before = metric("eventop_events_total", **labels)
    before_h = metric("eventop_handler_duration_seconds_count", handler=handler)
    for i in range(3):
        post(client, binary(kube_event("add", configmap(uid=f"m{i}"))))
    text = client.get("/metrics").get_data(as_text=True)
    assert metric("eventop_events_total", **labels) == before + 3
    assert metric("eventop_handler_duration_seconds_count", handler=handler) == before_h + 3
    assert ('eventop_events_total{kind="ConfigMap",outcome="ok",'
            'type="dev.knative.apiserver.resource.add"}') in text
    assert f'eventop_handler_duration_seconds_bucket{{handler="{handler}",le="0.001"}}' in text
    assert "# TYPE eventop_kube_requests_total counter" in text



def test_event_metric_series_are_bounded_whatever_types_a_sender_invents(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from eventop.router import metrics

    monkeypatch.setattr(metrics, "MAX_EVENT_SERIES", 2)
    monkeypatch.setattr(metrics, "_series", set())
    metrics.event_counter.cache_clear()
    try:
        for i in range(5):
            metrics.event_counter(f"com.example.invented.{i}", "Thing", "ignored").inc()
        text = metrics.render()[0].decode()
        assert 'type="com.example.invented.0"' in text
        assert 'type="com.example.invented.1"' in text
        assert 'type="com.example.invented.2"' not in text
        assert 'eventop_events_total{kind="other",outcome="ignored",type="other"} 3.0' in text
    finally:
        metrics.event_counter.cache_clear()
