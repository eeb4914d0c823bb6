"""Settings from files: `--config FILE` (YAML or JSON in config.json's schema; a run folder,
its config.json or a sweep.json reruns that run) and `--workload NAME` (a named workload
shipped in `latlab/workloads/`)."""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

import typer
import yaml
from pydantic import BaseModel

from latlab.commands.common import UsageError, console
from latlab.records.bench import BenchConfig
from latlab.records.coldstart import ColdstartConfig
from latlab.records.folder import CONFIG
from latlab.records.settings import settings_of, sub_config
from latlab.records.sweep import SWEEP_JSON

WORKLOADS = resources.files("latlab") / "workloads"


def read_config_file(path: Path, model: type[BaseModel]) -> dict[str, Any]:
    """The settings `path` holds for `model`, as a dict its flags are laid over."""
    if path.is_dir():
        path = path / (CONFIG if (path / CONFIG).is_file() else SWEEP_JSON)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise UsageError(f"--config {path}: {e.strerror or e}") from None
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise UsageError(f"--config {path}: not YAML or JSON ({str(e).splitlines()[0]})"
                         ) from None
    if not isinstance(data, dict):
        raise UsageError(f"--config {path}: expected a mapping of settings")
    settings = _settings(data)
    written_by_hand = settings is data  # a record's unknown fields are an older version's
    data = placed(settings, model, f"--config {path}")
    if written_by_hand and (unknown := unknown_settings(model, data)):
        raise UsageError(f"--config {path}: unknown setting {', '.join(unknown)} (the "
                         "names are config.json's, e.g. duration_s)")
    return settings_of(model, data)


def unknown_settings(model: type[BaseModel], data: dict[str, Any], prefix: str = ""
                     ) -> list[str]:
    """The keys of `data`, nested ones dotted, that are no field of `model`: a misspelt
    setting would otherwise be left at its default without a word."""
    unknown = []
    for key, value in data.items():
        info = model.model_fields.get(key)
        if info is None:
            unknown.append(f"{prefix}{key}")
        elif (child := sub_config(info.annotation)) is not None and isinstance(value, dict):
            unknown += unknown_settings(child, value, f"{prefix}{key}.")
    return unknown


def _settings(data: dict[str, Any]) -> dict[str, Any]:
    """A latlab record's settings: a run's config.json → its bench (or cold start), a
    sweep.json → its plan with the bench under `base`; anything else is the settings."""
    if data.get("kind") == "sweep" and isinstance(data.get("config"), dict):
        config = dict(data["config"])
        config.pop("max_concurrency", None)
        return {"bench": config.pop("bench", {}), "plan": config}
    if "schema_version" in data or "clock" in data:
        for section in ("bench", "coldstart"):
            if isinstance(data.get(section), dict):
                return {section: data[section]}
    return data


def placed(data: dict[str, Any], model: type[BaseModel], where: str) -> dict[str, Any]:
    """`data` (settings, or a record's `bench`/`coldstart` section) where `model` keeps them:
    a bench's settings at the top of a `BenchConfig`, under the field a command's config
    keeps its bench in (`bench`, a sweep's `base`)."""
    data = {k: v for k, v in data.items() if k != "description"}
    plan = data.pop("plan", {})
    if set(data) == {"coldstart"}:
        if model is not ColdstartConfig:
            raise UsageError(f"{where}: a cold-start run's settings; this command takes a "
                             "bench's")
        return data["coldstart"]
    bench = data.pop("bench") if set(data) == {"bench"} else data
    if model in (BenchConfig, ColdstartConfig):
        return bench
    field = next((name for name, info in model.model_fields.items()
                  if info.annotation is BenchConfig), None)
    if field is None:
        raise UsageError(f"{where}: this command takes no bench settings")
    plan_fields = {k: v for k, v in plan.items() if k in model.model_fields and k != field}
    return plan_fields | {field: bench}


def read_workload(name: str, model: type[BaseModel]) -> dict[str, Any]:
    """The named workload's settings for `model`; `list` prints them all and exits."""
    files = {f.name.removesuffix(".yaml"): f for f in WORKLOADS.iterdir()
             if f.name.endswith(".yaml")}
    if name == "list":
        out = console()
        for key in sorted(files):
            out.print(f"{key:<12} {yaml.safe_load(files[key].read_text())['description']}",
                      highlight=False, markup=False)
        raise typer.Exit(0)
    if name not in files:
        raise UsageError(f"--workload {name!r}: expected one of {', '.join(sorted(files))} "
                         "(or list)")
    return placed(yaml.safe_load(files[name].read_text()), model, f"--workload {name}")
