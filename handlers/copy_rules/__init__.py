"""CopyRule: keep ConfigMaps or Secrets copied into namespaces (replaces "Copyrator").

A desired-state handler on the reconcile engine (``docs/ENGINE.md``): :mod:`.desired` says,
as pure functions, what a rule asks for; :mod:`.controller` declares the handler (parent
CopyRule, owns ConfigMaps and Secrets, reads Namespaces) and turns a rule and the cache into
its copies and status. The event only says *where to look*: objects, Secret contents above
all, come from the router's cache, which only the API server fills.
"""

from __future__ import annotations

from eventop.handlers.copy_rules.controller import registry, rules

__all__ = ["registry", "rules"]
