"""The watcher: Kubernetes list+watch turned into CloudEvents posted to the router.

``watcher.cloudevent`` builds the events (DESIGN.md section 2), ``watcher.recording`` reads
recorded API traffic, ``watcher.watch`` runs the resilient list/watch loops, ``watcher.delivery``
posts events with retries and back-pressure, ``python -m watcher`` is the command line.
"""
