"""Event types of the example order flow."""

from .orders import OrderPlaced, OrderShipped, PaymentCaptured, PaymentRequested

__all__ = ["OrderPlaced", "OrderShipped", "PaymentCaptured", "PaymentRequested"]
