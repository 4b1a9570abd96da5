"""Database: a custom resource that becomes a running, backed-up PostgreSQL.

:data:`databases` is the handler, a Controller on the reconcile engine (``docs/ENGINE.md``).
The lifecycle is a pure function of the Database and its observed children
(:func:`eventop.handlers.databases.lifecycle.plan`): the objects it should own, those it keeps
without owning (the backup volume, deletion snapshots), explicit deletions, its status and
Events, and whether a Database being deleted may go. See ``README.md`` beside this file for
the design (upgrades, deletion, backups).
"""

from __future__ import annotations

from eventop.handlers.databases.controller import databases, registry
from eventop.handlers.databases.lifecycle import Plan, plan
from eventop.handlers.databases.observe import Observed
from eventop.handlers.databases.spec import API_VERSION, FINALIZER, KIND, SpecError, parse_spec

__all__ = ["API_VERSION", "FINALIZER", "KIND", "Observed", "Plan", "SpecError", "databases",
           "parse_spec", "plan", "registry"]
