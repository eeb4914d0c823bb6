"""Calibrate from run folders: any server latlab has measured (bench runs, or a sweep's
points), fitted to the same step-cost model as latlab's engine.

Each successful request gives up to two rows of step features with a measured time:

* its **decode**: TPOT is the mean step time over its decode steps, and with a linear cost
  model the mean of the times is the cost of the mean features — the requests decoding
  alongside it (their overlap with its decode span), the context they attend, and the
  prefills that landed in its span (other requests' first tokens), per step;
* its **prefill** (prefill time against prompt length): the server's prefill time when it
  reports one, else — only without any other request in flight, at low load — the client's
  TTFT less the network and the server's preprocessing; a prompt longer than the step budget
  is charged as the chunks chunked prefill would cut, less the prompt tokens the server
  reports it found in its prompt cache.

Per-request costs come from the server timings (medians: preprocess, postprocess, and the
network as the transit beyond the server's total); without them they are zero and the
prefill rows carry them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from latlab.records.calibration import RequestCosts, RequestSpread
from latlab.records.engine import EngineShape
from latlab.records.folder import RunFolder
from latlab.records.predict import OTHER_SERVER
from latlab.records.sweep import SWEEP_JSON
from latlab.records.timeline import RequestTimeline
from latlab.sim.spread import robust_sd
from latlab.sim.stepcost import features

MIN_REQUESTS = 5


class CalibrationError(ValueError):
    """Run folders that cannot calibrate a server; the message says why."""


def run_folders(paths: Sequence[Path]) -> list[RunFolder]:
    """The bench run folders of `paths`: run folders as given, a sweep folder's points."""
    runs = []
    for path in paths:
        path = Path(path)
        if (path / SWEEP_JSON).is_file():
            runs += [RunFolder(p.parent) for p in sorted(path.glob("*/config.json"))]
        elif (path / "config.json").is_file() or (path / "requests.jsonl").is_file():
            runs.append(RunFolder.open(path))
        else:
            raise CalibrationError(f"{path}: neither a run folder nor a sweep folder")
    return runs


def request_costs(records: Sequence[RequestTimeline]) -> RequestCosts:
    """Medians of the server's stage timings and of the network transit; zeros without."""
    samples = _request_samples(records)

    def median(name: str) -> float:
        return float(np.median(samples[name])) if samples.get(name) else 0.0

    if "transit" not in samples:  # no server total: what precedes the prefill is intake
        return RequestCosts(preprocess=max(0.0, median("intake")))
    network = max(0.0, median("transit"))
    return RequestCosts(preprocess=max(0.0, median("preprocess")),
                        postprocess=max(0.0, median("postprocess") + median("tail")),
                        network=network, reject=network)


def request_spread(records: Sequence[RequestTimeline]) -> RequestSpread:
    """How much each per-request cost varies (robust standard deviations, ms)."""
    samples = _request_samples(records)

    def sd(*names: str) -> float:
        return float(np.hypot.reduce([robust_sd(np.asarray(samples[n])) for n in names
                                      if samples.get(n)] or [0.0]))

    return RequestSpread(preprocess=sd("preprocess", "intake"), postprocess=sd("postprocess"),
                         network=sd("transit"))


def _request_samples(records: Sequence[RequestTimeline]) -> dict[str, list[float]]:
    """Per request: the server's preprocess and postprocess, the network transit beyond the
    server's total and the tail after its usage event; without server totals (llama.cpp
    reports its prefill only), the client's wait beyond the prefill of the requests alone in
    flight (`intake`)."""
    timed = [r for r in records if r.ok and r.server is not None and r.server.total is not None]
    if not timed:
        return {"intake": [(r.first_token_ns - r.sent_ns) / 1e6 - r.server.prefill
                           for r in _alone(records)
                           if r.server is not None and r.server.prefill is not None]}
    return {
        "preprocess": [r.server.preprocess for r in timed if r.server.preprocess is not None],
        "postprocess": [r.server.postprocess for r in timed if r.server.postprocess is not None],
        "transit": [((r.usage_ns or r.done_ns) - r.sent_ns) / 1e6 - r.server.total
                    for r in timed if r.sent_ns is not None
                    and (r.usage_ns or r.done_ns) is not None],
        "tail": [(r.done_ns - r.usage_ns) / 1e6 for r in timed
                 if r.done_ns is not None and r.usage_ns is not None]}


