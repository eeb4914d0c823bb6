"""Replay timed requests against an in-process `LLMEngine` (shared by the technique benchmarks).

A request's clock starts at its scheduled arrival: TTFT = first token − arrival, prefill =
first token − first scheduled, TPOT = (last − first token) / (output tokens − 1).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from latlab.engine.engine import LLMEngine
from latlab.engine.sampling_params import SamplingParams
from latlab.engine.sequence import Sequence
from latlab.metrics.stats import percentile


@dataclass
class Request:
    arrival_s: float
    prompt: list[int]
    params: SamplingParams
    priority: int = 0
    tenant: str | None = None


def replay(engine: LLMEngine, requests: list[Request], concurrency: int | None = None,
           ) -> tuple[list[Sequence], float]:
    """Run `requests` (sorted by arrival) to completion; with `concurrency`, a closed loop of
    that many users instead (arrivals ignored). Returns the sequences and the elapsed seconds."""
    start = time.perf_counter_ns()
    seqs: list[Sequence] = []
    arrivals = [start + int(r.arrival_s * 1e9) for r in requests]
    while len(seqs) < len(requests) or engine.has_unfinished():
        now = time.perf_counter_ns()
        while len(seqs) < len(requests) and (
                (concurrency is None and arrivals[len(seqs)] <= now) or
                (concurrency is not None and len(engine.sequences) < concurrency)):
            r = requests[len(seqs)]
            received = arrivals[len(seqs)] if concurrency is None else now
            seqs.append(engine.add_request(f"r{start}-{len(seqs)}", r.prompt, r.params,
                                           received_ns=received, priority=r.priority,
                                           tenant=r.tenant))
        if engine.has_unfinished():
            engine.step()
        elif len(seqs) < len(requests):
            time.sleep(max(0.0, (arrivals[len(seqs)] - time.perf_counter_ns()) / 1e9))
    return seqs, (time.perf_counter_ns() - start) / 1e9


def ms(values: list[float], p: float) -> float:
    return percentile(sorted(values), p) if values else float("nan")


def ttft_ms(seqs: list[Sequence]) -> list[float]:
    return [(s.times.first_token - s.times.received) / 1e6 for s in seqs
            if s.times.first_token is not None]


def prefill_ms(seqs: list[Sequence]) -> list[float]:
    return [(s.times.first_token - s.times.first_scheduled) / 1e6 for s in seqs
            if s.times.first_token is not None]


def tpot_ms(seqs: list[Sequence]) -> list[float]:
    return [(s.times.last_token - s.times.first_token) / 1e6 / (s.num_output_tokens - 1)
            for s in seqs if s.num_output_tokens > 1]


def output_tokens_per_s(seqs: list[Sequence], elapsed_s: float) -> float:
    return sum(s.num_output_tokens for s in seqs) / elapsed_s
