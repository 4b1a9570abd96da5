"""Turn an HTTP request into a :class:`eventop.handlers.events.Event`, or say exactly what is wrong.

Parsing uses the CloudEvents SDK (v2 API: ``from_http`` with ``HTTPMessage`` and
``JSONFormat``), but the SDK is lenient where a router must not be:

* its ``CloudEvent`` constructor *fills in* a missing ``id`` (a random UUID) and a missing
  ``specversion``, so a sender that forgot them would get a fresh id on every redelivery;
  we check the required attributes on the wire first;
* in binary mode it silently hands back the body as a string when ``datacontenttype`` says
  JSON but the body is not JSON; we detect that and answer 400;
* a Kubernetes event (``dev.knative.apiserver.*``) whose data is not an object, or whose
  Resource-mode object lacks ``apiVersion``/``kind``/``metadata.name``, cannot be routed by
  kind, so it is rejected here rather than silently ignored.

Every rejection is a :class:`BadEvent` carrying the HTTP status (400 or 415) and a message
that names the attribute or field at fault, so the sender can fix it without reading code.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from cloudevents.core.bindings.http import HTTPMessage, from_http
from cloudevents.core.exceptions import BaseCloudEventException
from cloudevents.core.formats.json import JSONFormat
from cloudevents.core.v1.event import CloudEvent
from dateutil.parser import isoparse

from eventop.events import RESOURCE_PREFIX, is_kube_type
from eventop.handlers.events import Event
from eventop.kube.resources import is_path_segment

REQUIRED = ("id", "source", "type", "specversion")
CORE = frozenset({*REQUIRED, "datacontenttype", "dataschema", "subject", "time"})
SPECVERSION = "1.0"
STRUCTURED = "application/cloudevents+json"
BATCH = "application/cloudevents-batch+json"
_JSON_TYPE = JSONFormat.JSON_CONTENT_TYPE_PATTERN
_EXTENSION = re.compile(r"^[a-z0-9]+$")  # the SDK's (and the spec's) extension names
_FORMAT = JSONFormat()
# Python's JSON parser recurses per level: a body of "[[[[..." would otherwise end in a 500
# (and be retried forever) instead of a 400.
_TOO_DEEP = ("data is JSON nested too deeply to parse; a Kubernetes object or event is never "
             "nested more than a few dozen levels")


class BadEvent(Exception):
    """The request is not an event we can accept. ``status`` is 400 or 415.

    ``known`` holds whatever attributes could be read (id, type), for the log line.
    """

    def __init__(self, status: int, message: str, known: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.known = dict(known or {})


def headers_from_environ(environ: Mapping[str, Any]) -> dict[str, str]:
    """The ``ce-*`` and ``content-type`` headers of a WSGI request, lower-cased.

    Only these matter to the CloudEvents binding; reading them straight from the WSGI
    environ skips building every other header (a measurable share of a router request).
    """
    out = {"ce-" + key[8:].lower().replace("_", "-"): value
           for key, value in environ.items() if key.startswith("HTTP_CE_")}
    content_type = environ.get("CONTENT_TYPE")
    if content_type:
        out["content-type"] = content_type
    return out


def parse_environ(environ: Mapping[str, Any], body: bytes) -> Event:
    """Parse the CloudEvent of a WSGI request (the router's entry).

    The common binary-mode event is read in one pass over the environ
    (:func:`_plain_environ`); anything else goes the way of :func:`parse_lowered`, whose
    answer it is the same as (``tests/router/test_parse_fast_path.py``).
    """
    plain = _plain_environ(environ, body)
    if plain is not None:
        attributes, time, data = plain
        return _event(attributes, time, data,
                      {"id": attributes["id"], "type": attributes["type"]})
    return parse_lowered(headers_from_environ(environ), body)


def parse_lowered(lowered: dict[str, str], body: bytes) -> Event:
    """Parse a binary-mode (``ce-*`` headers) or structured-mode CloudEvent.

    Header names must be lower-case (as :func:`headers_from_environ` gives them). Raises
    :class:`BadEvent` with 415 for a content type that is neither, and 400 for a malformed
    event.
    """
    if any(k.startswith("ce-") for k in lowered):
        return _binary(lowered, body)
    content_type = lowered.get("content-type", "")
    mime = content_type.split(";", 1)[0].strip().lower()
    if mime == STRUCTURED:
        return _structured(lowered, body)
    if mime == BATCH:
        raise BadEvent(415, "batched CloudEvents (application/cloudevents-batch+json) are not "
                            "supported: send one event per request, in binary or structured mode")
    if mime.startswith("application/cloudevents"):
        raise BadEvent(415, f"unsupported CloudEvents format {mime!r}: only JSON "
                            f"({STRUCTURED}) is supported in structured mode")
    shown = f"Content-Type {content_type!r}" if content_type else "no Content-Type"
    raise BadEvent(415, f"not a CloudEvent: {shown} and no ce-* headers; send binary mode "
                        f"(ce-id, ce-source, ce-type, ce-specversion headers) or structured "
                        f"mode (Content-Type: {STRUCTURED})")


def _binary(headers: dict[str, str], body: bytes) -> Event:
    known = {a: headers[f"ce-{a}"] for a in ("id", "type") if headers.get(f"ce-{a}")}
    _check_required([a for a in REQUIRED if not headers.get(f"ce-{a}", "").strip()],
                    headers.get("ce-specversion"), known, in_headers=True)
    plain = _plain_binary(headers, body)
    if plain is not None:
        return _event(plain[0], plain[1], plain[2], known)
    ce = _sdk_parse(headers, body, known, headers.get("ce-time"))
    data = ce.get_data()
    given = ce.get_datacontenttype()
    if isinstance(data, str | bytes) and _JSON_TYPE.match(given or _FORMAT.DEFAULT_CONTENT_TYPE):
        # The SDK falls back to the raw text when JSON parsing fails; only a body that
        # is itself a JSON string is legitimately a str here.
        try:
            data = json.loads(body)
        except RecursionError:
            raise BadEvent(400, _TOO_DEEP, known) from None
        except (ValueError, UnicodeDecodeError) as exc:
            why = (f"datacontenttype is {given!r}" if given
                   else "no Content-Type was given, so JSON is assumed")
            raise BadEvent(400, f"data is not valid JSON ({why}): {exc}", known) from None
    return _to_event(ce, data, known)


def _structured(headers: dict[str, str], body: bytes) -> Event:
    try:
        doc = json.loads(body)
    except RecursionError:
        raise BadEvent(400, _TOO_DEEP) from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadEvent(400, f"structured-mode body is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise BadEvent(400, f"structured-mode body must be a JSON object with the event's "
                            f"attributes, got {type(doc).__name__}")
    known = {a: doc[a] for a in ("id", "type") if isinstance(doc.get(a), str) and doc[a]}
    _check_required([a for a in REQUIRED if doc.get(a) in (None, "")], doc.get("specversion"),
                    known, in_headers=False)
    ce = _sdk_parse(headers, body, known, doc.get("time"))
    data = ce.get_data()
    content_type = ce.get_datacontenttype() or JSONFormat.DEFAULT_CONTENT_TYPE
    if isinstance(data, bytes) and _JSON_TYPE.match(content_type):  # came as data_base64
        try:
            data = json.loads(data)
        except RecursionError:
            raise BadEvent(400, _TOO_DEEP, known) from None
        except (ValueError, UnicodeDecodeError) as exc:
            raise BadEvent(400, f"data_base64 is not valid JSON although datacontenttype is "
                                f"{content_type!r}: {exc}", known) from None
    return _to_event(ce, data, known)


def _check_required(missing: list[str], specversion: Any, known: dict[str, Any], *,
                    in_headers: bool) -> None:
    """Refuse an event lacking a required attribute (the SDK would invent an id) or of
    another CloudEvents version; ``in_headers`` names the binary-mode header to fix."""
    if missing:
        names = ", ".join(f"'{a}' (header ce-{a})" if in_headers else f"'{a}'" for a in missing)
        raise BadEvent(400, f"missing or empty required CloudEvents attribute(s): {names}",
                       known)
    if specversion != SPECVERSION:
        raise BadEvent(400, f"unsupported specversion {specversion!r}: this router accepts "
                            f"CloudEvents {SPECVERSION}", known)


def _sdk_parse(headers: dict[str, str], body: bytes, known: dict[str, Any],
               time: Any) -> CloudEvent:
    try:
        event = from_http(HTTPMessage(headers=headers, body=body), _FORMAT, CloudEvent)
    except BaseCloudEventException as exc:
        raise BadEvent(400, f"invalid CloudEvent: {exc}", known) from None
    except RecursionError:
        raise BadEvent(400, _TOO_DEEP, known) from None
    except (ValueError, TypeError, OverflowError) as exc:
        if time is not None and not _is_timestamp(time):
            raise BadEvent(400, f"attribute 'time' is not an RFC 3339 timestamp: {time!r}",
                           known) from None
        raise BadEvent(400, f"invalid CloudEvent: {exc}", known) from None
    assert isinstance(event, CloudEvent)
    return event


def _is_timestamp(value: Any) -> bool:
    try:
        isoparse(value)
    except (ValueError, TypeError, OverflowError):
        return False
    return True


def _plain_binary(headers: dict[str, str], body: bytes
                  ) -> tuple[dict[str, Any], datetime, Any] | None:
    """The common case without the SDK: every attribute as it stands (no percent-encoding),
    valid extension names, an RFC 3339 time with its offset, a JSON object as data. It checks
    exactly what the SDK's binary-mode parse and CloudEvent validation check; anything else
    (None) goes the SDK's way, which words each refusal. Half the router's own cost per event
    was the SDK's generic path for an event that needs none of it."""
    attributes: dict[str, Any] = {}
    for name, value in headers.items():
        if name.startswith("ce-"):
            attr = name[3:]
            if not _plain_attribute(attr, value):
                return None
            attributes[attr] = value
    return _plain_rest(attributes, headers.get("content-type"), body)


def _plain_environ(environ: Mapping[str, Any], body: bytes
                   ) -> tuple[dict[str, Any], datetime, Any] | None:
    """:func:`_plain_binary` reading the ``ce-*`` headers straight from the WSGI environ
    (``HTTP_CE_<NAME>``), without the lowered copy of the headers; the required attributes
    are checked here, as :func:`_binary` does before its own fast path (a missing one: None,
    and the general path words the refusal)."""
    attributes: dict[str, Any] = {}
    for key, value in environ.items():
        if key.startswith("HTTP_CE_"):
            attr = _ENVIRON_NAMES.get(key)
            if attr is None:
                attr = key[8:].lower()
                if not _plain_name(attr):
                    return None
                if len(_ENVIRON_NAMES) < 256:  # the names senders use; bounded (theirs)
                    _ENVIRON_NAMES[key] = attr
            if not value or "%" in value:
                return None
            attributes[attr] = value
    if attributes.get("specversion") != SPECVERSION:
        return None
    for required in REQUIRED:
        if not attributes.get(required, "").strip():
            return None
    return _plain_rest(attributes, environ.get("CONTENT_TYPE") or None, body)


_ENVIRON_NAMES: dict[str, str] = {}  # HTTP_CE_SPECVERSION -> specversion, once checked


def _plain_attribute(attr: str, value: str) -> bool:
    """A binary-mode attribute the fast path takes as it stands: not empty, no
    percent-encoding to undo, a name :func:`_plain_name` accepts."""
    return bool(value) and "%" not in value and _plain_name(attr)


def _plain_name(attr: str) -> bool:
    """An attribute name the SDK accepts (``my_ext``, from a ``ce-my-ext`` header, is not
    one) and does not treat specially."""
    return attr not in ("data", "datacontenttype") and (
        attr in CORE or _EXTENSION.match(attr) is not None)


def _plain_rest(attributes: dict[str, Any], content_type: str | None, body: bytes
                ) -> tuple[dict[str, Any], datetime, Any] | None:
    """The content type, time and data of a plain binary-mode event (see
    :func:`_plain_binary`)."""
    if content_type is not None:
        if not content_type:
            return None
        attributes["datacontenttype"] = content_type
    if "time" not in attributes:
        return None  # the SDK gives it the time of reading
    try:
        time = datetime.fromisoformat(attributes["time"])
    except ValueError:
        return None
    if time.tzinfo is None:
        return None
    if not body or not _JSON_TYPE.match(content_type or _FORMAT.DEFAULT_CONTENT_TYPE):
        return None
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    return attributes, time, data


def _to_event(ce: CloudEvent, data: Any, known: dict[str, Any]) -> Event:
    return _event(ce.get_attributes(), ce.get_time(), data, known)


def _event(attributes: dict[str, Any], time: datetime | None, data: Any,
           known: dict[str, Any]) -> Event:
    event = Event(
        id=attributes["id"], type=attributes["type"], source=attributes["source"], data=data,
        subject=attributes.get("subject"),
        time=_iso(time) if time is not None else None,
        extensions={k: str(v) for k, v in attributes.items() if k not in CORE},
    )
    if is_kube_type(event.type):
        _check_kube_data(event, known, attributes.get("datacontenttype"))
    return event


def _iso(time: datetime) -> str:
    text = time.isoformat()
    return text[:-6] + "Z" if text.endswith("+00:00") else text


def _check_kube_data(event: Event, known: dict[str, Any],
                     content_type: str | None = None) -> None:
    """A Kubernetes event must say which object it is about, or no handler can be chosen."""
    data = event.data
    if not isinstance(data, dict):
        if content_type and not _JSON_TYPE.match(content_type):
            raise BadEvent(415, f"a {event.type} event carries its object as JSON "
                                f"(application/json), not {content_type}", known)
        what = "no data" if data is None else f"{type(data).__name__} data"
        raise BadEvent(400, f"a {event.type} event needs a JSON object as data (the "
                            f"Kubernetes object, or an ObjectReference in Reference mode), "
                            f"got {what}", known)
    if event.type.startswith(RESOURCE_PREFIX):
        meta = data.get("metadata")
        missing = [f for f in ("apiVersion", "kind") if not _nonempty_str(data.get(f))]
        if not isinstance(meta, dict) or not _nonempty_str(meta.get("name")):
            missing.append("metadata.name")
        if missing:
            raise BadEvent(400, f"Resource-mode data is not a Kubernetes object: missing "
                                f"{', '.join(missing)}", known)
        wrong = _misshapen_metadata(meta)
        if wrong:
            raise BadEvent(400, f"Resource-mode data is not a Kubernetes object: "
                                f"{'; '.join(wrong)}", known)
    elif event.ref is None:
        missing = [f for f, ext in (("apiVersion", "apiversion"), ("kind", "kind"),
                                    ("name", "name"))
                   if not data.get(f) and not event.extensions.get(ext)]
        raise BadEvent(400, f"Reference-mode data must name the object: missing "
                            f"{', '.join(missing)}", known)
    _check_extensions_agree(event, known)
    ref = event.ref
    if ref is not None:
        for what, value in (("name", ref.name), ("namespace", ref.namespace)):
            if value is not None and not is_path_segment(value):
                raise BadEvent(400, f"no Kubernetes object can have the {what} {value!r} "
                                    "(names never contain '/', '%', '?' or '#', nor are '.' "
                                    "or '..')", known)


def _check_extensions_agree(event: Event, known: dict[str, Any]) -> None:
    """The ``kind``, ``apiversion``, ``name`` and ``namespace`` extensions are the routing
    contract, and handlers act on the data: an event whose two say different objects is
    malformed (a sender's bug, or a forgery), never routed by one and acted on as the other."""
    extensions = event.extensions
    if not extensions:
        return
    said = event.named_in_data
    differ = [f"{ext} {extensions[ext]!r} in the extension, {said[ext]!r} in the data"
              for ext in ("kind", "apiversion", "name", "namespace")
              if said[ext] and extensions.get(ext) and extensions[ext] != said[ext]]
    if differ:
        raise BadEvent(400, "the event's extensions and its data name different objects: "
                            + "; ".join(differ), known)


_META_STRINGS = ("namespace", "uid", "resourceVersion", "deletionTimestamp", "creationTimestamp")
_META_MAPS = ("labels", "annotations")


def _misshapen_metadata(meta: dict[str, Any]) -> list[str]:
    """What in ``metadata`` has a shape no API server sends (handlers read these fields from
    the event, e.g. to match a deleted object by its labels or owners)."""
    wrong = [f"metadata.{f} must be a string" for f in _META_STRINGS
             if meta.get(f) is not None and not isinstance(meta[f], str)]
    for field in _META_MAPS:
        value = meta.get(field)
        if value is not None and not (isinstance(value, dict) and all(
                isinstance(v, str) for v in value.values())):
            wrong.append(f"metadata.{field} must map strings to strings")
    owners = meta.get("ownerReferences")
    if owners is not None and not (isinstance(owners, list) and all(
            isinstance(o, dict) and all(isinstance(o.get(k), str) for k in ("kind", "name"))
            for o in owners)):
        wrong.append("metadata.ownerReferences must be a list of references (kind, name)")
    generation = meta.get("generation")
    if generation is not None and (isinstance(generation, bool)
                                   or not isinstance(generation, int)):
        wrong.append("metadata.generation must be an integer")
    return wrong


def _nonempty_str(value: Any) -> bool:
    return isinstance(value, str) and bool(value)
