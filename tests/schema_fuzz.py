"""Schemathesis against a running server: `check_all` runs its command line with every check
(`schema_hooks`: what the schema cannot state), and says whether anything failed; `fuzz`
sends cases generated from /openapi.json, valid and invalid, one at a time, and counts the
statuses that came back and the 5xx."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import hypothesis
import requests
import schemathesis
from hypothesis import HealthCheck, Phase

HOOKS = Path(__file__).with_name("schema_hooks.py")


def check_all(url: str, examples: int, seed: int = 0,
              timeout_s: float = 600) -> subprocess.CompletedProcess:
    """`schemathesis run` against `url` with every check: its coverage and fuzzing phases,
    up to `examples` cases per operation; exit code 0 when no check failed."""
    command = [sys.executable, "-m", "schemathesis.cli", "run", url + "/openapi.json",
               "--checks", "all", "--exclude-checks", "positive_data_acceptance",
               "--max-examples", str(examples), "--seed", str(seed), "--no-color",
               "--request-timeout", "60", "--max-response-time", "30"]
    with tempfile.TemporaryDirectory() as scratch:  # where it keeps its .schemathesis/
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout_s,
                              cwd=scratch, env={**os.environ, "SCHEMATHESIS_HOOKS": str(HOOKS)})


@dataclass
class FuzzResult:
    statuses: Counter = field(default_factory=Counter)
    server_errors: list[str] = field(default_factory=list)

    @property
    def cases(self) -> int:
        return sum(self.statuses.values())


def fuzz(url: str, cases_per_mode: int, seed: int = 0) -> FuzzResult:
    """Per operation, up to `cases_per_mode` valid cases; for each POST as many invalid ones.
    Operations without inputs (GET /health) give one case each."""
    schema = schemathesis.openapi.from_url(url + "/openapi.json")
    result = FuzzResult()
    with requests.Session() as session:
        for loaded in schema.get_all_operations():
            operation = loaded.ok()
            modes = [schemathesis.GenerationMode.POSITIVE]
            if operation.method.upper() == "POST":
                modes.append(schemathesis.GenerationMode.NEGATIVE)
            for mode in modes:
                _run(operation.as_strategy(generation_mode=mode), url, session, result,
                     cases_per_mode, seed)
    return result


def _run(strategy, url: str, session: requests.Session, result: FuzzResult,
         max_examples: int, seed: int) -> None:
    @hypothesis.seed(seed)
    @hypothesis.settings(max_examples=max_examples, deadline=None, database=None,
                         phases=[Phase.generate], suppress_health_check=list(HealthCheck),
                         print_blob=False)
    @hypothesis.given(strategy)
    def send(case: schemathesis.Case) -> None:
        response = case.call(base_url=url, session=session, timeout=60)
        result.statuses[response.status_code] += 1
        if response.status_code >= 500:
            result.server_errors.append(f"{response.status_code} {case.method} {case.path} "
                                        f"{case.body!r:.300}: {response.text[:300]}")

    send()
