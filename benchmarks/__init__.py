"""Benchmarks: scripts, not tests. See benchmarks/README.md."""
