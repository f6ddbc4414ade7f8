"""Structured logs through the standard :mod:`logging` module.

- :class:`OutcomeLog` writes one line per completed delivery to the
  ``eventbus.delivery`` logger, at DEBUG (INFO with ``-v``). The fields ride
  on the record (``extra=``): ``event_id``, ``event_type``, ``delivery_id``,
  ``subscription``, ``attempt``, ``worker_id``, ``correlation_id``,
  ``causation_id``, ``outcome``, ``duration_ms`` and ``wait_ms``. Failed
  attempts (retry at WARNING, dead at ERROR, rate-limited per subscription
  and error type) and refused results are logged by the worker
  (``eventbus.worker``), with ``event_id``, ``delivery_id``,
  ``subscription``, ``attempt``, ``worker_id``, ``outcome``,
  ``duration_ms``, ``error_type`` and ``error`` as fields. Payloads and DSNs
  are never logged.
- :class:`DeliveryContextFilter` copies the ids of the delivery whose handler
  is running into every record written meanwhile, so a handler's own
  ``log.info(...)`` carries them. Add it to your handlers when you configure
  logging yourself.
- :class:`JsonFormatter` renders one JSON object per line (``ts``, ``level``,
  ``logger``, ``event`` and every structured field, plus ``trace_id`` and
  ``span_id`` while an OpenTelemetry span is current); :class:`TextFormatter`
  appends the fields as ``key=value``.
- :func:`configure` is what ``eventbus --log-format json|text`` calls.
"""

from __future__ import annotations

import logging
import sys
from datetime import UTC, datetime
from typing import Any, Literal

import orjson

from .observe import DeliveryOutcome, NoHooks, delivery_context

__all__ = [
    "DeliveryContextFilter",
    "JsonFormatter",
    "LogFormat",
    "OutcomeLog",
    "TextFormatter",
    "configure",
]

LogFormat = Literal["json", "text"]
"""How :func:`configure` writes log records."""

outcome_log = logging.getLogger("eventbus.delivery")

_CONTEXT_FIELDS = (
    "event_id",
    "event_type",
    "delivery_id",
    "subscription",
    "attempt",
    "worker_id",
    "correlation_id",
    "causation_id",
)
_FIELDS = (*_CONTEXT_FIELDS, "outcome", "duration_ms", "wait_ms", "error_type", "error")


class DeliveryContextFilter(logging.Filter):
    """Adds the running delivery's ids to records that do not carry them already."""

    def filter(self, record: logging.LogRecord) -> bool:
        bound = delivery_context()
        if bound is not None:
            for name, value in bound.fields().items():
                if not hasattr(record, name):
                    setattr(record, name, value)
        return True


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 3)


class OutcomeLog(NoHooks):
    """One log line per delivery outcome. ``completed_level`` is DEBUG unless raised."""

    def __init__(self, completed_level: int = logging.DEBUG, logger: logging.Logger = outcome_log) -> None:
        self.completed_level = completed_level
        self.logger = logger

    def wants_every_outcome(self) -> bool:
        """Completions are logged only when their level is enabled."""
        return self.logger.isEnabledFor(self.completed_level)

    def observes_deliveries(self) -> bool:
        """Only completions are logged here (failures and refusals are the worker's lines):
        nothing to observe while their level is off."""
        return self.logger.isEnabledFor(self.completed_level)

    def on_outcome(self, outcome: DeliveryOutcome) -> None:
        if outcome.kind != "completed":
            return  # failures and refusals: the worker's rate-limited lines
        level = self.completed_level
        if not self.logger.isEnabledFor(level):
            return
        d = outcome.delivery
        extra: dict[str, Any] = {
            "event_id": d.event_id,
            "event_type": d.event_type,
            "delivery_id": d.id,
            "subscription": outcome.subscription,
            "attempt": d.attempts,
            "worker_id": outcome.worker_id,
            "correlation_id": d.correlation_id or d.event_id,
            "causation_id": d.causation_id,
            "outcome": outcome.kind,
            "duration_ms": _ms(outcome.duration_seconds),
            "wait_ms": _ms(outcome.wait_seconds),
        }
        self.logger.log(level, "delivery completed", extra=extra)


def _trace_fields() -> dict[str, str]:
    """``trace_id``/``span_id`` of the current OpenTelemetry span, if the API is loaded."""
    trace = sys.modules.get("opentelemetry.trace")
    if trace is None:
        return {}
    ctx = trace.get_current_span().get_span_context()
    if not ctx.is_valid:
        return {}
    return {
        "trace_id": format(ctx.trace_id, "032x"),
        "span_id": format(ctx.span_id, "016x"),
        "trace_flags": format(ctx.trace_flags, "02x"),
    }


def _record_fields(record: logging.LogRecord) -> dict[str, Any]:
    fields = {name: getattr(record, name) for name in _FIELDS if getattr(record, name, None) is not None}
    fields.update(_trace_fields())
    return fields


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ts, level, logger, event, the structured fields, exc."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage(),
            **_record_fields(record),
        }
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(out, default=str).decode()


class TextFormatter(logging.Formatter):
    """``time LEVEL logger: message key=value …`` for a terminal."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        fields = _record_fields(record)
        if not fields:
            return text
        return text + " " + " ".join(f"{k}={v}" for k, v in fields.items() if k != "error")


def configure(level: int = logging.WARNING, fmt: LogFormat | None = None) -> logging.Handler:
    """Log to stderr: JSON unless ``fmt`` says otherwise or stderr is a terminal.

    Replaces the root logger's handlers (as ``logging.basicConfig(force=True)``
    would) and returns the handler, with the delivery context filter on it.
    """
    if fmt is None:
        fmt = "text" if sys.stderr.isatty() else "json"
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    handler.addFilter(DeliveryContextFilter())
    logging.basicConfig(level=level, handlers=[handler], force=True)
    return handler
