"""The step-cost fit: a known model comes back, outliers left out; a run whose samples do not
tell the costs apart says so."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
from sim_helpers import STEP

from latlab.sim.calibration import RUN_FEATURES
from latlab.sim.stepcost import FEATURES, StepCostModel, design, features, fit, told_apart

FIXTURES = Path(__file__).parent / "fixtures"


def test_the_step_cost_fit_recovers_a_known_model_and_leaves_out_outliers():
    rng = np.random.default_rng(1)
    rows = np.column_stack([rng.integers(1, 512, 300), rng.integers(0, 32, 300),
                            rng.integers(0, 3, 300), rng.integers(0, 33, 300),
                            rng.integers(0, 6, 300), rng.integers(0, 20_000, 300),
                            rng.integers(0, 200_000, 300)])
    x = features(rows)
    truth = np.array([STEP.coefficients[k] for k in FEATURES])
    ms = x @ truth
    ms[::25] *= 3  # a noisy neighbour
    cost, error = fit(x, ms)
    assert error.outliers == 12 and error.mape < 1e-6 and error.holdout_mape < 1e-6
    for name in FEATURES:
        assert cost.coefficients[name] == pytest.approx(STEP.coefficients[name], rel=1e-4,
                                                        abs=1e-6)
    model = StepCostModel(cost)
    assert model.seconds(*rows[1]) * 1e3 == pytest.approx(float(x[1] @ truth), rel=1e-6)
    a, b = model.decode_run(8, 800, 2)
    assert (a + 3 * b) * 1e3 == pytest.approx(
        float((design(features([[8, 8, 0, 8, 2, 800 + 3 * 8, 0]]), []) @ truth)[0]), rel=1e-6)


def test_a_fit_of_a_run_of_one_shape_says_it_cannot_tell_the_costs_apart():
    """A real llama-server run of one prompt and output length at one load: its samples pin
    down 3 of the 5 costs, and many fits explain it alike. The fit says so, and picks one
    exactly, without scipy's RuntimeWarning (TRF, iterating along the flat valley, stepped
    to the infinite upper bounds: "invalid value encountered in multiply")."""
    recorded = json.loads((FIXTURES / "llama-server-one-shape-design.json").read_text())
    x = np.zeros((len(recorded["rows"]), len(FEATURES)))  # its rows are features / ms
    x[:, [FEATURES.index(f) for f in recorded["features"]]] = recorded["rows"]
    ms = np.ones(len(x))
    assert told_apart(x, ms, RUN_FEATURES) == 3
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cost, error = fit(x, ms, use=RUN_FEATURES)
    assert error.mape < 0.3 and all(v >= 0 for v in cost.coefficients.values())
    rng = np.random.default_rng(2)
    varied = features(np.column_stack([rng.integers(1, 512, 60), rng.integers(1, 32, 60),
                                       rng.integers(0, 3, 60), rng.integers(0, 33, 60),
                                       rng.integers(0, 6, 60), rng.integers(0, 20_000, 60),
                                       rng.integers(0, 200_000, 60)]))
    assert told_apart(varied, rng.uniform(5, 10, 60)) == len(FEATURES)
