"""The requests of a simulated run, from the same specs as `latlab bench` or from a run folder.

Specs (`WorkloadConfig`, `ArrivalConfig`): the arrival times are
`latlab.load.workload.arrivals`' own (the same schedule for the same seed); token lengths are
drawn from the same
`LengthDistribution`s, in bulk (`sample_many`: the same distributions, not request for
request the prompts bench would send), and so are the shared prefix, tenants and priorities.
A dataset is read through `latlab.load.workload.requests.Workload` (prompt lengths in the target's
tokens), its entries reused in turn. A run folder replays its own requests: their scheduled
times and their prompt and output lengths as measured. A trace (`--trace`) gives its window's
times, lengths (under --length-scale) and prompt blocks, which the replicas' block managers
share as a server's prefix cache would; a trace's sessions are replayed at their times.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field

import numpy as np

from latlab.load.workload.arrivals import arrival_times, user_start_times
from latlab.load.workload.datasets import load_dataset
from latlab.load.workload.requests import Workload
from latlab.load.workload.traces import block_tokens, replay_window, scaled
from latlab.records.arrivals import ArrivalConfig
from latlab.records.folder import RunFolder
from latlab.records.lengths import WorkloadError
from latlab.records.workload import WorkloadConfig

CHUNK = 4096


@dataclass
class Blocks:
    """A trace's prompt blocks: request `i`'s hash ids, flat, and the tokens of one block."""

    ids: np.ndarray
    starts: np.ndarray  # request i's ids are ids[starts[i]:starts[i + 1]]
    tokens: int

    def of(self, i: int) -> np.ndarray:
        return self.ids[self.starts[i]:self.starts[i + 1]]


@dataclass
class Lengths:
    """Per request: prompt and output tokens, whether it shares the prefix, its labels, and
    (a trace's) its prompt blocks."""

    prompt: np.ndarray
    output: np.ndarray
    shared: np.ndarray
    tenant: list[str | None] = field(default_factory=list)
    priority: list[int | None] = field(default_factory=list)
    blocks: Blocks | None = None


@dataclass
class SimWorkload:
    """What the simulated clients send: open loop (`arrival`, seconds from the start) or
    closed loop (`users` starting at `starts`), each request's lengths drawn on demand."""

    config: WorkloadConfig
    arrivals: ArrivalConfig
    requests: int | None
    duration_s: float | None
    arrival: np.ndarray | None = None
    starts: list[float] = field(default_factory=list)
    lengths: Lengths | None = None
    _rng: np.random.Generator | None = None
    _dataset: Lengths | None = None

    @property
    def prefix_tokens(self) -> int:
        return self.config.prefix_tokens

    def ensure(self, n: int) -> Lengths:
        """Lengths for at least the first `n` requests."""
        have = 0 if self.lengths is None else len(self.lengths.prompt)
        if n > have:
            more = self._draw(have, max(n - have, CHUNK if self.requests is None else 0))
            self.lengths = more if self.lengths is None else _concat(self.lengths, more)
        return self.lengths

    def _draw(self, start: int, n: int) -> Lengths:
        c = self.config
        if self._rng is None:
            self._rng = np.random.default_rng([c.seed, 5])
        rng = self._rng
        if self._dataset is not None:
            idx = np.arange(start, start + n) % len(self._dataset.prompt)
            d = self._dataset
            return Lengths(d.prompt[idx], d.output[idx], d.shared[idx],
                           [d.tenant[i] for i in idx], [d.priority[i] for i in idx])
        prompt = c.prompt_tokens.sample_many(rng, n)
        output = c.output_tokens.sample_many(rng, n)
        shared = (rng.random(n) < c.prefix_fraction) if c.prefix_tokens else np.zeros(n, bool)
        prompt = prompt + np.where(shared, c.prefix_tokens, 0)
        return Lengths(prompt, output, shared, _labels(rng, c.tenants, n),
                       _labels(rng, c.priorities, n))


def build(config: WorkloadConfig, arrivals: ArrivalConfig, requests: int | None,
          duration_s: float | None) -> SimWorkload:
    """The simulated clients of a bench-like run (stopped by `requests` or `duration_s`)."""
    if arrivals.process == "trace":
        return _trace(config, arrivals, requests, duration_s)
    w = SimWorkload(config, arrivals, requests, duration_s)
    if config.dataset is not None:
        w._dataset = _dataset(config, requests)
    if arrivals.open_loop:
        times = []
        for t in arrival_times(arrivals):
            if (requests is not None and len(times) >= requests) or (
                    duration_s is not None and t >= duration_s):
                break
            times.append(t)
        w.arrival = np.asarray(times, dtype=float)
        w.ensure(len(times))
    else:
        w.starts = user_start_times(arrivals.users, arrivals.ramp_s)
        if requests is not None:
            w.ensure(requests)
    return w


def _trace(config: WorkloadConfig, arrivals: ArrivalConfig, requests: int | None,
           duration_s: float | None) -> SimWorkload:
    """The trace's window: its times, its lengths scaled (drawn from the workload's
    distributions where it gives none), its blocks (flat, 8 bytes an id) and labels."""
    rng = np.random.default_rng([config.seed, 5])
    scale = arrivals.length_scale
    times, prompt, output = array("d"), array("q"), array("q")
    ids, starts = array("q"), array("q", [0])
    tenant, priority = [], []
    for replayed in replay_window(arrivals, duration_s, requests)[1]:
        row = replayed.row
        times.append(replayed.offset_s)
        prompt.append(scaled(row.prompt_tokens, scale) if row.prompt_tokens
                      else config.prompt_tokens.sample(rng))
        output.append(scaled(row.output_tokens, scale) if row.output_tokens
                      else config.output_tokens.sample(rng))
        tenant.append(row.tenant)
        priority.append(row.priority)
        ids.extend(row.hash_ids or ())
        starts.append(len(ids))
    if not times:
        raise WorkloadError(f"--trace {arrivals.trace}: no request in the window")
    n = len(times)
    w = SimWorkload(config, arrivals, n, duration_s, arrival=np.frombuffer(times, dtype=float))
    w.lengths = Lengths(np.frombuffer(prompt, np.int64), np.frombuffer(output, np.int64),
                        np.zeros(n, bool), tenant, priority,
                        Blocks(np.frombuffer(ids, np.int64), np.frombuffer(starts, np.int64),
                               block_tokens(scale)) if ids else None)
    return w


def _dataset(config: WorkloadConfig, requests: int | None) -> Lengths:
    """Each dataset entry's lengths as bench would send them (the target's tokenizer)."""
    workload = Workload(config)
    entries = len(load_dataset(config.dataset))
    n = min(entries, requests or entries)
    specs = [workload.request(i) for i in range(n)]
    return Lengths(np.asarray([s.prompt_tokens for s in specs], dtype=np.int64),
                   np.asarray([s.max_tokens for s in specs], dtype=np.int64),
                   np.zeros(n, bool), [s.tenant for s in specs], [s.priority for s in specs])


def replay(run: RunFolder) -> SimWorkload:
    """The requests a run folder sent, at their scheduled times, with their measured lengths
    (prompt tokens from the server's usage, output tokens as generated or asked for)."""
    config = run.read_config()
    if config.bench is None:
        raise WorkloadError(f"{run.path}: not a bench run (no bench settings in config.json)")
    records = replayed_records(run)
    if not records:
        raise WorkloadError(f"{run.path}: no requests to replay")
    t0 = config.clock.t0_ns if config.clock.t0_ns is not None else records[0].origin_ns
    prompt = [r.prompt_tokens or r.prompt_tokens_planned or 1 for r in records]
    output = [r.output_tokens if r.ok and r.output_tokens else (r.max_tokens or 1)
              for r in records]
    bench = config.bench
    arrivals = bench.arrivals.model_copy(update={"process": "trace"}) if bench.arrivals.open_loop \
        else bench.arrivals
    w = SimWorkload(bench.workload, arrivals, len(records), bench.duration_s)
    w.lengths = Lengths(np.asarray(prompt, dtype=np.int64), np.asarray(output, dtype=np.int64),
                        np.zeros(len(records), bool), [r.tenant for r in records],
                        [r.priority for r in records])
    if bench.arrivals.open_loop:
        w.arrival = np.maximum(0.0, (np.asarray([r.origin_ns for r in records]) - t0) / 1e9)
    else:
        w.starts = user_start_times(bench.arrivals.users, bench.arrivals.ramp_s)
    return w


def replayed_records(run: RunFolder) -> list:
    """The records `replay` sends, in the order it sends them (request i of the replay)."""
    return sorted((r for r in run.read_records() if r.origin_ns is not None),
                  key=lambda r: r.origin_ns)


def _labels(rng: np.random.Generator, weights: dict, n: int) -> list:
    if not weights:
        return [None] * n
    labels = list(weights)
    p = np.asarray([weights[k] for k in labels], dtype=float)
    return [labels[i] for i in rng.choice(len(labels), size=n, p=p / p.sum())]


def _concat(a: Lengths, b: Lengths) -> Lengths:
    return Lengths(np.concatenate([a.prompt, b.prompt]), np.concatenate([a.output, b.output]),
                   np.concatenate([a.shared, b.shared]), a.tenant + b.tenant,
                   a.priority + b.priority)
