"""The shipped ExchangeRate examples are valid against the CRD schema; invalid specs are not."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import pytest

from tests.support.crds import docs_of, example_files, load_crd, storage_schema

EXAMPLES = example_files("exchangerate")


def crd_schema() -> dict[str, Any]:
    return storage_schema("exchangerates.yaml")


def exchange_rates_in(path: Path) -> list[dict[str, Any]]:
    return docs_of("ExchangeRate", [path])


def test_there_are_examples_for_more_than_one_base() -> None:
    docs = [d for p in EXAMPLES for d in exchange_rates_in(p)]
    assert len(docs) >= 3
    assert len({d["spec"].get("base", "EUR") for d in docs}) == 2


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_is_valid_against_the_crd_schema(path: Path) -> None:
    docs = exchange_rates_in(path)
    assert docs, f"{path.name} holds no ExchangeRate"
    for doc in docs:
        assert doc["apiVersion"] == "eventop.dev/v1"
        assert doc["metadata"]["namespace"]
        jsonschema.validate(doc, crd_schema())


@pytest.mark.parametrize("spec", [
    {"currency": "EUR"},  # not in the enum
    {"currency": "usd"},
    {"currency": "USD", "base": "eur"},  # pattern ^[A-Z]{3}$
    {"currency": "USD", "base": "EURO"},
    {"base": "EUR"},  # currency is required
])
def test_crd_schema_rejects_invalid_specs(spec: dict[str, Any]) -> None:
    doc = {"apiVersion": "eventop.dev/v1", "kind": "ExchangeRate",
           "metadata": {"name": "x", "namespace": "finance"}, "spec": spec}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, crd_schema())


def test_crd_defaults_base_to_eur_and_shows_the_rate() -> None:
    schema = crd_schema()
    assert schema["properties"]["spec"]["properties"]["base"]["default"] == "EUR"
    crd = load_crd("exchangerates.yaml")
    columns = {c["name"]: c["jsonPath"]
               for c in crd["spec"]["versions"][0]["additionalPrinterColumns"]}
    assert columns["Rate"] == ".status.rate"
    assert columns["Date"] == ".status.date"
    assert crd["spec"]["names"]["shortNames"] == ["er"]


def test_printer_columns_show_the_currency_and_base_of_the_rate_shown() -> None:
    """After a spec change during an outage status still holds the old pair's rate: the
    default columns must name that pair, not the spec's (shown only with ``-o wide``)."""
    crd = load_crd("exchangerates.yaml")
    columns = {c["name"]: c for c in crd["spec"]["versions"][0]["additionalPrinterColumns"]}
    assert columns["Rate"]["jsonPath"] == ".status.rate"
    assert columns["Currency"]["jsonPath"] == ".status.currency"
    assert columns["Base"]["jsonPath"] == ".status.base"
    status = crd_schema()["properties"]["status"]["properties"]
    assert {"currency", "base", "rate", "date"} <= set(status)
    wide = {c["jsonPath"] for c in columns.values() if c.get("priority", 0) > 0}
    assert wide == {".spec.currency", ".spec.base"}
