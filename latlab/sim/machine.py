"""Whether the machine has moved since a calibration of latlab's engine was made on it: its
reference steps (`Reference`) timed again, against the spread the calibration allows.

    check = check_machine(calibration, EngineConfig())   # None: nothing to compare
    check.beyond, check.line()
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass

from latlab.records.calibration import Calibration
from latlab.records.engine import EngineConfig
from latlab.sim.spread import drift_limit, spread_of


@dataclass
class MachineCheck:
    """The calibration's reference steps timed again: `ratio` times as long as then, against
    the `limit` the calibration's spread allows either way."""

    ratio: float
    limit: float
    load_then: float | None
    load_now: float

    @property
    def beyond(self) -> bool:
        return not 1 / self.limit <= self.ratio <= self.limit

    def line(self) -> str:
        then = f"{self.load_then:.1f} then, " if self.load_then is not None else ""
        where = "beyond" if self.beyond else "within"
        return (f"the machine runs the calibration's reference steps in {self.ratio:.2f}× the "
                f"time it took then (load average {then}{self.load_now:.1f} now): {where} the "
                f"spread the calibration allows (×{1 / self.limit:.2f}–{self.limit:.2f})")


def check_machine(calibration: Calibration, config: EngineConfig) -> MachineCheck | None:
    """Time the reference steps of an engine calibration made on this machine again, on an
    engine of `config` (a few seconds); None when there is nothing to
    compare (another machine, no reference, other engine settings)."""
    from latlab.sim.calibrate_engine import reference_ms

    reference = calibration.reference
    if reference is None or calibration.target.get("host") != platform.node():
        return None
    now = reference_ms(config)
    if len(now) != len(reference.ms):
        return None
    spread, _ = spread_of(calibration)
    return MachineCheck(sum(now) / sum(reference.ms), drift_limit(spread),
                        reference.load_average, os.getloadavg()[0])
