"""The reconcile engine: desired-state handlers whose work follows what changed.

A handler declares a :class:`Controller` (parent kind, kinds it owns and reads, how other
kinds' changes map to parents) and a pure function ``(parent, reads) -> Desired``. The
engine answers reads from the router's cache, merges repeated work per parent, writes only
differences under the handler's own field manager, prunes what is no longer wanted, writes
status only when it changed and ignores the echoes of its own writes. ``docs/ENGINE.md`` is
the contract; :mod:`eventop.engine.testing` runs a controller without a server.

Modules: ``kinds`` (naming kinds and parents), ``controller`` (the declaration),
``desired`` (what a function returns and the outcome it is told), ``invalid`` (a parent
whose spec can not be acted on: :class:`SpecError`), ``reads`` (cached reads),
``plan`` (what to write, pure), ``write`` (writing it), ``run`` (one run), ``testing``.
"""

from eventop.engine.controller import PARENT_UID_LABEL, Controller
from eventop.engine.desired import Child, Conflict, Desired, Note, Outcome, WriteError
from eventop.engine.invalid import SpecError
from eventop.engine.kinds import Key, Kind
from eventop.engine.reads import NotCached, Reads, UndeclaredKind

__all__ = ["PARENT_UID_LABEL", "Child", "Conflict", "Controller", "Desired", "Key", "Kind",
           "NotCached", "Note", "Outcome", "Reads", "SpecError", "UndeclaredKind", "WriteError"]