def _alone(records: Sequence[RequestTimeline]) -> list[RequestTimeline]:
    """The successful requests sent while no other was in flight, and none joined them."""
    ok = sorted((r for r in records if r.ok and r.sent_ns is not None
                 and r.first_token_ns is not None), key=lambda r: r.sent_ns)
    alone, latest = [], -math.inf  # the latest end of the requests sent before
    for i, r in enumerate(ok):
        later = ok[i + 1].sent_ns if i + 1 < len(ok) else math.inf
        if latest <= r.sent_ns and later >= r.end_ns:
            alone.append(r)
        latest = max(latest, r.end_ns)
    return alone


def rows(records: Sequence[RequestTimeline], costs: RequestCosts, shape: EngineShape
         ) -> tuple[np.ndarray, np.ndarray, np.ndarray, int, int]:
    """(features, ms, when: seconds on the run's clock) of every usable decode and prefill;
    how many of each."""
    ok = [r for r in records if r.ok and r.first_token_ns is not None
          and r.last_token_ns is not None and r.sent_ns is not None]
    if len(ok) < MIN_REQUESTS:
        return np.empty((0, 8)), np.empty(0), np.empty(0), 0, 0
    f = np.array([r.first_token_ns for r in ok], dtype=float) / 1e9
    last = np.array([r.last_token_ns for r in ok], dtype=float) / 1e9
    sent = np.array([r.sent_ns for r in ok], dtype=float) / 1e9
    end = np.array([r.end_ns for r in ok], dtype=float) / 1e9
    n = np.array([r.output_tokens or 1 for r in ok], dtype=float)
    p = np.array([r.prompt_tokens or r.prompt_tokens_planned or 1 for r in ok], dtype=float)
    cached = np.minimum(p - 1, [r.cached_tokens or 0 for r in ok])  # the server's prompt cache
    ctx = p + n / 2  # a decode's mean context over its decode
    out, ms, counts, when = [], [], [], []
    decodes = 0
    for i in np.flatnonzero(n >= 3):
        span = last[i] - f[i]
        if span <= 0:  # its tokens came in one chunk: no decode to time
            continue
        steps = n[i] - 1
        overlap = np.clip(np.minimum(last, last[i]) - np.maximum(f, f[i]), 0, None) / span
        overlap[i] = 1.0
        batch = overlap.sum()
        joined = (f > f[i]) & (f <= last[i])
        chunks = joined.sum() / steps
        out.append([batch + (p[joined].sum()) / steps, batch, chunks, batch + chunks, 0,
                    (overlap * ctx).sum(), (p[joined] ** 2).sum() / steps])
        ms.append(span / steps * 1e3)
        when.append((f[i] + last[i]) / 2)
        counts.append(1)
        decodes += 1
    prefills = 0
    budget = shape.max_num_batched_tokens
    for i, r in enumerate(ok):
        busy = int(((f < f[i]) & (last >= f[i])).sum())
        server = r.server
        if server is not None and server.prefill is not None and server.prefill > 0:
            y = server.prefill
        elif busy == 0 and not ((sent < sent[i]) & (end > sent[i])).any():
            y = (f[i] - sent[i]) * 1e3 - costs.network - costs.preprocess
        else:
            continue
        if y <= 0:
            continue
        context = ((f < f[i]) & (last >= f[i])) @ ctx
        steps, done, attention = 0, cached[i], 0.0
        while done < p[i]:
            chunk = (min(p[i] - done, max(1, budget - busy)) if shape.enable_chunked_prefill
                     else p[i])
            attention += chunk * (done + chunk)
            done += chunk
            steps += 1
        out.append([p[i] - cached[i] + steps * busy, steps * busy, steps, steps * busy + 1, 0,
                    steps * context, attention])
        ms.append(y)
        when.append(f[i])
        counts.append(steps)
        prefills += 1
    if not out:
        return np.empty((0, 8)), np.empty(0), np.empty(0), 0, 0
    return features(out, counts), np.asarray(ms), np.asarray(when), decodes, prefills


def shape_from(records: Sequence[RequestTimeline], given: dict) -> EngineShape:
    """The engine shape: what was given, else another server's defaults (`OTHER_SERVER`:
    vLLM's scheduler limits), the context at least the longest request seen."""
    longest = max(((r.prompt_tokens or 0) + (r.output_tokens or 0) for r in records), default=0)
    values = OTHER_SERVER | {"max_model_len": max(OTHER_SERVER["max_model_len"], longest + 1)}
    values.update({k: v for k, v in given.items() if v is not None})
    return EngineShape(**values)
