"""The router: receives CloudEvents over HTTP and dispatches them to handler functions.

``eventop.router.app.create_app`` is the Flask app factory; ``python -m eventop.router``
serves it under gunicorn. This package's ``__init__`` deliberately imports nothing: ``python -m
eventop.router`` must set ``PROMETHEUS_MULTIPROC_DIR`` before ``prometheus_client`` is first
imported, and importing the app here would import it too early.
"""
