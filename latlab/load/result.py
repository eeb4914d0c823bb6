"""A finished load: what it reports once the workers are done (`LoadResult`), from the run
folder they wrote and what each worker learnt of the server on the way."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from latlab.load.request.fields import Adaptations
from latlab.load.workers.worker import WorkerResult
from latlab.records.bench import BenchConfig
from latlab.records.config import RunConfig
from latlab.records.folder import RunFolder
from latlab.records.health import WorkerHealth
from latlab.records.summary import HostLoad
from latlab.records.table import OUTCOMES, RequestTable


@dataclass
class LoadResult:
    """A finished (or stopped) load: its folder and config, what each worker reported, why
    it stopped, and whether it failed as a whole (with the message saying why)."""

    run: RunFolder
    config: RunConfig
    workers: list[WorkerResult]
    stop_reason: str
    notes: list[str]
    failed: bool
    message: str | None = None
    host: HostLoad | None = None  # the host's CPUs over the run, and who used them

    @property
    def health(self) -> list[WorkerHealth]:
        return [w.health for w in self.workers]


def finish_load(config: BenchConfig, run: RunFolder, settings: RunConfig,
                results: list[WorkerResult], notes: list[str], host: HostLoad | None
                ) -> LoadResult:
    """The load's end read back: what the workers learnt of the server, the run's stop reason
    and measurement window in config.json, and whether it failed as a whole."""
    reasons = {r.stop_reason for r in results}
    records = run.read_table()
    learned = Adaptations()
    for result in results:
        learned = learned.merge(result.learned)
    settings.target.refused_fields = sorted(learned.refused) or None
    if learned.gateway is not None and (settings.target.gateway is None
                                        or settings.target.server_url is not None):
        settings.target.gateway = learned.gateway  # named by its answers, not only by the user
    notes += learned.notes(int(records.ok.sum()))
    fitted = int(records.fitted.sum())
    if fitted:
        notes.append(f"{fitted} of {len(records)} requests asked for fewer output tokens than "
                     f"the workload drew, to fit the server's context of "
                     f"{settings.target.max_model_len} tokens")
    messages = list(dict.fromkeys([r.message for r in results if r.message] + notes))
    settings.clock.end_ns = _end_ns(config, settings.clock.t0_ns, reasons, results)
    run.write_config(settings)
    stop_reason = ("interrupted" if "interrupted" in reasons
                   else "aborted" if "aborted" in reasons else sorted(reasons)[0])
    ok = int(records.ok.sum())
    message = "\n".join(messages) if messages else None
    if not len(records):
        message = message or "no request was sent"
    elif ok == 0 and not message:
        message = f"every request failed ({_failure_counts(records)})"
    return LoadResult(run, settings, results, stop_reason, messages,
                      failed=ok == 0 or "aborted" in reasons, message=message, host=host)


def _end_ns(config: BenchConfig, t0_ns: int, reasons: set[str], results: list[WorkerResult]
            ) -> int | None:
    """Where the measurement window ends: the end of --duration; for an interrupted run, when
    it stopped (the requests Ctrl-C cancelled are counted as cancelled, not as failures);
    else (None) the last activity: a burst's, or an aborted run's, whose requests in flight
    went on after it stopped scheduling."""
    end = t0_ns + int(config.duration_s * 1e9) if config.duration_s else None
    if "interrupted" in reasons:
        return min(t for t in (end, max(r.stopped_ns for r in results)) if t is not None)
    if config.arrivals.burst or "aborted" in reasons:
        return None
    return end if reasons == {"duration"} else None


def _failure_counts(records: RequestTable) -> str:
    codes, first, counts = np.unique(records.outcome, return_index=True, return_counts=True)
    order = np.argsort(first)
    return (", ".join(f"{OUTCOMES[codes[i]]} ×{counts[i]}" for i in order)
            + f"; last: {records.text['error'][len(records) - 1].as_py()}")
