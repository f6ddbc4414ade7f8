"""Event types of the example order flow, and the checkpoints of its state machines."""

from .gallery import Album, Thumbnail
from .orders import OrderPlaced, OrderShipped, PaymentCaptured, PaymentRequested
from .retrain import Retrain

__all__ = [
    "Album",
    "OrderPlaced",
    "OrderShipped",
    "PaymentCaptured",
    "PaymentRequested",
    "Retrain",
    "Thumbnail",
]
