"""Waiting for something to happen: the test kit's :func:`eventop.testing.wait_until`."""

from eventop.testing.waiting import wait_until

__all__ = ["wait_until"]
