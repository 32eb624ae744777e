"""structlog configuration: JSON lines on stderr, level from settings."""

from __future__ import annotations

import logging
import sys

import orjson
import structlog

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


def configure_logging(level: str = "info") -> None:
    """Route structlog (and the stdlib loggers of our dependencies) to JSON lines on stderr."""
    numeric = _LEVELS[level]
    logging.basicConfig(stream=sys.stderr, level=max(numeric, logging.WARNING), format="%(message)s")
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(serializer=orjson.dumps),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.BytesLoggerFactory(sys.stderr.buffer),
        cache_logger_on_first_use=True,
    )
