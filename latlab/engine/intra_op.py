"""How many torch intra-op threads a step runs on, out of `--threads`.

Splitting an operator over threads pays only when each thread gets enough work and the other
cores are free: every parallel region ends at a barrier where the threads wait for each other,
and a decode step of a small model is some 200 operators of a few microseconds each. On a
quiet machine such a step split over two cores gains; on a busy one it loses many times over,
each barrier waiting for a thread the kernel has just given its core to someone else
(`benchmarks/engine_step.py --threads 1 2 --split-all` measures it). So:

* a step whose largest matrix product (the MLP's, tokens x hidden x intermediate
  multiply-adds) is big takes all the threads: prefill chunks of the small presets, every
  step of a model of a billion parameters;
* a smaller step runs on whichever of one thread or all of them has been faster lately, for
  steps of its size (a power-of-two bucket of its token count): each is timed, a running
  mean kept per choice, and the other choice tried again now and then, less and less often
  while it keeps losing (so on a busy host the trials cost little, and when the host calms
  down the split comes back).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

# Multiply-adds of a step's MLP product from which all threads pay: 43 tokens of the
# `default` preset (hidden 384, intermediate 1024), any step of a 1B Llama (2048 x 8192).
PARALLEL_MIN_MACS = 1 << 24
# The weight of a new step time in its choice's running mean.
SMOOTHING = 0.2
# Steps each choice runs first, one after the other, before the means decide.
SAMPLES_FIRST = 3
# A trial of the losing choice: this many steps in a row, their plain mean its new mean;
# the next one FIRST_TRIAL_AFTER steps of the bucket later, that gap doubled after each trial
# it loses (at most MAX_TRIAL_AFTER), reset when it wins.
TRIAL_STEPS = 4
FIRST_TRIAL_AFTER = 16
MAX_TRIAL_AFTER = 1024


@dataclass
class Choice:
    """One thread or all of them, for the steps of one size: the running mean step time (ns)
    of each, and when the losing one is tried again."""

    options: tuple[int, int]
    mean_ns: dict[int, float] = field(default_factory=dict)
    samples: dict[int, int] = field(default_factory=dict)
    steps: int = 0
    trial_after: int = FIRST_TRIAL_AFTER
    next_trial: int = FIRST_TRIAL_AFTER
    trial: int | None = None  # the choice on trial
    trial_left: int = 0  # its steps still to run
    trial_done: int = 0  # and run

    def best(self) -> int:
        return min(self.options, key=lambda n: self.mean_ns[n])

    def pick(self) -> int:
        self.steps += 1
        if self.trial_left:
            self.trial_left -= 1
            return self.trial
        fewest = min(self.options, key=lambda n: self.samples.get(n, 0))
        if self.samples.get(fewest, 0) < SAMPLES_FIRST:
            return fewest
        if self.steps < self.next_trial:
            return self.best()
        self.trial = next(n for n in self.options if n != self.best())
        self.trial_left, self.trial_done = TRIAL_STEPS - 1, 0
        return self.trial

    def record(self, threads: int, elapsed_ns: int) -> None:
        self.samples[threads] = self.samples.get(threads, 0) + 1
        old = self.mean_ns.get(threads)
        if threads == self.trial:  # measured afresh: the plain mean of the trial's steps
            self.trial_done += 1
            old = elapsed_ns if self.trial_done == 1 else old
            self.mean_ns[threads] = old + (elapsed_ns - old) / self.trial_done
            if not self.trial_left:
                won = self.best() == threads
                self.trial = None
                self.trial_after = (FIRST_TRIAL_AFTER if won
                                    else min(2 * self.trial_after, MAX_TRIAL_AFTER))
                self.next_trial = self.steps + self.trial_after
            return
        self.mean_ns[threads] = (elapsed_ns if old is None
                                 else old + SMOOTHING * (elapsed_ns - old))


class IntraOpThreads:
    """Sets the calling thread's torch intra-op threads for each step (`use`), and learns
    from each step's time (`done`) which choice pays for the small ones."""

    def __init__(self, threads: int, hidden_size: int, intermediate_size: int,
                 clock=time.perf_counter_ns) -> None:
        self.threads = threads
        self.min_tokens = -(-PARALLEL_MIN_MACS // (hidden_size * intermediate_size))
        self.clock = clock
        self.choices: dict[int, Choice] = {}
        self._running: tuple[Choice, int, int] | None = None

    def for_tokens(self, num_tokens: int) -> int:
        """The threads a step of `num_tokens` tokens runs on now."""
        if self.threads == 1 or num_tokens >= self.min_tokens:
            return self.threads
        choice = self.choices.setdefault(num_tokens.bit_length(), Choice((1, self.threads)))
        return choice.pick()

    def use(self, num_tokens: int) -> None:
        """Before a step: its threads; `done` after it times the step."""
        wanted = self.for_tokens(num_tokens)
        if torch.get_num_threads() != wanted:  # per thread in OpenMP; cheap either way
            torch.set_num_threads(wanted)
        choice = self.choices.get(num_tokens.bit_length())
        learning = self.threads > 1 and num_tokens < self.min_tokens
        self._running = (choice, wanted, self.clock()) if learning else None

    def done(self) -> None:
        """After the step's results are on the host."""
        if self._running is not None:
            choice, threads, start = self._running
            choice.record(threads, self.clock() - start)
            self._running = None
