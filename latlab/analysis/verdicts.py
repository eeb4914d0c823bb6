"""What a comparison decides about one statistic: better, worse, same, or can't tell.

The evidence is replicates (`replicates.py`): each side's rounds in `latlab ab`, each run's
time blocks in `latlab compare`. The statistic (a p99 TTFT, an output rate) is taken on each
replicate, and the change is the ratio of the sides' geometric means with a two-sample t
interval on the logs (pooled variance, n_A + n_B − 2 degrees of freedom). Logs, because a
server's timings vary in proportion to their size: a setting that makes TTFT 20× slower
spreads its rounds 20× wider in milliseconds but not in ratio, and a band in milliseconds
called that "the same".

With δ the minimum effect:

* same — the whole interval lies inside ±δ (an equivalence test: the change is too small to
  matter, with confidence; two one-sided tests at α each, so the 1 − 2α interval);
* better / worse — the interval excludes no change and the estimate is at least δ; from two
  single runs (`strict`: their blocks cannot see the drift between runs) the whole interval
  must also lie past δ, and they are never "same" (a drift between the runs as large as
  δ would not show in their blocks);
* can't tell — anything else, with roughly how many more rounds would decide.

Error rates, each family of statistics at α by Bonferroni within it (`alpha`): the ones an
A/B decides on (`--decide-on`; by default the headline ones, `HEADLINE`, each at α/5), the
headline ones it does not decide on, and all the others; so the intervals that decide stay
narrow however many rows are shown. A sequential A/B spends each α over its looks, each look
tested at its increment (`look_share`), and spends the two kinds of error apart: a false
better or worse early (a Pocock-type function: a 2× change shows at the first look), a
false same late (a power function, t^8: an interval narrow enough for "same" takes most of
the rounds, and α spent before them is wasted). The final look spends what is left.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from latlab.records.verdict import HEADLINE, Verdict

FAMILY_ALPHA = 0.05
MAX_MORE_ROUNDS = 50
SAME_POWER = 8  # the α against a false "same" is spent as t^8 (`same_spent`)
# From this many pairs on an A/B's rounds are compared pair by pair (`paired_interval`): the
# drift a pair shares cancels, for half the degrees of freedom, which cost more than a slow
# drift saves in the first looks (3 pairs: t with 2 degrees of freedom, not 4) and less
# from here (5, not 10).
PAIRED_FROM = 6
STRICT_HINT = "two single runs cannot see the drift between runs: use latlab ab"


def alpha(key: str, keys: Sequence[str], decide_on: Sequence[str] = HEADLINE) -> float:
    """The α of `key`'s test among the compared `keys`: Bonferroni within its family, the
    keys decided on (`decide_on`), the headline keys not decided on, or the others."""
    others = [k for k in keys if k not in decide_on and k not in HEADLINE]
    for family in (tuple(decide_on), [k for k in HEADLINE if k not in decide_on], others):
        if key in family:
            return FAMILY_ALPHA / len(family)
    return FAMILY_ALPHA


def spent(fraction: float) -> float:
    """The share of the α against a false better or worse spent once `fraction` of the most
    rounds have run: Lan and DeMets' Pocock-type function ln(1 + (e − 1)·t), which spends
    early for effects that show early."""
    return math.log1p((math.e - 1) * min(max(fraction, 0.0), 1.0))


def same_spent(fraction: float) -> float:
    """The share of the α against a false "same" spent once `fraction` of the most rounds
    have run: Kim and DeMets' power function t^ρ, ρ = 8. An interval inside ±δ takes most of
    the rounds (a 15 % spread between rounds and a 20 % minimum effect: 8 or more a side),
    so spending early would only narrow the looks that can say "same"."""
    return min(max(fraction, 0.0), 1.0) ** SAME_POWER


@dataclass(frozen=True, slots=True)
class LookShare:
    """The shares of α one look spends: against a false better or worse (`change`) and
    against a false same (`same`)."""

    change: float = 1.0
    same: float = 1.0


def look_share(rounds: int, previous: int, most: int, final: bool = False) -> LookShare:
    """The shares of α a look after `rounds` rounds may spend, the previous look having been
    after `previous` (0: none), of at most `most`; a `final` look (no more rounds will run:
    known before looking) spends what is left."""
    now = 1.0 if final else rounds / most
    return LookShare(spent(now) - spent(previous / most),
                     same_spent(now) - same_spent(previous / most))


@dataclass(frozen=True, slots=True)
class RatioInterval:
    """B against A as a relative change (B / A − 1), its interval, and what it rests on."""

    estimate: float
    low: float
    high: float
    confidence: float
    units: tuple[int, int]  # replicates a side
    half_width: float  # of the interval on the scale it was taken on
    logs: bool = True  # taken on the logs (else on the values, relative to A's mean)

    def more_rounds(self, min_effect: float) -> int | None:
        """About how many more replicates a side would narrow the interval enough to
        decide (the t quantile held fixed: a lower bound); None when nothing would."""
        if self.logs:
            d, bound = abs(math.log1p(self.estimate)), math.log1p(min_effect)
        else:
            d, bound = abs(self.estimate), min_effect
        room = d if d >= bound else bound - d  # to exclude no change, or to fit inside ±δ
        if room <= 0 or not 0 < self.half_width < math.inf or not math.isfinite(room):
            return None
        n = max(self.units)
        needed = math.ceil(n * (self.half_width / room) ** 2) - n
        return max(needed, 1) if needed <= MAX_MORE_ROUNDS else None


def ratio_interval(a: Sequence[float], b: Sequence[float],
                   confidence: float) -> RatioInterval | None:
    """The t interval of B / A − 1 from each side's replicate values: on their logs, or
    where a replicate is 0 (a rate), on the values relative to A's mean; where A is 0 in
    every replicate, infinite if B's excess over it is significant, else from 0 to
    infinity. None with fewer than three replicates in all, one a side, or a negative one."""
    va, vb = np.asarray(a, float), np.asarray(b, float)
    if len(va) < 1 or len(vb) < 1 or len(va) + len(vb) < 3 \
            or not (np.isfinite(va).all() and np.isfinite(vb).all()):
        return None
    if (va > 0).all() and (vb > 0).all():
        d, half = _t_difference(np.log(va), np.log(vb), confidence)
        return RatioInterval(math.expm1(d), math.expm1(d - half), math.expm1(d + half),
                             confidence, (len(va), len(vb)), half)
    if (va < 0).any() or (vb < 0).any():
        return None
    scale = float(va.mean())
    if scale == 0:  # goodput 0 → 5 req/s: no ratio, but B's excess can still be shown
        d, half = _t_difference(va, vb, confidence)
        low = math.inf if d - half > 0 else 0.0
        return RatioInterval(math.inf if d > 0 else 0.0, low, math.inf if d > 0 else 0.0,
                             confidence, (len(va), len(vb)), math.inf, logs=False)
    d, half = _t_difference(va / scale, vb / scale, confidence)
    return RatioInterval(d, d - half, d + half, confidence, (len(va), len(vb)), half,
                         logs=False)


def paired_interval(a: Sequence[float], b: Sequence[float],
                    confidence: float) -> RatioInterval | None:
    """The t interval of B / A − 1 from pairs of replicates (`a[i]` beside `b[i]`, run back to
    back): on the logs of each pair's ratio, n − 1 degrees of freedom. A drift slower than a
    pair cancels in each ratio. None with fewer than three pairs, or a value not positive
    (rates of 0 are compared unpaired)."""
    va, vb = np.asarray(a, float), np.asarray(b, float)
    if len(va) != len(vb) or len(va) < 3 or not ((va > 0).all() and (vb > 0).all()) \
            or not (np.isfinite(va).all() and np.isfinite(vb).all()):
        return None
    from scipy.stats import t as student

    ratios = np.log(vb) - np.log(va)
    d, n = float(ratios.mean()), len(ratios)
    half = float(student.ppf(1 - (1 - confidence) / 2, n - 1)) * float(
        ratios.std(ddof=1)) / math.sqrt(n)
    return RatioInterval(math.expm1(d), math.expm1(d - half), math.expm1(d + half),
                         confidence, (n, n), half)


def _t_difference(a: np.ndarray, b: np.ndarray, confidence: float) -> tuple[float, float]:
    """mean(b) − mean(a) and the half-width of its two-sample t interval (pooled variance)."""
    from scipy.stats import t as student

    df = len(a) + len(b) - 2
    pooled = (np.sum((a - a.mean()) ** 2) + np.sum((b - b.mean()) ** 2)) / df
    se = math.sqrt(pooled * (1 / len(a) + 1 / len(b)))
    return float(b.mean() - a.mean()), float(student.ppf(1 - (1 - confidence) / 2, df)) * se


@dataclass(frozen=True, slots=True)
class Judgement:
    verdict: Verdict
    why: str | None = None  # for same and can't tell: the reason, and what would decide
    interval: RatioInterval | None = None  # the one the verdict rests on


def judge(interval: RatioInterval | None, min_effect: float, lower_is_better: bool,
          strict: bool, unit_name: str = "rounds",
          same: RatioInterval | None = None) -> Judgement:
    """The verdict on one statistic's `interval`, tested against no change; `same`, the
    interval the equivalence test takes (at its own confidence: two one-sided tests), by
    default `interval` itself (module docstring)."""
    if interval is None:
        return Judgement("can't tell", f"too few {unit_name} with a value on both sides")
    same = same if same is not None else interval
    if -min_effect < same.low and same.high < min_effect:
        if strict:  # inside ±δ within each run says nothing of the drift between runs
            return Judgement("can't tell", f"inside ±{100 * min_effect:g}% within each "
                                           f"run, but {STRICT_HINT}", same)
        return Judgement("same", f"inside ±{100 * min_effect:g}% with "
                                 f"{100 * same.confidence:.3g}% confidence", same)
    low, high, estimate = interval.low, interval.high, interval.estimate
    excludes_none = low > 0 or high < 0
    past = abs(estimate) >= min_effect and (not strict or min(abs(low), abs(high)) >= min_effect)
    if excludes_none and past:
        return Judgement("better" if (estimate < 0) == lower_is_better else "worse",
                         interval=interval)
    # the interval that has to narrow: to exclude no change, or to fit inside ±δ
    more = (interval if abs(estimate) >= min_effect else same).more_rounds(min_effect)
    if strict:
        hint = STRICT_HINT
    elif more is None:
        hint = f"more {unit_name} would hardly decide"
    else:
        hint = f"about {more} more {unit_name} a side would decide"
    if excludes_none:
        return Judgement("can't tell", f"a change, but perhaps under the "
                                       f"{100 * min_effect:g}% minimum effect; {hint}", interval)
    return Judgement("can't tell", hint, interval)


def judge_look(interval: Callable[[float], RatioInterval | None], level: float,
               share: LookShare, min_effect: float, lower_is_better: bool,
               strict: bool = False, unit_name: str = "rounds") -> Judgement:
    """The verdict of one look at a statistic tested at α = `level`, the look spending
    `share` of it: `interval(confidence)` against no change at 1 − level·share.change, and
    for the equivalence test at 1 − 2·level·share.same (two one-sided tests, each at
    level·share.same)."""
    return judge(interval(1 - level * share.change), min_effect, lower_is_better, strict,
                 unit_name, same=interval(1 - 2 * level * share.same))
