"""Test support: processes, pipelines (local and real cluster), recordings."""
