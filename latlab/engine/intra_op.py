"""How many torch intra-op threads a step runs on, out of `--threads`.

Splitting an operator over threads pays only when each thread gets enough work and a core to
do it on: every parallel region ends at a barrier where the threads wait for each other. A
decode step of a small model is some 200 operators of a few microseconds each, so split, it
gains little on a quiet machine; and on a busy one every barrier waits for a thread the kernel
has just given its core to someone else, up to ten times the step's time
(`benchmarks/engine_step.py --split-all --threads 1 2` measures it). So a step takes more
than one thread only when its largest matrix product (the MLP's, tokens x hidden x
intermediate multiply-adds) is big enough: prefill chunks of the small presets, every step of
a model of a billion parameters; and then only as many threads as the machine has cores that
other processes leave free (`FreeCores`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import torch

# Multiply-adds of a step's MLP product from which all threads pay: 43 tokens of the
# `default` preset (hidden 384, intermediate 1024), any step of a 1B Llama (2048 x 8192).
PARALLEL_MIN_MACS = 1 << 24


def _run_delay_s() -> float:
    """Seconds this process's threads have waited for a core (Linux; 0 elsewhere)."""
    total = 0
    for stat in Path("/proc/self/task").glob("*/schedstat"):
        try:
            total += int(stat.read_text().split()[1])
        except (OSError, IndexError, ValueError):  # a thread that just ended
            pass
    return total / 1e9


def _sample() -> tuple[float, float]:
    """Now, and the CPU seconds this process could have had: the machine's idle time plus
    its own CPU time, less the time its threads waited for a core."""
    machine, own = psutil.cpu_times(), psutil.Process().cpu_times()
    return time.monotonic(), (machine.idle + getattr(machine, "iowait", 0.0) + own.user
                              + own.system - _run_delay_s())


class FreeCores:
    """The cores other processes left this one over the last `every_s` seconds or more: the
    machine's idle time plus this process's own, less the time its threads waited for a
    core (which a thread sharing its core with another process does), per second."""

    def __init__(self, every_s: float = 0.5,
                 sample: Callable[[], tuple[float, float]] = _sample) -> None:
        self.every_s, self._sample = every_s, sample
        self._last = sample()
        self.free = float(os.cpu_count() or 1)  # until the first window has passed

    def __call__(self) -> float:
        if time.monotonic() - self._last[0] < self.every_s:
            return self.free
        now = self._sample()
        if now[0] > self._last[0]:
            self.free = (now[1] - self._last[1]) / (now[0] - self._last[0])
            self._last = now
        return self.free


class IntraOpThreads:
    """Sets the calling thread's torch intra-op threads for each step (`use`)."""

    def __init__(self, threads: int, hidden_size: int, intermediate_size: int,
                 free_cores: Callable[[], float] | None = None) -> None:
        self.threads = threads
        self.min_tokens = -(-PARALLEL_MIN_MACS // (hidden_size * intermediate_size))
        self.free_cores = free_cores or (FreeCores() if threads > 1 else None)

    def for_tokens(self, num_tokens: int) -> int:
        if self.threads == 1 or num_tokens < self.min_tokens:
            return 1
        return max(1, min(self.threads, round(self.free_cores())))

    def use(self, num_tokens: int) -> None:
        wanted = self.for_tokens(num_tokens)
        if torch.get_num_threads() != wanted:  # per thread in OpenMP; cheap either way
            torch.set_num_threads(wanted)
