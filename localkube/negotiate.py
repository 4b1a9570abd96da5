"""Which representation a GET asked for: the object itself, its metadata only, or a Table.

Clients say it in ``Accept``: ``application/json;as=Table;v=v1;g=meta.k8s.io`` (kubectl get),
``application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io`` (metadata-only
informers), plain ``application/json``. Like the real server, the first clause the server
can produce wins and later ones are only fallbacks: a list asked for as
``PartialObjectMetadata`` is a 406, not a quiet fall back to the next clause (recorded in
``tests/recordings/kubectl/metadata/``). localkube writes JSON only, so protobuf and YAML
clauses are skipped (a real server would answer them in their encoding).
"""

from __future__ import annotations

from dataclasses import dataclass

from eventop.localkube.errors import ApiError

AS_KINDS = ("Table", "PartialObjectMetadata", "PartialObjectMetadataList")
AS_VERSIONS = ("v1", "v1beta1")
JSON_TYPES = ("application/json", "application/*", "*/*")
# Clauses a real server serves and localkube skips (it only writes JSON).
OTHER_ENCODINGS = ("application/yaml", "application/vnd.kubernetes.protobuf", "application/cbor")


@dataclass(frozen=True)
class View:
    """``kind`` is "" for the object itself, else one of AS_KINDS in meta.k8s.io/``version``."""

    kind: str = ""
    version: str = "v1"

    @property
    def api_version(self) -> str:
        return f"meta.k8s.io/{self.version}"


PLAIN = View()


def not_acceptable() -> ApiError:
    return ApiError(406, "NotAcceptable",
                    "only the following media types are accepted: application/json, "
                    "application/yaml, application/vnd.kubernetes.protobuf")


def view_for(accept: str | None) -> View:
    """The View the first producible clause of ``accept`` names (406 if none is)."""
    if not accept or not accept.strip():
        return PLAIN
    skipped_other = False
    for clause in accept.split(","):
        mime, params = _parse(clause)
        if mime in OTHER_ENCODINGS:
            skipped_other = True
            continue
        if mime not in JSON_TYPES:
            continue
        wanted = params.get("as")
        if wanted is None:
            return PLAIN
        if (wanted in AS_KINDS and params.get("g") == "meta.k8s.io"
                and params.get("v") in AS_VERSIONS):
            return View(wanted, params["v"])
    if skipped_other:
        # e.g. only protobuf was offered: answer JSON, which every Kubernetes client reads.
        return PLAIN
    if any(_parse(c)[1].get("as") for c in accept.split(",")):
        raise not_acceptable()
    # What the real server answers to e.g. text/html (recorded).
    raise ApiError(406, "NotAcceptable", "406: Not Acceptable", {})


def _parse(clause: str) -> tuple[str, dict[str, str]]:
    mime, *rest = clause.split(";")
    params = {}
    for item in rest:
        key, _, value = item.partition("=")
        params[key.strip()] = value.strip()
    return mime.strip().lower(), params
