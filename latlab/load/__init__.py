"""The load generator: what to send (`workload`), when (`arrivals`), how (`client`, `sse`,
`connection`), by which processes (`worker`, `processes`), against which target (`target`),
and the run that ties them together (`generator.run_load`). It writes records and
config.json; the summary, analysis and reports are the commands' business."""


class BenchError(Exception):
    """A run that could not start or go on: the message says why and what to change."""


class Unreachable(BenchError):
    """The target does not answer at all (giving --model would not help)."""
