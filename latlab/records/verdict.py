"""What a comparison calls a change (`latlab compare`, `latlab ab`): better, worse, same (inside
the minimum effect, with confidence) or can't tell (`analysis/verdicts.py` decides)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, field_validator

from latlab.records.bench import SloConfig
from latlab.records.catalog import CATALOG, metrics
from latlab.records.settings import VERDICT, setting

# Rounds on a shared host move several percent between themselves: a smaller change would
# take dozens of rounds to confirm or to rule out.
DEFAULT_MIN_EFFECT = 0.05
STATS = ("mean", "p50", "p90", "p99")  # the statistics compared
Verdict = Literal["better", "worse", "same", "can't tell"]
# What a comparison is mostly asked about; `ab` adds rounds until these are decided.
HEADLINE = ("p50_ttft", "p99_ttft", "p50_tpot", "p99_e2e", "output_tokens_per_s")


def key_of(metric: str, stat: str) -> str:
    """The comparison key of a latency metric's statistic: ("itl_max", "mean") →
    mean_itl_max."""
    return f"{stat}_{metric}"


def metric_of(key: str) -> str:
    """The metric a comparison key is of (`key_of`'s inverse; a rate's key is its own):
    mean_itl_max → itl_max, output_tokens_per_s → output_tokens_per_s."""
    stat, _, metric = key.partition("_")
    return metric if stat in STATS and metric in CATALOG else key


def stat_of(key: str) -> str | None:
    """The statistic of a latency key (p99_ttft → p99); None for a rate."""
    stat = key.partition("_")[0]
    return stat if metric_of(key) != key else None


# Every key a comparison judges: a latency metric's statistics, each rate.
KEYS = (*(key_of(m, s) for m in metrics(compared=True, unit="ms") for s in STATS),
        *(m for m in metrics(compared=True) if not CATALOG[m].latency))
# The metrics that declare a minimum effect of their own (`records.catalog`).
OWN_EFFECTS = ", ".join(f"{m.name} {100 * m.min_effect:g}%" for m in CATALOG.values()
                        if m.min_effect is not None)
_EFFECT = re.compile(r"^\s*(?:(?P<key>[a-z0-9_]+)\s*=\s*)?(?P<value>[0-9]+(?:\.[0-9]*)?|"
                     r"\.[0-9]+)\s*%\s*$")
# What a minimum effect may be given for: a compared metric, or one of its statistics.
EFFECT_KEYS = (*metrics(compared=True), *KEYS)


def effects(value: Any) -> Any:
    """`["2%", "p99_ttft=5%", "tpot=1%"]` → `{"*": 0.02, "p99_ttft": 0.05, "tpot": 0.01}`."""
    if not isinstance(value, (list, tuple)):
        return value
    out = {}
    for item in map(str, value):
        m = _EFFECT.match(item)
        if not m:
            raise ValueError(f"{item!r}: expected PCT% or METRIC=PCT%, e.g. 2% or p99_ttft=5%")
        key = m["key"] or "*"
        if key != "*" and key not in EFFECT_KEYS:
            raise ValueError(f"{item!r}: {key} is not a compared metric or statistic "
                             f"(e.g. tpot, p99_ttft, mean_itl_max)")
        if key in out:
            raise ValueError(f"{item!r}: a minimum effect for "
                             f"{'every metric' if key == '*' else key} given twice")
        if float(m["value"]) >= 100:
            raise ValueError(f"{item!r}: a latency cannot fall by 100% or more, so nothing "
                             "could be called better: give less than 100%")
        out[key] = float(m["value"]) / 100
    return out


class VerdictConfig(BaseModel):
    min_effect: dict[str, float] = setting(
        {}, "The smallest change worth a verdict, relative: PCT% for every metric that has no "
        "minimum of its own, or METRIC=PCT% for one (a metric like tpot, or a statistic like "
        f"p99_ttft) (repeatable; default 5%; the metrics' own: {OWN_EFFECTS}, changed only "
        "by naming them).", group=VERDICT,
        cli_type=list[str], metavar="[METRIC=]PCT%")

    _effects = field_validator("min_effect", mode="before")(lambda value: effects(value))

    def effect(self, key: str) -> float:
        """The minimum effect for the comparison key `key` (e.g. `p99_ttft`): the one given
        for it or its metric, else the metric's own (the catalog's), else the one given for
        every metric, else the default. A metric with its own minimum keeps it under a
        `--min-effect PCT%`: it declares the noise it moves by unchanged, which a smaller
        minimum would call a change."""
        metric = next((key.removeprefix(f"{s}_") for s in STATS if key.startswith(f"{s}_")),
                      key)
        for name in (key, metric):
            if name in self.min_effect:
                return self.min_effect[name]
        declared = CATALOG[metric].min_effect if metric in CATALOG else None
        if declared is not None:
            return declared
        return self.min_effect.get("*", DEFAULT_MIN_EFFECT)


class CompareConfig(SloConfig, VerdictConfig):
    """`latlab compare`: the SLOs the runs are judged by, what a change is, and the noise."""

    noise: Path | None = setting(None, "A repeat of the first run (the same setting, run "
                                 "again): its time blocks join the first run's, so the "
                                 "verdicts see the drift between runs (without it, two single "
                                 "runs decide only changes well past the minimum effect).",
                                 group=VERDICT, metavar="RUN")
