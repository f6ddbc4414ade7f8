"""Event types of the example order flow, and the retraining machine's checkpoint."""

from .orders import OrderPlaced, OrderShipped, PaymentCaptured, PaymentRequested
from .retrain import Retrain

__all__ = ["OrderPlaced", "OrderShipped", "PaymentCaptured", "PaymentRequested", "Retrain"]
