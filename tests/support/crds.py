"""The CRDs in ``crds/`` and their examples (``crds/examples/``) as the handlers' example
tests read them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

CRDS = Path(__file__).resolve().parents[2] / "crds"
EXAMPLES = CRDS / "examples"


def load_crd(filename: str) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((CRDS / filename).read_text())
    return doc


def storage_schema(filename: str) -> dict[str, Any]:
    """The openAPIV3Schema of the CRD's storage version (what the API server validates)."""
    (version,) = [v for v in load_crd(filename)["spec"]["versions"] if v["storage"]]
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema


def example_files(prefix: str) -> list[Path]:
    """``crds/examples/<prefix>-*.yaml``, sorted."""
    return sorted(EXAMPLES.glob(f"{prefix}-*.yaml"))


def docs_of(kind: str, paths: list[Path]) -> list[dict[str, Any]]:
    """The documents of ``kind`` in the YAML files ``paths``, in order."""
    return [d for p in paths for d in yaml.safe_load_all(p.read_text())
            if d and d.get("kind") == kind]
