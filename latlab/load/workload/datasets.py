"""Datasets of prompts from local files: JSONL or ShareGPT JSON.

JSONL: one object per line with a string `prompt` or a `messages` list of {role, content},
and optionally `output_tokens` (or `max_tokens`), `tenant` and `priority`.
ShareGPT: a JSON list of {"conversations": [{"from": "human", "value": ...},
{"from": "gpt", "value": ...}, ...]}; the first human turn is the prompt and the reply's
length (in the target's tokens) the output length.

Every entry also keeps its conversation, turn by turn (each user message with the reply the
dataset gives it), which sessions (`--turns all`) replay whole.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson


class DatasetError(ValueError):
    """A dataset that cannot be used; the message names --dataset and the line."""


@dataclass(slots=True)
class DatasetEntry:
    """One request of a dataset: a prompt or messages, and what it says about its output."""

    prompt: str | None
    messages: list[dict[str, Any]] | None
    output_tokens: int | None
    output_text: str | None
    tenant: str | None
    priority: int | None
    turns: list[Turn] | None = None  # the conversation, a user message and its reply a turn
    system: str | None = None  # a conversation's system message


@dataclass(slots=True)
class Turn:
    """One turn of a dataset's conversation: the user's message and the reply it got."""

    user: str
    reply: str | None


def load_dataset(path: Path) -> list[DatasetEntry]:
    """JSONL (`prompt` or `messages`, optional `output_tokens`/`max_tokens`, `tenant`,
    `priority` per line) or ShareGPT JSON (a list of `conversations`)."""
    try:
        raw = Path(path).read_bytes()
    except OSError as e:
        raise DatasetError(f"--dataset {path}: cannot read it: {e.strerror}") from None
    entries = _sharegpt(raw, path) if raw.lstrip()[:1] == b"[" else _jsonl(raw, path)
    if not entries:
        raise DatasetError(f"--dataset {path}: no usable requests in it")
    return entries


def jsonl_rows(raw: bytes, where: str, error: type[ValueError]) -> Iterator[tuple[int, Any]]:
    """(line number, parsed value) of every non-blank line; `error` names `where` and the line."""
    for n, line in enumerate(raw.splitlines(), 1):
        if not line.strip():
            continue
        try:
            yield n, orjson.loads(line)
        except orjson.JSONDecodeError as e:
            raise error(f"{where}: line {n}: not JSON ({e})") from None


def _jsonl(raw: bytes, path: Path) -> list[DatasetEntry]:
    entries = []
    for n, row in jsonl_rows(raw, f"--dataset {path}", DatasetError):
        if not isinstance(row, dict):
            raise DatasetError(f"--dataset {path}: line {n}: expected an object")
        prompt, messages = row.get("prompt"), row.get("messages")
        if not isinstance(prompt, str) and not _is_messages(messages):
            raise DatasetError(f"--dataset {path}: line {n}: needs a string `prompt` or a "
                                "`messages` list of {role, content}")
        output = row.get("output_tokens", row.get("max_tokens"))
        if output is not None and (not isinstance(output, int) or output < 1):
            raise DatasetError(f"--dataset {path}: line {n}: output_tokens must be a "
                                "positive integer")
        priority = row.get("priority")
        if priority is not None and not isinstance(priority, int):
            raise DatasetError(f"--dataset {path}: line {n}: priority must be an integer")
        tenant = row.get("tenant")
        entry = DatasetEntry(prompt if isinstance(prompt, str) else None,
                             messages if not isinstance(prompt, str) else None,
                             output, None, str(tenant) if tenant is not None else None, priority)
        if entry.messages:
            entry.system, entry.turns = _turns(entry.messages)
        else:
            entry.turns = [Turn(entry.prompt, None)]
        entries.append(entry)
    return entries


def _turns(messages: list[dict[str, Any]]) -> tuple[str | None, list[Turn]]:
    """A conversation's system message and its turns: each user message with the
    assistant's reply after it (None when none follows)."""
    system = " ".join(str(m["content"]) for m in messages if m["role"] == "system") or None
    turns: list[Turn] = []
    for m in messages:
        if m["role"] == "user":
            turns.append(Turn(str(m["content"]), None))
        elif m["role"] == "assistant" and turns and turns[-1].reply is None:
            turns[-1].reply = str(m["content"])
    return system, turns


def _sharegpt(raw: bytes, path: Path) -> list[DatasetEntry]:
    try:
        rows = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise DatasetError(f"--dataset {path}: not JSON ({e})") from None
    entries = []
    for row in rows:
        turns = row.get("conversations") if isinstance(row, dict) else None
        if not isinstance(turns, list) or len(turns) < 2:
            continue
        first, reply = turns[0], turns[1]
        if not all(isinstance(t, dict) and isinstance(t.get("value"), str) for t in (first, reply)):
            continue
        if first.get("from") in ("human", "user") and first["value"] and reply["value"]:
            entry = DatasetEntry(first["value"], None, None, reply["value"], None, None)
            entry.turns = _sharegpt_turns(turns)
            entries.append(entry)
    return entries


def _sharegpt_turns(turns: list[Any]) -> list[Turn]:
    """Every human message that has a reply, with it, up to the first malformed one."""
    out = []
    for human, reply in zip(turns[::2], turns[1::2]):
        if not all(isinstance(t, dict) and isinstance(t.get("value"), str) and t["value"]
                   for t in (human, reply)) or human.get("from") not in ("human", "user"):
            break
        out.append(Turn(human["value"], reply["value"]))
    return out


def _is_messages(value: Any) -> bool:
    return (isinstance(value, list) and bool(value)
            and all(isinstance(m, dict) and "role" in m and "content" in m for m in value))
