"""Which words a run's prompts get: fresh ones (the default: a salt of the run's own, so no
server has seen them), the seed's own (`--prompts seed`, the same in every run), or another
run's (`--prompts RUN_DIR`, its salt again: for prompt-cache studies)."""

from __future__ import annotations

import secrets
from pathlib import Path

from latlab.records.files import RunFolderError
from latlab.records.folder import RunFolder
from latlab.records.lengths import WorkloadError
from latlab.records.workload import WorkloadConfig


def with_salt(config: WorkloadConfig) -> WorkloadConfig:
    """`config` with its prompt salt fixed as `prompts` asks; one already fixed is kept."""
    if config.prompt_salt is not None or config.prompts == "seed":
        return config
    if config.prompts == "fresh":
        salt = secrets.randbits(31)
    else:
        salt = salt_of(Path(config.prompts))
    return config.model_copy(update={"prompt_salt": salt})


def salt_of(run: Path) -> int | None:
    """The prompt salt a run folder's prompts had (None: the seed's words)."""
    try:
        settings = RunFolder.open(run).read_config()
    except RunFolderError as e:
        raise WorkloadError(f"--prompts {run}: {e}") from None
    section = settings.bench or settings.coldstart
    if section is None:
        raise WorkloadError(f"--prompts {run}: not a bench or cold-start run")
    return section.workload.prompt_salt
