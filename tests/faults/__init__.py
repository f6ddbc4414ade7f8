"""Fault-injection suites, one per backend: real processes, real signals, real databases."""
