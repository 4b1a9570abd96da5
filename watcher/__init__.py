"""The watcher: Kubernetes list+watch turned into CloudEvents posted to the router.

:mod:`eventop.events` defines the events (README, "The event contract"),
``eventop.watcher.recording`` reads recorded API traffic, ``eventop.watcher.watch`` runs the
resilient list/watch loops, ``eventop.watcher.delivery`` posts events with retries and
back-pressure, ``python -m eventop.watcher`` is the command line.
"""
