"""Shared pieces of the simulator's tests: a calibration with known costs, workloads."""

from __future__ import annotations

import numpy as np

from latlab.records.arrivals import ArrivalConfig
from latlab.records.calibration import Calibration, FitError, RequestCosts, StepCost
from latlab.records.engine import EngineShape
from latlab.records.lengths import LengthDistribution
from latlab.records.workload import WorkloadConfig
from latlab.sim.workload import Lengths, SimWorkload, build

STEP = StepCost(coefficients={"step": 4.0, "tokens": 0.2, "decodes": 0.1, "prefills": 1.0,
                              "sampled": 0.05, "decode_groups": 0.3, "decode_context": 0.8,
                              "prefill_attention": 150.0})
COSTS = RequestCosts(preprocess=1.5, postprocess=0.3, network=1.0, reject=1.0)


def calibration(**shape) -> Calibration:
    return Calibration(server="test server", engine=EngineShape(**shape),
                       step=STEP.model_copy(deep=True),  # a test may change its own
                       request=COSTS, fit=FitError(samples=100, mape=0.02, p90=0.05, max=0.1))


SMALL = WorkloadConfig(prompt_tokens=LengthDistribution(kind="uniform", a=16, b=200),
                       output_tokens=LengthDistribution(kind="uniform", a=2, b=40))


def open_loop(rate: float, requests: int, workload: WorkloadConfig = SMALL,
              **arrivals) -> SimWorkload:
    return build(workload, ArrivalConfig(process="poisson", rate=rate, **arrivals), requests,
                 None)


def fixed(arrival, prompt, output) -> SimWorkload:
    n = len(arrival)
    return SimWorkload(SMALL, ArrivalConfig(process="poisson", rate=1.0), n, None,
                       arrival=np.asarray(arrival, dtype=float),
                       lengths=Lengths(np.asarray(prompt), np.asarray(output),
                                       np.zeros(n, bool), [None] * n, [None] * n))
