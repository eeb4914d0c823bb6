"""What the measured server says about its own settings (`config.json` → `target.settings`),
in one shape whatever the server: the knobs latlab's advice depends on, and everything it
said (`raw`). A field the server did not tell is None: advice then says "if not already on"."""

from __future__ import annotations

from typing import Any

from latlab.records.engine import EngineShape
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
    device: str | None = None  # where the engine computes: "cpu", "cuda", ...
    raw: dict[str, Any] = {}

    def known(self) -> bool:
        return bool(self.sources)

    @classmethod
    def of_shape(cls, shape: EngineShape) -> ServerSettings:
        """The settings a simulated replica of `shape` runs with (a predicted run's server)."""
        return cls(sources=["the calibration's engine"],
                   chunked_prefill=shape.enable_chunked_prefill,
                   step_tokens=shape.max_prefill_tokens or shape.max_num_batched_tokens,
                   prefix_caching=shape.enable_prefix_caching, max_num_seqs=shape.max_num_seqs,
                   scheduling="fair_share" if shape.fair_share else shape.scheduling_policy)
