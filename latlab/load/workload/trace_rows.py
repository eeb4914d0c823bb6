"""What every trace reader gives: one `TraceRow` per request, and errors that name the file,
the line and the field (`TraceSource.error`)."""

from __future__ import annotations

import gzip
import io
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from latlab.records.lengths import WorkloadError

BLOCK_TOKENS = 512  # the tokens of one hash id (Mooncake's block); --length-scale scales it


class TraceError(WorkloadError):
    """A trace that cannot be replayed; the message names the file, line and field."""


@dataclass(slots=True)
class TraceRow:
    """One request of a trace, as the trace gives it (None: the trace does not say)."""

    row: int  # 0 for the file's first request, in the file's order
    line: int  # the file's line (for messages)
    time_s: float  # on the trace's own clock
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    hash_ids: list[int] | None = None
    session: str | None = None
    turn: int | None = None
    tenant: str | None = None
    priority: int | None = None
    # The API the request was sent with, where the trace says (latlab's own traces): its
    # prompt_tokens are then the server's count, the model's whole input (a chat request's
    # chat template included), which a replay through a chat API must not add to again.
    api: str | None = None


class TraceSource:
    """A trace's file and what its readers report: errors, and the rows they skipped."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.where = f"--trace {self.path}"
        self.skipped: Counter[str] = Counter()

    def open(self, text: bool = False) -> IO:
        """The file, read as it comes (gzip-compressed ones too: `.gz` or not)."""
        with open(self.path, "rb") as f:
            zipped = f.read(2) == b"\x1f\x8b"
        raw = gzip.open(self.path, "rb") if zipped else open(self.path, "rb")
        return io.TextIOWrapper(raw, encoding="utf-8-sig", newline="") if text else raw

    def error(self, line: int, field: str, problem: str) -> TraceError:
        return TraceError(f"{self.where}: line {line}: `{field}` {problem}")

    def skip(self, reason: str) -> None:
        self.skipped[reason] += 1

    def describe_skipped(self) -> str | None:
        """What was left out, as a sentence; None when nothing was."""
        if not self.skipped:
            return None
        return "skipped " + ", ".join(f"{n:,} {reason}" for reason, n in self.skipped.items())


def scaled(tokens: int, scale: float) -> int:
    """A length under --length-scale: at least 1 token."""
    return max(1, round(tokens * scale))
