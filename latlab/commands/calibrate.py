"""`latlab calibrate`: options → `CalibrateConfig` → a calibration (latlab's engine timed
directly, or any server fitted from its run folders) → calibration.json."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from latlab.commands.common import UsageError, console, print_json
from latlab.commands.options import JsonOutput, parse_args
from latlab.load.target.interrupts import interrupt_on_sigterm
from latlab.records.calibration import CALIBRATION_JSON, Calibration
from latlab.records.engine import ServeConfig
from latlab.records.predict import CalibrateConfig
from latlab.services.calibrate import calibrate_engine, calibration_args
from latlab.sim import calibration as calibrations
from latlab.sim.calibrate_run import CalibrationError


def calibrate(config: CalibrateConfig, options: JsonOutput) -> None:
    """Fit a server's step costs for `latlab predict`: latlab's engine timed directly, or any
    server from its run folders. Writes a calibration JSON stating its fit error and date."""
    interrupt_on_sigterm()  # the probes' latlab serve stopped on SIGTERM too
    err = console(stderr=True)
    if config.from_runs:
        try:
            cal = calibrations.run_calibration(config.from_runs,
                                               config.server.model_dump(exclude_none=True))
        except CalibrationError as e:
            raise UsageError(str(e)) from None
        path = config.out or Path(config.from_runs[0]) / CALIBRATION_JSON
    else:
        engine = parse_args(ServeConfig, config.serve_args, "--serve-args").engine
        cal = calibrate_engine(engine, config.serve_args, err, probe=config.probe)
        path = config.out or calibrations.cache_path(calibration_args(config.serve_args))
    try:
        calibrations.save(cal, path)
    except OSError as e:
        raise UsageError(f"--out {path}: cannot write it ({e.strerror or e}: {e.filename})"
                         ) from None
    if options.json_output:
        print_json(cal.model_dump(mode="json") | {"path": str(path)})
        if warning := calibrations.fit_warning(cal):
            err.print(f"warning: {warning}", style="yellow", highlight=False, markup=False)
        return
    print_calibration(console(), cal, path)


def print_calibration(out: Console, cal: Calibration, path: Path | None) -> None:
    out.print(cal.headline(), highlight=False)
    out.print(f"  step time = {cal.step.describe()}", highlight=False, markup=False)
    r = cal.request
    out.print(f"  per request: preprocess {r.preprocess:.2f} ms, postprocess {r.postprocess:.2f} "
              f"ms, network {r.network:.2f} ms", highlight=False)
    e = cal.engine
    out.print(f"  engine: max {e.max_num_seqs} sequences, {e.max_num_batched_tokens} tokens a "
              f"step, {e.num_kv_blocks} KV blocks of {e.block_size}, context {e.max_model_len}, "
              f"{e.batching} batching" + (", chunked prefill" if e.enable_chunked_prefill else "")
              + (", prefix caching" if e.enable_prefix_caching else "")
              + (f", {e.scheduling_policy} policy" if e.scheduling_policy != "fcfs" else "")
              + (", fair share" if e.fair_share else "")
              + (f", {e.max_prefill_tokens} prefill tokens a step" if e.max_prefill_tokens else "")
              + (f", {e.max_decode_tokens} decode tokens a step" if e.max_decode_tokens else ""),
              highlight=False)
    if cal.spread is not None:
        out.print(f"  spread: {cal.spread.describe()}", highlight=False, markup=False)
    for note in cal.notes:
        out.print(f"  note: {note}", highlight=False, markup=False)
    if warning := calibrations.fit_warning(cal):
        out.print(f"  warning: {warning}", style="yellow", highlight=False, markup=False)
    if path is not None:
        out.print(f"calibration: {path}", highlight=False)
