"""Custom resources against their CRD's openAPIV3Schema: defaulting, pruning, validation.

Validation uses ``jsonschema`` (Draft 4, the dialect OpenAPI v3 schemas build on) and
translates each error into the field error the real API server reports, e.g.
``spec.currency: Unsupported value: "EUR": supported values: "CAD", ...``.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable
from typing import Any

import jsonschema

from eventop.localkube.errors import cause

Obj = dict[str, Any]
ROOT_SKIP = ("apiVersion", "kind", "metadata")
RFC3339 = re.compile(r"\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})")
FORMATS = jsonschema.FormatChecker(formats=())


@FORMATS.checks("date-time")
def _date_time(value: object) -> bool:
    """RFC 3339, as the API server's format check (non-strings are the type check's job)."""
    return not isinstance(value, str) or RFC3339.fullmatch(value) is not None


def default_and_prune(value: Any, schema: Obj | None, *, root: bool = False) -> Any:
    """Fill ``default``s of missing properties and drop fields the schema does not know."""
    if not schema:
        return value
    if isinstance(value, dict):
        props = schema.get("properties")
        addl = schema.get("additionalProperties")
        keep_unknown = bool(schema.get("x-kubernetes-preserve-unknown-fields")) or addl is True
        for key in list(value):
            if root and key in ROOT_SKIP:
                continue
            sub = props.get(key) if props is not None else (addl if isinstance(addl, dict)
                                                             else None)
            if value[key] is None and sub is not None and not sub.get("nullable"):
                del value[key]  # nulls of non-nullable fields are pruned, as in 1.20+
                continue
            if props is not None and key in props:
                value[key] = default_and_prune(value[key], props[key])
            elif isinstance(addl, dict):
                value[key] = default_and_prune(value[key], addl)
            elif not keep_unknown:
                del value[key]
        for key, sub in (props or {}).items():
            if key not in value and "default" in sub and not (root and key in ROOT_SKIP):
                value[key] = default_and_prune(copy.deepcopy(sub["default"]), sub)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [default_and_prune(v, schema["items"]) for v in value]
    return value


def _field(path: list[Any]) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _go_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _v(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


# Keywords whose error reads "Invalid value: <shown>: <field> in body <phrase>": how the
# offending value is shown, and the phrase ({want}: the schema's value, {shown}: as shown).
_IN_BODY: dict[str, tuple[Callable[[Any], str], str]] = {
    "type": (lambda got: _v(_go_type(got)), "must be of type {want}: {shown}"),
    "format": (_v, "must be of type {want}: {shown}"),
    "pattern": (_v, "should match '{want}'"),
    "minimum": (_v, "should be greater than or equal to {want}"),
    "maximum": (_v, "should be less than or equal to {want}"),
    "minItems": (lambda got: str(len(got)), "should have at least {want} items"),
    "minLength": (_v, "should be at least {want} chars long"),
}


def _translate(err: jsonschema.ValidationError) -> list[Obj]:
    path = list(err.absolute_path)
    field = _field(path)
    kw, want, got = err.validator, err.validator_value, err.instance
    if kw == "required":
        return [cause("FieldValueRequired", _field([*path, key]), "Required value")
                for key in want if isinstance(got, dict) and key not in got]
    if kw == "enum":
        supported = ", ".join(_v(v) for v in want)
        return [cause("FieldValueNotSupported", field,
                      f"Unsupported value: {_v(got)}: supported values: {supported}")]
    if kw in _IN_BODY:
        show, phrase = _IN_BODY[kw]
        shown = show(got)
        return [cause("FieldValueInvalid", field, f"Invalid value: {shown}: {field} in body "
                                                  + phrase.format(want=want, shown=shown))]
    if kw == "not":  # the real server names no field for it, and shows no value
        return [cause("FieldValueInvalid", "<nil>",
                      f'Invalid value: "": "{field}" must not validate the schema (not)')]
    if kw == "maxItems":
        return [cause("FieldValueTooMany", field,
                      f"Too many: {len(got)}: must have at most {want} items")]
    if kw == "maxLength":
        return [cause("FieldValueTooLong", field, f"Too long: may not be longer than {want}")]
    return [cause("FieldValueInvalid", field, f"Invalid value: {_v(got)}: {err.message}")]


def _nullable(schema: Any) -> Any:
    """OpenAPI ``nullable: true`` as JSON Schema: the type also admits null."""
    if isinstance(schema, dict):
        if schema.get("nullable") and isinstance(schema.get("type"), str):
            schema["type"] = [schema["type"], "null"]
            if "enum" in schema:
                schema["enum"] = [*schema["enum"], None]
        for value in schema.values():
            _nullable(value)
    elif isinstance(schema, list):
        for value in schema:
            _nullable(value)
    return schema


class SchemaValidator:
    """A compiled openAPIV3Schema (metadata, apiVersion and kind are validated elsewhere)."""

    def __init__(self, schema: Obj) -> None:
        self.schema = schema
        body = _nullable(copy.deepcopy(schema))
        for key in ROOT_SKIP:
            (body.get("properties") or {}).pop(key, None)
        self._validator = jsonschema.Draft4Validator(body, format_checker=FORMATS)

    def prepare(self, obj: Obj) -> Obj:
        """Defaulted and pruned copy of ``obj``."""
        return default_and_prune(copy.deepcopy(obj), self.schema, root=True)

    def causes(self, obj: Obj) -> list[Obj]:
        body = {k: v for k, v in obj.items() if k not in ROOT_SKIP}
        out: list[Obj] = []
        for err in self._validator.iter_errors(body):
            out.extend(_translate(err))
        # (the real server lists a "not" failure, which names no field, after the others)
        return sorted(out, key=lambda c: (c["field"] == "<nil>", c["field"]))
