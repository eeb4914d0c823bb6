"""`RunAnalysis`: everything the reports and the rules read about one run, computed once
(`analyze.analyze` builds it)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from latlab.analysis.budget import Budget, Group
from latlab.analysis.findings import Finding, Unevaluated
from latlab.analysis.hop import Hop
from latlab.analysis.requests import Requests, Rows
from latlab.analysis.server_view import ServerView
from latlab.analysis.tasks import TaskBudget
from latlab.records.config import RunConfig
from latlab.records.folder import RunFolder
from latlab.records.scrape import Scrape
from latlab.records.summary import ClientCheck, RunSummary
from latlab.records.table import RequestTable
from latlab.records.window import Window


@dataclass
class RunAnalysis:
    """A run's requests (columns), aggregate budgets, breakdowns and findings."""

    run: RunFolder
    config: RunConfig
    summary: RunSummary
    summary_recomputed: bool
    requests: Requests
    window: Window | None
    inside: np.ndarray  # the requests scheduled inside the measurement window
    mean: Budget | None
    tail: Budget | None
    by_prompt: list[Group]
    by_tenant: list[Group]
    by_priority: list[Group]
    over_time: list[Group]
    scrapes: list[Scrape] = field(default_factory=list)
    server: ServerView | None = None  # the server's own account (/metrics), checked
    tasks: TaskBudget | None = None  # agent tasks: the whole task's budget
    hop: Hop | None = None  # a gateway's hop around the engine behind it
    findings: list[Finding] = field(default_factory=list)
    unevaluated: list[Unevaluated] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def table(self) -> RequestTable:
        return self.requests.table

    @property
    def ok(self) -> np.ndarray:
        """The measured requests that succeeded and have a decomposition."""
        return self.inside & self.requests.parts.decomposed

    @property
    def rows(self) -> Rows:
        """Every request, one `Row` at a time."""
        return self.requests.rows()

    @property
    def decomposed(self) -> Rows:
        """The measured rows with a decomposition (the successful requests)."""
        return self.requests.rows(self.ok)

    @property
    def has_server_timings(self) -> bool:
        return bool((self.ok & self.requests.parts.has_server).any())

    @property
    def client(self) -> ClientCheck | None:
        """The load generator's self-check (`summary.json` → `client`), when it wrote one."""
        return self.summary.client
