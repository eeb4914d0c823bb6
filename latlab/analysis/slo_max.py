"""The answer to "how much load within the SLOs": the highest load of a sweep whose
percentile of every SLO metric meets its limit, with the measured points on both sides
(see `latlab.analysis.capacity` for the definition)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from latlab.analysis.capacity import curve
from latlab.metrics.stats import CONFIDENCE
from latlab.records.sweep import Point, PointRef, SloMax


def _ref(p: Point | None) -> PointRef | None:
    return None if p is None else PointRef(label=p.label, load=p.load, achieved=p.achieved,
                                           run=p.run, values=p.slo_values)


def _answer(slos: dict[str, float], q: float, load: float | None, achieved: float | None,
            tokens: float | None, passing: Point | None, failing: Point | None,
            interpolated: bool, limiting: str | None, statement: str,
            notes: list[str]) -> SloMax:
    return SloMax(slos=slos, percentile=q, load=load, achieved=achieved,
                  output_tokens_per_s=tokens, passing=_ref(passing), failing=_ref(failing),
                  interpolated=interpolated, limiting=limiting, statement=statement, notes=notes)


def slo_max(points: Sequence[Point], slos: dict[str, float], q: float) -> SloMax | None:
    """The highest load meeting `slos` at percentile `q` (see the module's definition), with
    its 95% interval: the same answer from every point's SLO values at the top of their
    intervals (`lo`) and at the bottom (`hi`)."""
    best = _slo_max(points, slos, q)
    if best is None or not any(p.slo_intervals for p in points):
        return best
    bounds = []
    for side in (1, 0):
        moved = [p.model_copy(update={"slo_values": {
            m: p.slo_intervals[m][side] if m in p.slo_intervals else v
            for m, v in p.slo_values.items()}}) for p in points]
        answer = _slo_max(moved, slos, q)
        if answer is not None and side == 0 and answer.failing is None:
            bounds.append(math.inf)  # met past the highest load swept
        else:
            bounds.append(answer.load if answer is not None else None)
    best.lo, best.hi = bounds
    best.level = CONFIDENCE
    return best


def _slo_max(points: Sequence[Point], slos: dict[str, float], q: float) -> SloMax | None:
    ordered = curve(points)
    if not slos or not ordered:
        return None
    name = f"p{q:g}"
    wanted = ", ".join(f"{name} {m} ≤ {v:g} ms" for m, v in slos.items())
    first_fail = next((i for i, p in enumerate(ordered) if not p.passes(slos)), None)
    notes = []
    if first_fail is not None:
        above = [p.label for p in ordered[first_fail + 1:] if p.passes(slos)]
        if above:
            notes.append(f"{', '.join(above)} passed again above the first failing point "
                         f"(noise?); the answer stays below the first failure")
    if first_fail is None:
        top = ordered[-1]
        return _answer(slos, q, top.load, top.achieved, top.output_tokens_per_s, top, None, False,
                      None, f"{wanted}: met at every point measured, up to {top.label}; the "
                      "limit lies above it, unmeasured", notes)
    fail = ordered[first_fail]
    if first_fail == 0:
        return _answer(slos, q, None, None, None, None, fail, False, _worst(fail, slos),
                      f"{wanted}: not met even at the lowest load measured, {fail.label} "
                      f"({_why(fail, slos, name)})", notes)
    ok = ordered[first_fail - 1]
    crossings = {m: _crossing(ok, fail, m, limit) for m, limit in slos.items()
                 if fail.slo_values[m] > limit}
    if not crossings:  # every percentile met, but the server fell behind the offered rate
        return _answer(slos, q, ok.load, ok.achieved, ok.output_tokens_per_s, ok, fail, False,
                       None, f"{wanted}: ≈ {ok.load:.3g} {ok.unit}, the last point that kept up "
                       f"({ok.label}); at {fail.label} the server fell behind "
                       f"({_why(fail, slos, name)})",
                       notes)
    limiting = min(crossings, key=lambda m: crossings[m])
    load = crossings[limiting]
    interpolated = load > ok.load
    share = (load - ok.load) / (fail.load - ok.load) if fail.load > ok.load else 0.0
    achieved = ok.achieved + share * (fail.achieved - ok.achieved)
    tokens = ok.output_tokens_per_s + share * (fail.output_tokens_per_s - ok.output_tokens_per_s)
    how = (f"interpolated linearly in {name} {limiting} between" if interpolated else
           f"{name} {limiting} cannot be interpolated (failed requests at {fail.label}); between")
    statement = (f"{wanted}: ≈ {load:.3g} {ok.unit}, {how} the last passing point {ok.label} "
                 f"({name} {limiting} {ok.slo_values[limiting]:.0f} ms) and the first failing "
                 f"{fail.label} ({name} {limiting} {_ms(fail.slo_values[limiting])})")
    return _answer(slos, q, load, achieved, tokens, ok, fail, interpolated, limiting, statement,
                  notes)


def _crossing(ok: Point, fail: Point, metric: str, limit: float) -> float:
    """Where `metric` reaches `limit` on the line between `ok` and `fail` (ok's load when it
    cannot be interpolated)."""
    a, b = ok.slo_values[metric], fail.slo_values[metric]
    if math.isinf(b) or b <= a or fail.load <= ok.load:
        return ok.load
    return ok.load + (limit - a) / (b - a) * (fail.load - ok.load)


def _why(point: Point, slos: dict[str, float], name: str) -> str:
    """What failed at `point`: the server falling behind, else its worst SLO metric."""
    if point.fell_behind:
        return (f"achieved {point.achieved:.3g} of {point.offered or point.load:.3g} req/s "
                "offered: a point that falls behind meets no SLO")
    worst = _worst(point, slos)
    return f"{name} {worst} {_ms(point.slo_values[worst])}"


def _worst(point: Point, slos: dict[str, float]) -> str:
    return max(slos, key=lambda m: point.slo_values[m] / slos[m])


def _ms(value: float) -> str:
    return "failed requests (∞)" if math.isinf(value) else f"{value:.0f} ms"

