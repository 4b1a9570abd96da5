"""A binary-mode CloudEvent is read the same with or without the CloudEvents SDK.

The router reads the common binary-mode event itself, from the lowered headers
(``_plain_binary``) or straight from the WSGI environ (``_plain_environ``, what a request
takes), and leaves everything else to the SDK. Whatever it reads itself must come out
exactly as the SDK's path would have it, refusals included: these tests parse each event
every way.
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
        "ce-kind": "Namespace", "ce-name": "team-a",
        "ce-apiversion": "v1", "content-type": "application/json"}
    headers.update(overrides)
    return {k: v for k, v in headers.items() if v is not None}


def _environ(headers: dict[str, str]) -> dict[str, Any]:
    """The WSGI environ a server makes of these headers (``ce-my-ext``: ``HTTP_CE_MY_EXT``),
    with the keys of a request around them."""
    environ: dict[str, Any] = {"REQUEST_METHOD": "POST", "PATH_INFO": "/", "QUERY_STRING": "",
                               "SERVER_PROTOCOL": "HTTP/1.1", "HTTP_HOST": "router:8080",
                               "HTTP_ACCEPT_ENCODING": "identity", "wsgi.url_scheme": "http"}
    for name, value in headers.items():
        if name == "content-type":
            environ["CONTENT_TYPE"] = value
        else:
            environ["HTTP_" + name.upper().replace("-", "_")] = value
    return environ


def _both(headers: dict[str, str], body: bytes,
          monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any]:
    """The event read the router's ways (checked to agree) and the SDK's way."""
    def outcome(parse_it: Any) -> Any:
        try:
            event = parse_it()
        except parse.BadEvent as exc:
            return ("refused", exc.status)
        # Without a time attribute, the event gets the time it was read: not comparable.
        time = event.time if "ce-time" in headers else event.time is not None
        return ("event", event.id, event.type, event.source, event.subject, time,
                event.extensions, event.data)

    environ = _environ(headers)
    lowered = parse.headers_from_environ(environ)
    fast = outcome(lambda: parse.parse_lowered(dict(headers), body))
    from_environ = outcome(lambda: parse.parse_environ(environ, body))
    with monkeypatch.context() as m:
        m.setattr(parse, "_plain_binary", lambda _h, _b: None)
        m.setattr(parse, "_plain_environ", lambda _e, _b: None)
        sdk = outcome(lambda: parse.parse_lowered(dict(headers), body))
        assert outcome(lambda: parse.parse_environ(environ, body)) == outcome(
            lambda: parse.parse_lowered(lowered, body)), "the SDK reads the environ alike"
    assert from_environ == outcome(lambda: parse.parse_lowered(lowered, body)), (
        "the environ is read as its lowered headers are")
    return fast, sdk


CASES = {
    "a watcher's event": (_headers(), KUBE_DATA),
    "an empty attribute": (_headers(**{"ce-namespace": ""}), KUBE_DATA),
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
    "no id": (_headers(**{"ce-id": None}), KUBE_DATA),
    "a blank source": (_headers(**{"ce-source": "  "}), KUBE_DATA),
    "another specversion": (_headers(**{"ce-specversion": "0.3"}), KUBE_DATA),
}


def test_a_watchers_event_is_read_without_the_sdk() -> None:
    """So the comparisons here compare two readings (a cluster-scoped object's event has no
    ce-namespace; an empty attribute would go the SDK's way)."""
    headers, body = _headers(), json.dumps(KUBE_DATA).encode()
    assert parse._plain_binary(headers, body) is not None
    assert parse._plain_environ(_environ(headers), body) is not None


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
