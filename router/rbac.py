"""``python -m eventop.router rbac``: print the ClusterRoles the loaded handlers need.

The rules come from what the handlers declare (:mod:`eventop.engine.rbac`), for the handlers
the router would load (``EVENTOP_BUILTIN_HANDLERS``, ``EVENTOP_HANDLERS``): with
``EVENTOP_BUILTIN_HANDLERS=none``, only yours, to add beside ``deploy/``'s roles. A custom
kind's plural comes from ``--crds`` (your CustomResourceDefinition files), else from the API
server's discovery when a cluster is configured.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from eventop.cli import ConfigError, Parser, report
from eventop.engine import rbac

PROG = "python -m eventop.router rbac"


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog=PROG, description=__doc__.split("\n\n", 1)[1].replace("``", "")
                    if __doc__ else None)
    parser.add_argument("--name", default="my-operator",
                        help="prefix of the ClusterRoles' names (default: my-operator)")
    parser.add_argument("--mode", choices=("plain", "knative"), default="plain",
                        help="plain: the router's and the watcher's roles; knative: the "
                             "router's and the ApiServerSource's, and the source's resources")
    parser.add_argument("--crds", action="append", default=[], metavar="PATH",
                        help="CustomResourceDefinition files or folders (for custom kinds' "
                             "plurals); may be given more than once")
    return parser


def _discovery() -> rbac.Plurals:
    """Plurals asked of the configured API server, connected on first need."""
    kube = None

    def plural(api_version: str, kind: str) -> tuple[str, str]:
        nonlocal kube
        from eventop.kube import Kube, KubeError

        try:
            kube = kube or Kube.connect()
            res = kube.resource(api_version, kind)
        except KubeError as exc:
            raise LookupError(f"{api_version}/{kind}", str(exc)) from None
        except Exception as exc:  # a kubeconfig it cannot read: kubernetes' ConfigException
            raise LookupError(f"{api_version}/{kind}", f"the kubeconfig: {exc}") from None
        return res.group, res.plural

    return plural


def render(args: argparse.Namespace) -> str:
    from eventop import handlers
    from eventop.testing.cluster import load_crds

    try:
        crds = load_crds(Path(p) for p in args.crds)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"--crds: {exc}") from None
    try:
        registry = handlers.load()
    except handlers.HandlerLoadError as exc:
        raise ConfigError(str(exc)) from None
    plurals = rbac.plurals_from(crds, _discovery())
    try:
        router = rbac.router_role(registry, plurals)
        watched = rbac.watcher_role(registry, plurals, verbs=(
            ("get", "list", "watch") if args.mode == "knative" else ("list", "watch")))
    except LookupError as exc:
        kind, why = exc.args
        raise ConfigError(f"cannot tell the plural of {kind}: pass its "
                          "CustomResourceDefinition with --crds, or configure a cluster "
                          f"that serves it ({why})") from None
    source = "apiserversource" if args.mode == "knative" else "watcher"
    parts = ["# Children are written by server-side apply (patch); one written with "
             "Child(mode=\"replace\")\n# needs update on its kind too.\n"
             + router.to_yaml(f"{args.name}-router"),
             binding(f"{args.name}-router", "eventop-router"),
             watched.to_yaml(f"{args.name}-{source}"),
             binding(f"{args.name}-{source}", f"eventop-{source}")]
    functions = rbac.event_functions(registry)
    head = ("# Event functions write what their code writes, which is not declared: add "
            "their grants\n# to the router's role by hand: " + ", ".join(functions) + "\n"
            if functions else "")
    if args.mode == "knative":
        shipped = ",".join(name.rpartition(".")[2] for name in handlers.BUILTIN)
        builtin = {k.key for k in handlers.load("", builtin=shipped).watched_kinds()}
        new = [k for k in registry.watched_kinds() if k.key not in builtin]  # knative/ has those
        parts += [trigger(args.name, k.api_version, k.kind) for k in new]
        if new:
            head += ("# Add the new kinds to the ApiServerSource eventop (knative/"
                     "apiserversource.yaml), as a kustomize patch\n# of it:\n"
                     + "".join(f"#   - op: add\n#     path: /spec/resources/-\n"
                               f"#     value: {{apiVersion: {k.api_version}, kind: {k.kind}}}\n"
                               for k in new))
    return head + "---\n".join(parts)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        sys.stdout.write(render(args))
    except ConfigError as exc:
        return report(PROG, exc)
    return 0


def binding(role: str, service_account: str) -> str:
    return (f"apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\n"
            f"metadata:\n  name: {role}\nroleRef:\n  apiGroup: rbac.authorization.k8s.io\n"
            f"  kind: ClusterRole\n  name: {role}\nsubjects:\n  - kind: ServiceAccount\n"
            f"    name: {service_account}\n    namespace: eventop-system\n")


def trigger(prefix: str, api_version: str, kind: str) -> str:
    """A Trigger as knative/triggers.yaml has one per kind: the kind's events to the router."""
    return f"""apiVersion: eventing.knative.dev/v1
kind: Trigger
metadata:
  name: {prefix}-{kind.lower()}
  namespace: eventop-system
spec:
  broker: eventop
  filter:
    attributes:
      kind: {kind}
  filters:
    - prefix:
        type: dev.knative.apiserver.
    - exact:
        kind: {kind}
    - exact:
        apiversion: {api_version}
  delivery:
    retry: 5
    backoffPolicy: exponential
    backoffDelay: PT1S
    deadLetterSink:
      ref:
        apiVersion: serving.knative.dev/v1
        kind: Service
        name: eventop-dead-letter
        namespace: eventop-system
  subscriber:
    ref:
      apiVersion: serving.knative.dev/v1
      kind: Service
      name: eventop-router
      namespace: eventop-system
"""
