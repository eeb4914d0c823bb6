"""One possible world a prediction draws from a calibration's spread (`Draw`): the step
costs' level, their drift from window to window, the machine's slow stretches and each
request's costs outside the engine.

    draw = Draw.make(spread, [seed, d], quantile)   # world d, its level at that quantile
    dt *= draw.speed(now)          # a step starting at `now` (s) costs this many times more
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from latlab.records.calibration import Spread
from latlab.sim import stretches as stretch
from latlab.sim.spread import level_dof, level_quantile, level_sd


@dataclass
class Draw:
    """One possible world for a simulation: step costs × `exp(level + drift of the window)`
    × the slow stretches' factor then (`stretches`, where the calibration fitted them; a
    step the scheduler decides, also its own jitter), each request's costs outside the
    engine off the calibration's by its own draw.

    Each part comes from its own stream (the windows' drift from `rng`, the requests' costs
    from `requests_rng`, the stretches from theirs), and the drift and the stretches are
    drawn in time order whatever asks for them when: two simulations of the same world (a
    setting and its change) see the same drift, stretches and requests' costs at the same
    times. (The steps' own jitter comes in the order the steps ask: the same draws, step by
    step, on both sides.)"""

    level: float
    drift: float
    window_s: float
    request_sd: tuple[float, float]  # preprocess (with the network's), postprocess (s)
    rng: np.random.Generator
    requests_rng: np.random.Generator | None = None
    stretches: stretch.StretchDraw | None = None
    _windows: list[float] = field(default_factory=list)
    _overheads: np.ndarray = field(default_factory=lambda: np.zeros((0, 2)))

    @classmethod
    def make(cls, spread: Spread, seed: int | list[int], quantile: float | None = None) -> Draw:
        """A world from `seed`: its level at the `quantile` of the levels the spread allows
        (drawn at random when None), its drift, stretches and requests' costs from the
        seed's streams."""
        windows, requests, slow, steps = (np.random.default_rng(s)
                                          for s in np.random.SeedSequence(seed).spawn(4))
        if quantile is None:
            dof = level_dof(spread)
            z = windows.standard_t(dof) if math.isfinite(dof) else windows.standard_normal()
            level = float(z * level_sd(spread))
        else:
            level = level_quantile(spread, quantile)
        r = spread.request
        stretches = (stretch.StretchDraw(spread.stretches, slow, steps)
                     if spread.stretches is not None else None)
        return cls(level=level, drift=spread.drift, window_s=spread.window_s,
                   request_sd=(math.hypot(r.preprocess, r.network) / 1e3, r.postprocess / 1e3),
                   rng=windows, requests_rng=requests, stretches=stretches)

    def speed(self, t: float) -> float:
        """How many times the calibrated cost a step starting at `t` (s) takes (its own
        jitter aside: `step_speed`)."""
        w = int(t / self.window_s) if t > 0 else 0
        while len(self._windows) <= w:
            self._windows.append(math.exp(self.level + self.drift * self.rng.standard_normal()))
        if self.stretches is None:
            return self._windows[w]
        return self._windows[w] * self.stretches.factor(t)

    def step_speed(self, t: float) -> float:
        """`speed` of one step the scheduler decided, with that step's own jitter."""
        factor = self.speed(t)
        return factor if self.stretches is None else factor * self.stretches.step()

    def steady_until(self, t: float) -> float:
        """Until when (s) `speed` stays as it is at `t`: a decode run charged in closed form
        ends there. (The windows' drift is not cut at: a run's start decides it, as it
        always has.)"""
        return math.inf if self.stretches is None else self.stretches.until(t)

    def overheads(self, n: int) -> np.ndarray:
        """`[n, 2]` seconds added to the preprocess (the network's spread with it, on the
        way in) and postprocess of the first `n` requests; the simulator keeps each cost at
        zero or more."""
        if len(self._overheads) < n:
            rng = self.requests_rng if self.requests_rng is not None else self.rng
            more = rng.standard_normal((n - len(self._overheads), 2)) * np.asarray(
                self.request_sd)
            self._overheads = np.vstack([self._overheads, more])
        return self._overheads[:n]
