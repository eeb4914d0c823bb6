"""What latlab serve logged during a test: records of the named loggers, kept in a list."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

SERVER_LOGGERS = ("latlab.serve", "latlab.engine", "uvicorn.error")


class _Keep(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextmanager
def server_logs(*names: str) -> Iterator[list[logging.LogRecord]]:
    handler = _Keep()
    loggers = [logging.getLogger(name) for name in names or SERVER_LOGGERS]
    for logger in loggers:
        logger.addHandler(handler)
    try:
        yield handler.records
    finally:
        for logger in loggers:
            logger.removeHandler(handler)


def tracebacks(records: list[logging.LogRecord]) -> list[str]:
    return [f"{r.name}: {r.getMessage()}" for r in records if r.exc_info]
