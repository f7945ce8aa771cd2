"""structlog set-up: key-value events, console or JSON, to stderr. Never log keys or Authorization headers."""

from __future__ import annotations

import contextlib
import logging
import sys

import structlog

__all__ = ["configure_logging"]


class _Stderr:
    """`sys.stderr` as it is when a line is written (tests and embedding programs swap it), and a stream that
    closed drops the line instead of failing the request that logged it: logging never breaks a flow."""

    def write(self, text: str) -> int:
        try:
            return sys.stderr.write(text)
        except (ValueError, OSError):
            return 0

    def flush(self) -> None:
        with contextlib.suppress(ValueError, OSError):
            sys.stderr.flush()


def configure_logging(level: str = "info", fmt: str = "console") -> None:
    """Route structlog (and the stdlib loggers of aiohttp) to stderr at `level`."""
    lvl = logging.getLevelNamesMapping()[level.upper()]
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer() if fmt == "json" else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(lvl),
        logger_factory=structlog.PrintLoggerFactory(_Stderr()),  # type: ignore[arg-type]
        cache_logger_on_first_use=True,
    )
    logging.basicConfig(
        level=max(lvl, logging.WARNING), stream=sys.stderr, format="%(levelname)s %(name)s %(message)s"
    )
