"""eventop's test kit (eventop.testing) as a handler author uses it."""
