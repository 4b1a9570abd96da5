"""Derive RBAC from code: what API requests each component really makes, as RBAC rules.

Three pieces, used by ``test_rbac.py``:

* :func:`access_of` maps one API request (method, URL path, query, content type) to the
  RBAC ``(apiGroup, resource[/subresource], verb)`` the API server authorizes it as;
* :class:`KubeRecorder` records every request made through :class:`eventop.kube.Kube` in this
  process, with the first-party call site that made it and the body it sent;
* :func:`kube_call_sites` finds, statically, every ``kube.<method>(...)`` call in a package,
  so a test can tell which calls the scenarios never reached (and so could not derive).

And :func:`granted` reads the rules a ServiceAccount is bound to out of rendered manifests.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from tests.install.support import REPO

Obj = dict[str, Any]

KUBE_METHODS = frozenset({
    "get", "get_or_none", "list", "pages", "iter_watch", "apply", "create",
    "replace", "patch", "patch_status", "patch_status_if_changed", "delete", "post_event",
    "request", "ping"})


@dataclass(frozen=True, order=True)
class Access:
    """One RBAC permission: ``verb`` on ``resource`` (``plural`` or ``plural/sub``) in ``group``."""

    group: str
    resource: str
    verb: str

    def __str__(self) -> str:
        return f"{self.verb} {self.resource}.{self.group or 'core'}"


def access_of(method: str, path: str, query: str | Iterable[tuple[str, Any]] = "",
              content_type: str | None = None) -> set[Access]:
    """The permissions one request needs; empty for non-resource URLs (/version, discovery).

    Non-resource URLs that eventop uses (``/version`` for readiness, ``/api``/``/apis``
    discovery) are granted to every authenticated user by the default
    ``system:discovery``/``system:public-info-viewer`` roles, so they need no rules of ours.

    A server-side apply (``PATCH`` with ``application/apply-patch+yaml``) creates the object
    when it does not exist, and the API server then also checks ``create``: so an apply needs
    both ``patch`` and ``create``.
    """
    parts = [p for p in path.split("?")[0].strip("/").split("/") if p]
    if not parts or parts[0] not in ("api", "apis"):
        return set()
    if parts[0] == "api":
        group, rest = "", parts[2:]
    else:
        group, rest = (parts[1], parts[3:]) if len(parts) > 2 else ("", [])
    if not rest:
        return set()  # discovery of a group/version
    if rest[0] == "namespaces" and len(rest) >= 3:
        resource, name, sub = rest[2], (rest[3] if len(rest) > 3 else None), (
            rest[4] if len(rest) > 4 else None)
    else:
        resource, name, sub = rest[0], (rest[1] if len(rest) > 1 else None), (
            rest[2] if len(rest) > 2 else None)
    if sub:
        resource = f"{resource}/{sub}"
    params = (parse_qs(query) if isinstance(query, str)
              else {str(k): [str(v)] for k, v in query})
    method = method.upper()
    verbs: set[str]
    if method == "GET":
        if name:
            verbs = {"get"}
        elif params.get("watch", ["false"])[0].lower() in ("true", "1"):
            verbs = {"watch"}
        else:
            verbs = {"list"}
    elif method == "POST":
        verbs = {"create"}
    elif method == "PUT":
        verbs = {"update"}
    elif method == "PATCH":
        verbs = {"patch", "create"} if content_type == "application/apply-patch+yaml" else {
            "patch"}
    elif method == "DELETE":
        verbs = {"delete"} if name else {"deletecollection"}
    else:
        raise ValueError(f"unexpected HTTP method {method} for {path}")
    return {Access(group, resource, verb) for verb in verbs}


# -- recording ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Call:
    method: str
    path: str
    query: tuple[tuple[str, str], ...]
    content_type: str | None
    body: Any
    site: tuple[str, int] | None  # (repo-relative file, line) of the first-party caller

    @property
    def accesses(self) -> set[Access]:
        return access_of(self.method, self.path, self.query, self.content_type)


@dataclass
class KubeRecorder:
    """Every request made through ``eventop.kube.Kube.request`` while :meth:`recording` is
    active."""

    packages: tuple[str, ...] = ("handlers", "engine", "router", "watcher")
    calls: list[Call] = field(default_factory=list)
    # Called with each Call before it is sent; may change the world first (a race) or raise
    # a kube error (an answer the local API server does not give, e.g. a recorded 422).
    interceptors: list[Callable[[Call], None]] = field(default_factory=list)

    def _site(self) -> tuple[str, int] | None:
        frame = sys._getframe(2)
        roots = [REPO / p for p in self.packages]
        while frame is not None:
            path = Path(frame.f_code.co_filename)
            if any(path.is_relative_to(root) for root in roots):
                return str(path.relative_to(REPO)), frame.f_lineno
            frame = frame.f_back  # type: ignore[assignment]
        return None

    @contextmanager
    def recording(self) -> Iterator[KubeRecorder]:
        from eventop.kube.client import Kube

        original = Kube.request
        recorder = self

        def request(kube: Any, method: str, path: str, **kwargs: Any) -> Any:
            call = Call(
                method, path, tuple((str(k), str(v)) for k, v in kwargs.get("query") or []),
                kwargs.get("content_type"), kwargs.get("body"), recorder._site())
            recorder.calls.append(call)
            for intercept in list(recorder.interceptors):
                intercept(call)
            return original(kube, method, path, **kwargs)

        Kube.request = request  # type: ignore[method-assign]
        try:
            yield self
        finally:
            Kube.request = original  # type: ignore[method-assign]

    def accesses(self) -> set[Access]:
        return {a for call in self.calls for a in call.accesses}

    def owner_finalizer_accesses(self, plurals: dict[tuple[str, str], tuple[str, str]]
                                 ) -> set[Access]:
        """``update <owner>/finalizers`` for every owner a write named with blockOwnerDeletion.

        Under the OwnerReferencesPermissionEnforcement admission plugin, setting
        ``blockOwnerDeletion: true`` on a reference to an owner requires ``update`` on that
        owner's ``finalizers`` subresource. ``plurals`` maps (apiVersion, kind) to
        (group, plural).
        """
        found = set()
        for call in self.calls:
            if call.method not in ("POST", "PUT", "PATCH") or not isinstance(call.body, dict):
                continue
            for ref in (call.body.get("metadata") or {}).get("ownerReferences") or []:
                if ref.get("blockOwnerDeletion"):
                    group, plural = plurals[(ref["apiVersion"], ref["kind"])]
                    found.add(Access(group, f"{plural}/finalizers", "update"))
        return found

    def reads_after_create(self, writer_file: str = "engine/apiserver.py") -> set[Access]:
        """``get`` on every resource the engine creates objects of.

        A create answered 409 (someone made an object at that name meanwhile) is followed by
        a read of it, to tell another replica's object from someone else's (docs/ENGINE.md,
        section 3). Scenarios make that race for a kind only by chance, so the permission is
        derived by this rule from the creates instead of from the reads that happened.
        """
        return {Access(a.group, a.resource, "get") for call in self.calls
                if call.method == "POST" and call.site and call.site[0] == writer_file
                for a in call.accesses if a.verb == "create"}


# -- static call sites -------------------------------------------------------------------

@dataclass(frozen=True)
class Site:
    file: str
    first_line: int
    last_line: int
    method: str

    def __str__(self) -> str:
        return f"{self.file}:{self.first_line} kube.{self.method}(...)"


def kube_call_sites(package: str) -> list[Site]:
    """Every ``kube.<method>(...)`` / ``<x>.kube.<method>(...)`` call in a package."""
    sites = []
    for path in sorted((REPO / package).rglob("*.py")):
        rel = str(path.relative_to(REPO))
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            if node.func.attr not in KUBE_METHODS:
                continue
            target = node.func.value
            is_kube = (isinstance(target, ast.Name) and target.id == "kube") or (
                isinstance(target, ast.Attribute) and target.attr == "kube")
            if is_kube:
                sites.append(Site(rel, node.lineno, node.end_lineno or node.lineno,
                                  node.func.attr))
    return sites


def reached(sites: list[Site], calls: list[Call]) -> set[Site]:
    """The static call sites that recorded calls came from (innermost enclosing call)."""
    hit = set()
    for call in calls:
        if call.site is None:
            continue
        file, line = call.site
        candidates = [s for s in sites if s.file == file and s.first_line <= line <= s.last_line]
        if candidates:
            hit.add(min(candidates, key=lambda s: s.last_line - s.first_line))
    return hit


# -- what the manifests grant ----------------------------------------------------------------

def granted(objs: Iterable[Obj], service_account: str, namespace: str) -> set[Access]:
    """Every (group, resource, verb) the rendered RBAC objects grant one ServiceAccount.

    Wildcards are returned as they are ("*"), so a test can refuse them.
    """
    objs = list(objs)
    roles = {(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]): o
             for o in objs if o["kind"] in ("Role", "ClusterRole")}
    result: set[Access] = set()
    for binding in objs:
        if binding["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        subjects = binding.get("subjects") or []
        if not any(s.get("kind") == "ServiceAccount" and s.get("name") == service_account
                   and s.get("namespace", binding["metadata"].get("namespace")) == namespace
                   for s in subjects):
            continue
        ref = binding["roleRef"]
        role_ns = binding["metadata"].get("namespace") if ref["kind"] == "Role" else None
        role = roles.get((ref["kind"], role_ns, ref["name"]))
        if role is None:
            raise AssertionError(f"{binding['metadata']['name']} binds a {ref['kind']} "
                                 f"{ref['name']} that the manifests do not define")
        for rule in role.get("rules") or []:
            for group in rule.get("apiGroups") or []:
                for resource in rule.get("resources") or []:
                    for verb in rule.get("verbs") or []:
                        result.add(Access(group, resource, verb))
    return result
