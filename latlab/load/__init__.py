"""The load generator: what to send and when (`workload/`), how one request goes and is timed
(`request/`), who sends it (`workers/`: a worker's schedule loop, its processes, `--ray`),
against which target (`target/`), what the target reports besides (`telemetry/`), and the
run that ties them together (`generator.run_load`). It writes records and config.json; the
summary, analysis and reports are the commands' business."""


class BenchError(Exception):
    """A run that could not start or go on: the message says why and what to change."""


class Unreachable(BenchError):
    """The target does not answer at all (giving --model would not help)."""
