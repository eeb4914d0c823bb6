"""The load generator: what to send and when (`workload/`), how one request goes and is timed
(`request/`), who sends it (`workers/`: a worker's schedule loop, its processes, `--ray`),
against which target (`target/`), what the target reports besides (`telemetry/`), and the
run that ties them together (`generator.run_load`). It writes records and config.json; the
summary, analysis and reports are the commands' business."""


class BenchError(Exception):
    """A run that could not start or go on: the message says why and what to change."""


class Unreachable(BenchError):
    """The target does not answer at all (giving --model would not help)."""


class KeyRefused(BenchError):
    """The target refused the API key, or wants one (HTTP 401 or 403): giving --model would
    not help either."""


KEY_SOURCES = "--api-key-file, LATLAB_API_KEY or OPENAI_API_KEY"


def key_problem(status: int | None, key_given: bool) -> str | None:
    """What a 401 or 403 means for the run's key; None for other statuses."""
    if status not in (401, 403):
        return None
    if not key_given:
        return f"the server wants an API key (HTTP {status}): give it with {KEY_SOURCES}"
    return (f"the server refused the API key (HTTP {status}): check the key given with "
            f"--api-key, {KEY_SOURCES}")
