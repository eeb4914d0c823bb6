"""How many torch intra-op threads a step runs on, out of `--threads`.

Splitting an operator over threads pays only when each thread gets enough work: every parallel
region ends at a barrier where the threads wait for each other, and a decode step of a small
model is some 200 operators of a few microseconds each. Split, such a step gains little on a
quiet machine, and on a busy one it loses many times over: each barrier waits for a thread
the kernel has just given its core to someone else (`benchmarks/engine_step.py --threads 1 2
--split-all` measures it). So a step takes all the threads only when its largest matrix
product (the MLP's, tokens x hidden x intermediate multiply-adds) is big enough: prefill
chunks of the small presets, every step of a model of a billion parameters; else one.
"""

from __future__ import annotations

import torch

# Multiply-adds of a step's MLP product from which all threads pay: 43 tokens of the
# `default` preset (hidden 384, intermediate 1024), any step of a 1B Llama (2048 x 8192).
PARALLEL_MIN_MACS = 1 << 24


class IntraOpThreads:
    """Sets the calling thread's torch intra-op threads for each step (`use`)."""

    def __init__(self, threads: int, hidden_size: int, intermediate_size: int) -> None:
        self.threads = threads
        self.min_tokens = -(-PARALLEL_MIN_MACS // (hidden_size * intermediate_size))

    def for_tokens(self, num_tokens: int) -> int:
        return self.threads if num_tokens >= self.min_tokens else 1

    def use(self, num_tokens: int) -> None:
        wanted = self.for_tokens(num_tokens)
        if torch.get_num_threads() != wanted:  # per thread in OpenMP; cheap either way
            torch.set_num_threads(wanted)
