"""The tests drive the same processes ``make demo`` runs (see :mod:`demo.processes`)."""

from demo.processes import RouterProcess, WatcherProcess, free_port, wait_http

__all__ = ["RouterProcess", "WatcherProcess", "free_port", "wait_http"]
