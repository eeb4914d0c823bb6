"""The synthetic workload closest to a run's traffic (`latlab observe`'s, a service's own): its
mean rate with its burstiness (a gamma process's shape from the gaps' coefficient of
variation, Poisson when it is near 1), its prompt and output lengths as lognormals of their
mean and spread, its API and its tenants' shares. As a `BenchConfig` (config.json → `bench`,
what `latlab bench --config` reruns) and as the flags that say it.

    config, flags = fit_workload(table, duration_s=3600.0)
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from latlab.records.arrivals import ArrivalConfig
from latlab.records.bench import BenchConfig
from latlab.records.columns import Labels, present
from latlab.records.lengths import LengthDistribution
from latlab.records.table import RequestTable
from latlab.records.workload import WorkloadConfig

POISSON_BAND = 0.2  # a gamma shape within this of 1 is Poisson
MIN_GAPS = 10


def fit_workload(t: RequestTable, duration_s: float, name: str = "fitted"
                 ) -> tuple[BenchConfig, list[str]] | None:
    """The workload and its flags; None without a request with a time and lengths."""
    starts = np.sort(t.origin_ns[present(t.origin_ns)])
    if len(starts) < 2:
        return None
    span_s = (starts[-1] - starts[0]) / 1e9
    rate = (len(starts) - 1) / span_s if span_s > 0 else float(len(starts))
    gaps = np.diff(starts) / 1e9
    del starts  # each column let go of once its numbers are taken: a big run's are big
    mean_gap, std_gap = (gaps.mean(), gaps.std()) if len(gaps) >= MIN_GAPS else (0.0, 0.0)
    del gaps
    prompts = t.prompt_tokens[~np.isnan(t.prompt_tokens)]
    prompt_lengths = _lengths(prompts) if len(prompts) else None
    del prompts
    outputs = t.completion_tokens[t.ok & ~np.isnan(t.completion_tokens)]
    output_lengths = _lengths(outputs) if len(outputs) else None
    del outputs
    if prompt_lengths is None or output_lengths is None:
        return None
    arrivals: dict = {"rate": round(rate, 4)}
    flags = [f"--rate {rate:.3g}"]
    if mean_gap > 0 and std_gap > 0:
        shape = float((mean_gap / std_gap) ** 2)
        if abs(shape - 1) > POISSON_BAND:
            arrivals.update(process="gamma", burstiness=round(shape, 3))
            flags.append(f"--burstiness {shape:.2g}")
    api = _counts(t.api).most_common(1)
    lengths = {"prompt_tokens": prompt_lengths, "output_tokens": output_lengths}
    tenants = _counts(t.tenant)
    workload = {"api": api[0][0] if api else "chat", **lengths,
                "tenants": {k: round(v / sum(tenants.values()), 4) for k, v in tenants.items()}
                if len(tenants) > 1 else {}}
    flags += [f"--api {workload['api']}", f"--prompt-tokens {lengths['prompt_tokens']}",
              f"--output-tokens {lengths['output_tokens']}"]
    flags += [f"--tenant {k}:{v:g}" for k, v in workload["tenants"].items()]
    flags.append(f"--duration {duration_s:.0f}")
    config = BenchConfig(name=name, duration_s=duration_s,
                         arrivals=ArrivalConfig.model_validate(arrivals),
                         workload=WorkloadConfig.model_validate(workload))
    return config, flags


def _counts(column: Labels) -> Counter[str]:
    """How many requests hold each name of `column` (those without one left out), in the
    order the names first appear."""
    codes, first, counts = np.unique(column.codes, return_index=True, return_counts=True)
    return Counter({column.names[codes[i]]: int(counts[i]) for i in np.argsort(first).tolist()
                    if codes[i] >= 0})


def _lengths(values: np.ndarray) -> LengthDistribution:
    """A lognormal of the values' mean and spread; fixed when they do not vary."""
    mean, std = float(values.mean()), float(values.std())
    if std < 0.5:
        return LengthDistribution(kind="fixed", a=max(1.0, round(mean)))
    return LengthDistribution(kind="lognormal", a=round(mean, 1), b=round(std, 1))
