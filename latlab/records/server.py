"""What the measured server says about its own settings (`config.json` → `target.settings`),
in one shape whatever the server: the knobs latlab's advice depends on, and everything it
said (`raw`). A field the server did not tell is None: advice then says "if not already on"."""

from __future__ import annotations

from typing import Any

from latlab.records.summary import Record


class ServerSettings(Record):
    sources: list[str] = []  # where each part came from: "/server_info", "/props", ...
    version: str | None = None
    chunked_prefill: bool | None = None
    step_tokens: int | None = None  # the token budget of one engine step (a prefill chunk)
    prefix_caching: bool | None = None
    max_num_seqs: int | None = None  # sequences batched at once (llama.cpp: slots)
    speculative: str | None = None  # the speculative decoding method, "" for none
    scheduling: str | None = None
    raw: dict[str, Any] = {}

    def known(self) -> bool:
        return bool(self.sources)
