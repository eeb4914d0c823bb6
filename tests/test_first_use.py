"""First use of `latlab predict` (no calibration cached): what it imports before it needs
torch, how many grid shapes and probe requests the calibration costs, and what the probes'
latlab serve imports to start. Structure only: the times are in
benchmarks/first_calibration.py."""

from __future__ import annotations

import subprocess
import sys

import pytest

from latlab.services.calibrate import (
    PROBE_OPEN_LONGEST_S,
    PROBE_OPEN_MIN,
    PROBE_OPEN_S,
    PROBE_REQUESTS,
    probe_plan,
)
from latlab.sim.calibrate_engine import (
    BATCHES,
    CONTEXTS,
    LONG_CONTEXT_BATCH,
    SPREAD_BATCH,
    grid,
)


def run_python(code: str, **env: str) -> None:
    import os

    subprocess.run([sys.executable, "-c", code], check=True, timeout=120,
                   env=os.environ | env)


def test_the_default_engines_grid_times_each_batch_shape_once_and_no_more():
    """The default engine (32 sequences, 2048 tokens of context): 14 batch shapes — the
    short context through every size, the spread prompts to `SPREAD_BATCH` (their prefills
    are the grid's costliest steps), the longest context to `LONG_CONTEXT_BATCH`."""
    passes = grid(max_num_seqs=32, max_model_len=2048, kv_tokens=43680)
    assert [p.context for p in passes] == list(CONTEXTS)
    assert [max(p.sizes) for p in passes] == [31, SPREAD_BATCH, LONG_CONTEXT_BATCH]
    assert [p.spread for p in passes] == [False, True, False]
    assert sum(len(p.sizes) for p in passes) == 14 < len(BATCHES) * len(CONTEXTS)
    assert all(p.longest < 2048 for p in passes)


def test_a_smaller_engine_gets_a_smaller_grid():
    few = grid(max_num_seqs=4, max_model_len=2048, kv_tokens=43680)
    assert all(max(p.sizes) <= 4 for p in few)
    short = grid(max_num_seqs=32, max_model_len=512, kv_tokens=43680)
    assert [p.context for p in short] == [64]  # the longer passes do not fit in 512 tokens
    tight = grid(max_num_seqs=32, max_model_len=2048, kv_tokens=2000)
    assert all(b * p.longest <= 2000 for p in tight for b in p.sizes)


@pytest.mark.parametrize("capacity", [0.05, 1.4, 12.0, 40.0])
def test_the_probes_send_a_bounded_number_of_requests(capacity):
    """One at a time (`PROBE_REQUESTS`), one full batch, and Poisson arrivals for about
    `PROBE_OPEN_S` (at least `PROBE_OPEN_MIN` where they fit in `PROBE_OPEN_LONGEST_S`)."""
    one, batch, opened = probe_plan(32, 2048, capacity)
    assert one.requests == PROBE_REQUESTS and one.arrivals.users == 1
    assert batch.requests == batch.arrivals.users == 32
    rate = opened.arrivals.rate
    assert rate == pytest.approx(capacity / 2, rel=0.05)
    longest = max(PROBE_OPEN_S, PROBE_OPEN_LONGEST_S)
    assert opened.requests <= max(2, PROBE_OPEN_MIN, round(rate * longest))
    assert opened.requests == 2 or opened.requests / rate <= longest + 1 / rate


def test_predict_help_does_not_import_torch():
    run_python("import sys\nfrom typer.testing import CliRunner\nfrom latlab.cli import app\n"
               "r = CliRunner().invoke(app, ['predict', '--help'])\n"
               "assert r.exit_code == 0 and '--rate' in r.output, r.output\n"
               "assert 'torch' not in sys.modules, 'torch imported'\n")


def test_predict_imports_torch_only_once_it_calibrates(tmp_path):
    """With no calibration cached, predict reaches the calibration without torch (it loads
    there, beside the probes' latlab serve starting)."""
    run_python(
        "import sys\nfrom typer.testing import CliRunner\nfrom latlab.cli import app\n"
        "from latlab.services import predict\nfrom latlab.services.errors import InputError\n"
        "seen = []\n"
        "def calibrate(*args, **kwargs):\n"
        "    seen.append('torch' in sys.modules)\n"
        "    raise InputError('stopped here')\n"
        "predict.calibrate_engine = calibrate\n"
        "r = CliRunner().invoke(app, ['predict', '--rate', '3', '--requests', '10'])\n"
        "assert 'stopped here' in r.output, r.output\n"
        "assert seen == [False], 'torch imported before the calibration'\n",
        LATLAB_CACHE=str(tmp_path))


def test_the_probes_latlab_serve_starts_without_the_load_generator():
    """`python -m latlab.commands.serve` (how latlab starts the servers it measures) parses
    its options without the other commands' imports: no load generator, no config files."""
    run_python("import sys\nimport latlab.commands.serve, latlab.commands.options\n"
               "loaded = [m for m in sys.modules if m.startswith(('latlab.load', "
               "'latlab.commands.config_files', 'latlab.analysis', 'latlab.report'))]\n"
               "assert not loaded, loaded\n")


def test_a_calibration_just_made_is_not_machine_checked_again(tmp_path, monkeypatch):
    """First use calibrates and answers: its reference steps were timed moments ago, so the
    machine check (a fresh engine timing them again) is left to the next use."""
    import io

    from rich.console import Console
    from sim_helpers import calibration

    from latlab.records.predict import CalibrationSource
    from latlab.services import predict as service
    from latlab.sim import machine

    monkeypatch.setenv("LATLAB_CACHE", str(tmp_path))
    made, checked = [], []
    monkeypatch.setattr(service, "calibrate_engine",
                        lambda *a, **k: made.append(1) or calibration())
    monkeypatch.setattr(machine, "check_machine", lambda c, e: checked.append(1))
    err = Console(file=io.StringIO())
    _, where = service.resolve_calibration(CalibrationSource(), None, [], None, err, probe=True)
    assert "calibrated now" in where and made == [1] and checked == []
    _, where = service.resolve_calibration(CalibrationSource(), None, [], None, err, probe=True)
    assert "calibrated now" not in where and made == [1] and checked == [1]
