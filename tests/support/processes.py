"""The tests drive the processes of eventop's test kit (:mod:`eventop.testing.processes`),
the same ones a handler author's tests and ``make demo`` run."""

from eventop.testing.processes import RouterProcess, WatcherProcess, free_port, wait_http

__all__ = ["RouterProcess", "WatcherProcess", "free_port", "wait_http"]
