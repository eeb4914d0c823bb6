"""`ab.json`: an A/B of two settings: the runs of each round, every metric's change with its
confidence interval and verdict, and the server counters that explain it."""

from __future__ import annotations

from typing import Literal

from pydantic import field_validator, model_validator

from latlab.records.bench import BenchConfig
from latlab.records.settings import AB, setting
from latlab.records.summary import Record
from latlab.records.verdict import HEADLINE, KEYS, Verdict, VerdictConfig

AB_JSON = "ab.json"
DEFAULT_MOST = 10  # A/B pairs at most, unless --rounds asks for more
SIDES = ("A", "B")


class ABConfig(VerdictConfig):
    """Two settings, the identical workload against each, alternated over rounds."""

    a: str = setting(..., "Setting A: arguments for an embedded latlab serve (with --launch: "
                     "the command's {args}), or a server URL (http://HOST:PORT).", "--a",
                     group=AB)
    b: str = setting(..., "Setting B, the same way.", "--b", group=AB)
    rounds: int = setting(3, "A/B pairs to run first, alternating (each a full bench run per "
                          "side).", group=AB, ge=1, le=50)
    max_rounds: int | None = setting(None, "A/B pairs at most: while a metric of --decide-on "
                                     "(default: TTFT p50/p99, TPOT p50, E2E p99, output "
                                     "tok/s) is \"can't tell\", another pair is run, up "
                                     "to this many (= --rounds: no more; default: 10, or "
                                     "--rounds if more).", group=AB,
                                     ge=1, le=50)
    warmup_rounds: int = setting(1, "Rounds each side runs first and leaves out of the "
                                 "comparison: what a cold server does (kernels compiled, "
                                 "caches filled, graphs captured) in its first minutes.",
                                 group=AB, ge=0, le=5)
    fresh_servers: Literal["every", "never"] = setting(
        "every", "every: the servers ab starts (latlab serve, or --launch) are started afresh "
        "for every A/B pair, both sides at once, each warmed up with a few requests, so what "
        "one process builds up and keeps (caches, allocator state, a thread choice, its "
        "cores) varies between pairs, where the comparison sees it as noise; never: one "
        "process a side for every round (faster, but a lasting difference between the two "
        "processes is taken for the setting's, as with URLs, which ab cannot restart).",
        group=AB, cli_type=str, metavar="every|never")
    max_time: float = setting(900.0, "Seconds after which no further pair is started.",
                              group=AB, gt=0, metavar="SECONDS")
    decide_on: tuple[str, ...] = setting(
        HEADLINE, "A statistic whose verdict ends the rounds, as compare keys it (e.g. "
        "mean_itl_max, p99_ttft, goodput) (repeatable; default: the headline ones); they "
        "share one α (5 %) among themselves, apart from the statistics shown beside them.",
        "--decide-on", group=AB, cli_type=list[str],
        metavar="KEY", show_default=False)
    bench: BenchConfig = BenchConfig()

    @field_validator("decide_on")
    @classmethod
    def _known_keys(cls, keys: tuple[str, ...]) -> tuple[str, ...]:
        unknown = [k or "''" for k in keys if k not in KEYS]
        if unknown or not keys:
            raise ValueError(f"--decide-on {', '.join(unknown) or '(none)'}: expected one of "
                             f"{', '.join(KEYS)}")
        return tuple(dict.fromkeys(keys))

    @property
    def most_rounds(self) -> int:
        """The A/B pairs at most (`--max-rounds`, else 10 or `--rounds` if more)."""
        return self.max_rounds if self.max_rounds is not None else max(DEFAULT_MOST, self.rounds)

    @model_validator(mode="after")
    def _rounds_within_most(self) -> ABConfig:
        if self.max_rounds is not None and self.max_rounds < self.rounds:
            raise ValueError(f"--max-rounds {self.max_rounds} is below --rounds {self.rounds}")
        urls = [s for s in (self.a, self.b) if s.startswith(("http://", "https://"))]
        if self.bench.launch is not None and urls:
            raise ValueError("--launch starts both sides: give --a and --b as its {args}, "
                             "not URLs")
        if "goodput" in self.decide_on and not self.bench.slos:
            raise ValueError("--decide-on goodput: give the SLOs it is judged by (--slo)")
        return self

    def sides(self) -> dict[str, BenchConfig]:
        """Each side's bench config: the same workload and arrivals, its own target."""
        out = {}
        for side, setting_ in zip(SIDES, (self.a, self.b)):
            url = setting_ if setting_.startswith(("http://", "https://")) else None
            out[side] = BenchConfig.model_validate(
                self.bench.model_dump(exclude={"url", "serve_args", "name", "tags"},
                                      exclude_unset=True)
                # a server ab starts is the engine itself: no engine behind it to scrape, and
                # a gateway's name for the model (the run went through one) is not its own
                | ({} if url else {"server_url": None}
                   | ({"model": None} if self.bench.server_url else {}))
                | {"url": url, "serve_args": "" if url else setting_,
                   "api_key": self.bench.api_key,
                   "name": f"ab-{side}-{self.bench.name}",
                   "tags": [*self.bench.tags, f"ab:{side}"]})
        return out


class ABRound(Record):
    side: Literal["A", "B"]
    round: int  # 0: a warm-up round, not compared
    server_start: int | None = None  # the start of its side's server it ran on; None: a URL
    run: str  # the round's run folder
    cached_share: float | None = None  # of prompt tokens, from the server's prefix cache
    host_other_cores: float | None = None  # other work on the load generator's host


class ABChange(Record):
    """B against A for one metric (`latlab compare`'s row)."""

    key: str
    label: str
    unit: str
    a: float | None
    b: float | None
    low: float | None = None  # the interval of B / A − 1
    high: float | None = None
    confidence: float | None = None
    verdict: Verdict
    why: str | None = None  # for same and can't tell
    decided_at: int | None = None  # the rounds a side when the verdict was reached


class ABRecord(Record):
    created: float
    a: str  # the setting: serve args, or a URL
    b: str
    rounds: list[ABRound] = []
    changes: list[ABChange] = []
    counters: dict[Literal["A", "B"], dict[str, float]] = {}  # explainer → value, per side
    workload_differences: list[str] = []
    evidence: str = ""  # what the verdicts rest on
    looks: list[str] = []  # each look at the headline metrics, as the rounds went
    conditions: list[str] = []  # how the sides ran unlike (cache, host)
    interrupted: bool = False
