"""The repository as a newcomer meets it: make, the Python version, the README."""
