"""A binary-mode CloudEvent is read the same with or without the CloudEvents SDK.

The router reads the common binary-mode event itself (``_plain_binary``) and leaves
everything else to the SDK. Whatever it reads itself must come out exactly as the SDK's
path would have it, refusals included: these tests parse each event both ways.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eventop.router import parse

KUBE_DATA = {"apiVersion": "v1", "kind": "Namespace",
             "metadata": {"name": "team-a", "uid": "u1", "resourceVersion": "7"}}


def _headers(**overrides: str | None) -> dict[str, str]:
    headers: dict[str, str | None] = {
        "ce-specversion": "1.0", "ce-id": "u1/7/add",
        "ce-source": "https://10.96.0.1:443",
        "ce-type": "dev.knative.apiserver.resource.add",
        "ce-subject": "/apis/v1/namespaces//namespaces/team-a",
        "ce-time": "2026-11-24T06:53:03.845Z",
        "ce-kind": "Namespace", "ce-name": "team-a", "ce-namespace": "",
        "ce-apiversion": "v1", "content-type": "application/json"}
    headers.update(overrides)
    return {k: v for k, v in headers.items() if v is not None}


def _both(headers: dict[str, str], body: bytes,
          monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any]:
    def outcome() -> Any:
        try:
            event = parse.parse_lowered(dict(headers), body)
        except parse.BadEvent as exc:
            return ("refused", exc.status)
        # Without a time attribute, the event gets the time it was read: not comparable.
        time = event.time if "ce-time" in headers else event.time is not None
        return ("event", event.id, event.type, event.source, event.subject, time,
                event.extensions, event.data)

    fast = outcome()
    with monkeypatch.context() as m:
        m.setattr(parse, "_plain_binary", lambda _h, _b: None)
        sdk = outcome()
    return fast, sdk


CASES = {
    "a watcher's event": (_headers(), KUBE_DATA),
    "a time with an offset": (_headers(**{"ce-time": "2026-11-24T07:53:03+01:00"}), KUBE_DATA),
    "a time without a zone": (_headers(**{"ce-time": "2026-11-24T06:53:03"}), KUBE_DATA),
    "a date alone as time": (_headers(**{"ce-time": "2026-11-24"}), KUBE_DATA),
    "a time that is no time": (_headers(**{"ce-time": "yesterday"}), KUBE_DATA),
    "no time": (_headers(**{"ce-time": None}), KUBE_DATA),
    "a percent-encoded value": (_headers(**{"ce-name": "team%20a"}), KUBE_DATA),
    "an upper-case extension": (_headers(**{"ce-Kind2": "x"}), KUBE_DATA),
    "an extension with a dash": (_headers(**{"ce-my-ext": "x"}), KUBE_DATA),
    "no content type": (_headers(**{"content-type": None}), KUBE_DATA),
    "a text content type": (_headers(**{"content-type": "text/plain"}), "hello"),
    "a JSON array": (_headers(), [1, 2]),
    "a refresh event": (_headers(**{"ce-type": "dev.eventop.exchangerates.refresh",
                                    "ce-subject": None}), {}),
    "a ref-mode event": (_headers(**{"ce-type": "dev.knative.apiserver.ref.add"}),
                         {"kind": "Namespace", "name": "team-a", "apiVersion": "v1"}),
    "a kube event without metadata": (_headers(), {"kind": "Namespace"}),
    "a dataschema": (_headers(**{"ce-dataschema": "https://example.com/s.json"}), KUBE_DATA),
}


@pytest.mark.parametrize("name", list(CASES))
def test_the_routers_own_reading_matches_the_sdks(name: str,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    headers, data = CASES[name]
    body = data.encode() if isinstance(data, str) else json.dumps(data).encode()
    fast, sdk = _both(headers, body, monkeypatch)
    assert fast == sdk


def test_a_body_that_is_not_json_is_refused_as_by_the_sdk(
        monkeypatch: pytest.MonkeyPatch) -> None:
    fast, sdk = _both(_headers(), b"{not json", monkeypatch)
    assert fast == sdk == ("refused", 400)


header_values = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=30)


@settings(max_examples=200, deadline=None)
@given(time=header_values, extension=st.from_regex(r"[a-zA-Z0-9-]{1,8}", fullmatch=True),
       value=header_values, content_type=st.sampled_from(
           ["application/json", "application/json; charset=utf-8", "text/json",
            "application/vnd.x+json", ""]))
def test_any_header_values_read_alike_both_ways(time: str, extension: str, value: str,
                                                content_type: str) -> None:
    headers = _headers(**{"ce-time": time, f"ce-{extension.lower()}": value,
                          "content-type": content_type})
    body = json.dumps(KUBE_DATA).encode()
    with pytest.MonkeyPatch.context() as monkeypatch:
        fast, sdk = _both(headers, body, monkeypatch)
    assert fast == sdk
