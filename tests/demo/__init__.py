"""The demo (``python -m demo``, ``make demo``) as a user runs it."""
