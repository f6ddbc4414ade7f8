"""Handlers of the example application, one Router per module."""
