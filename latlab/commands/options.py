"""A command's options, derived from the config it builds and its own display options
(`records.settings`: every setting is declared once, on the config that carries it).

    command(app, bench, config=BenchConfig, options=BenchDisplay)

registers `bench(config, options)`: each field of `BenchConfig` (and of its sub-configs)
that is a setting becomes an option in its help group; the options given build the config,
laid over `--config FILE` and `--workload NAME` when the command takes them; a config that
does not validate is a usage error led by the flag at fault.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer
import typer.core
from pydantic import BaseModel, ValidationError

from latlab.commands.common import UsageError, run_command
from latlab.records.settings import (
    GROUPS,
    OUTPUT,
    Spec,
    flag_of,
    merge,
    nest,
    option,
    setting,
    specs,
    sub_config,
)

Argument = tuple[str, Any, Any]  # name, type, typer.Argument(...)


class Options(BaseModel):
    """A command's own options: what to print, not what to run."""


class JsonOutput(Options):
    json_output: bool = setting(False, "Print the command's record (summary.json, sweep.json, "
                                "ab.json, ...) to stdout.", "--json", group=OUTPUT)


class ConfigFile(JsonOutput):
    """Where a command's config can come from besides its flags."""

    config_file: Path | None = setting(None, "Read the settings from this YAML or JSON file "
                                       "(config.json's schema; a run folder or its config.json "
                                       "reruns that run); flags override it.", "--config",
                                       group=OUTPUT)


class NamedWorkload(ConfigFile):
    workload: str | None = setting(None, "A named workload to start from (`--workload list` "
                                   "shows them); --config and flags override it.",
                                   "--workload", group=OUTPUT)


class TestedAdvice(NamedWorkload):
    test_advice: bool = setting(True, "Predict the effect of each setting a finding suggests "
                                "(the run's own calibration, a few seconds a suggestion) and "
                                "leave out those predicted to hurt.",
                                "--test-advice/--no-test-advice", group=OUTPUT)


class GroupedCommand(typer.core.TyperCommand):
    """Plain help with the options in sections by help group, in the groups' order."""

    def format_options(self, ctx: typer.Context, formatter: Any) -> None:
        sections: dict[str, list[tuple[str, str]]] = {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is not None:
                group = getattr(param, "rich_help_panel", None) or "Other"
                sections.setdefault("Arguments" if param.param_type_name == "argument"
                                    else group, []).append(record)
        order = ["Arguments", *GROUPS]
        for title in sorted(sections, key=lambda g: order.index(g) if g in order else len(order)):
            with formatter.section(title):
                formatter.write_dl(sections[title])


def command(app: typer.Typer, handler: Callable[..., None], *,
            config: type[BaseModel] | None = None, options: type[Options] | None = None,
            exclude: frozenset[str] = frozenset(), name: str | None = None,
            arguments: tuple[Argument, ...] = (),
            into: dict[str, tuple[str, ...]] | None = None) -> None:
    """Register `handler(*arguments, config=..., options=...)` on `app` (see the module's
    doc); `exclude` names the config's settings this command does not take; `into` names
    the arguments that are a setting of the config (by its path), not the handler's."""
    into = into or {}
    config_specs = list(specs(config, exclude)) if config else []
    option_specs = list(specs(options)) if options else []
    params = [inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                annotation=typer.Context)]
    params += [inspect.Parameter(arg, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default,
                                 annotation=kind) for arg, kind, default in arguments]
    params += [_parameter(spec) for spec in config_specs + option_specs]
    positional = [arg for arg, _, _ in arguments]

    def cli(ctx: typer.Context, **values: Any) -> None:
        args = [values.pop(arg) for arg in positional]
        settings = nest({into[a]: v for a, v in zip(positional, args) if a in into})
        args = [v for a, v in zip(positional, args) if a not in into]
        given = _given(ctx, values)

        def body() -> None:
            kwargs: dict[str, Any] = {}
            if options:
                kwargs["options"] = options(**{s.path[0]: values[s.key] for s in option_specs})
            if config:
                kwargs["config"] = build(config, config_specs, values, given,
                                         kwargs.get("options"), settings)
            handler(*args, **kwargs)

        run_command((name or handler.__name__).replace("_", " "), body)

    cli.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    cli.__name__, cli.__doc__ = handler.__name__, _unwrapped(handler.__doc__ or "")
    app.command(name, cls=GroupedCommand,
                context_settings={"help_option_names": ["-h", "--help"]})(cli)


def parse_args(model: type[BaseModel], argv: list[str], where: str) -> Any:
    """`model` from a command line of its settings (`--serve-args "--max-num-seqs 8"`): the
    same options its own command takes; an error is a usage error led by `where`."""
    config_specs = list(specs(model))
    app = typer.Typer()
    command(app, lambda config: None, config=model, name="x")
    cmd = typer.main.get_command(app)
    try:
        ctx = cmd.make_context(where, list(argv))
    except Exception as e:  # click's usage errors, from the click typer carries
        if not hasattr(e, "format_message"):
            raise
        raise UsageError(f"{where}: {e.format_message()}") from None
    try:
        return build(model, config_specs, ctx.params, _given(ctx, ctx.params))
    except UsageError as e:
        raise UsageError(f"{where}: {e}") from None


def _given(ctx: typer.Context, values: dict[str, Any]) -> set[str]:
    """The options the user gave (on the command line or in the environment)."""
    sources = {key: ctx.get_parameter_source(key) for key in values}
    return {key for key, source in sources.items()
            if source is not None and source.name not in ("DEFAULT", "DEFAULT_MAP")}


def build(model: type[BaseModel], config_specs: list[Spec], values: dict[str, Any],
          given: set[str], display: Options | None = None,
          settings: dict[str, Any] | None = None) -> Any:
    """`model` from the options given, over the named workload and the config file."""
    # here, not at the top: `latlab serve` reads neither, and starts without their imports
    from latlab.commands.config_files import read_config_file, read_workload

    base: dict[str, Any] = {}
    if isinstance(display, NamedWorkload) and display.workload is not None:
        base = overlay(model, base, read_workload(display.workload, model))
    if isinstance(display, ConfigFile) and display.config_file is not None:
        base = overlay(model, base, read_config_file(display.config_file, model))
    flags = merge(nest({s.path: values[s.key] for s in config_specs if s.key in given}),
                  settings or {})
    try:
        return model.model_validate(overlay(model, base, flags))
    except ValidationError as e:
        raise UsageError(validation_message(e, model)) from None


def overlay(model: type[BaseModel], base: dict[str, Any], over: dict[str, Any]
            ) -> dict[str, Any]:
    """`over` laid on `base` key by key; a sub-config with a default of its own starts from
    it, and one whose settings replace each other (`under`) drops what `over` replaces."""
    out = dict(base)
    for key, value in over.items():
        info = model.model_fields.get(key)
        child = sub_config(info.annotation) if info is not None else None
        if child is None or not isinstance(value, dict):
            out[key] = value
            continue
        start = out.get(key)
        if not isinstance(start, dict):
            default = info.default if isinstance(info.default, BaseModel) else None
            start = default.model_dump(exclude_unset=True) if default is not None else {}
        if hasattr(child, "under"):
            start = child.under(start, value)
        out[key] = overlay(child, start, value)
    return out


def validation_message(e: ValidationError, model: type[BaseModel]) -> str:
    """The first error of `e`, led by the flag of the setting it is about."""
    first = e.errors()[0]
    message = first["msg"].removeprefix("Value error, ")
    node: Any = model
    flag = None
    for part in first["loc"]:
        fields = getattr(node, "model_fields", None)
        if not fields or part not in fields:
            break
        flag = flag_of(node, str(part)) if option(fields[part]) else flag
        node = sub_config(fields[part].annotation)
    if flag is None or message.startswith("--"):
        return message
    if message.startswith("'"):  # the message names the bad item of a list
        return f"{flag} {message}"
    value = first.get("input")
    shown = f" {value!r}" if isinstance(value, (int, float, str)) else ""
    return f"{flag}{shown}: {message}"


def _unwrapped(doc: str) -> str:
    """A docstring's paragraphs each on one line, so help text wraps to the terminal."""
    paragraphs = inspect.cleandoc(doc).split("\n\n")
    return "\n\n".join(" ".join(p.split()) for p in paragraphs)


_METAVARS = {str: "TEXT", int: "INT", float: "NUMBER", Path: "PATH"}


def _metavar(annotation: Any) -> str | None:
    kinds = [a for a in (getattr(annotation, "__args__", None) or (annotation,))
             if a is not type(None)]
    inner = getattr(kinds[0], "__args__", None) if kinds else None
    return _METAVARS.get(inner[0] if inner else kinds[0]) if kinds else None


def _parameter(spec: Spec) -> inspect.Parameter:
    flags = list(spec.flags)
    option = typer.Option(spec.default, *flags, help=spec.help, show_default=spec.show_default,
                          envvar=list(spec.envvar) or None, show_envvar=bool(spec.envvar),
                          metavar=spec.metavar or _metavar(spec.annotation),
                          rich_help_panel=spec.group)
    return inspect.Parameter(spec.key, inspect.Parameter.KEYWORD_ONLY, default=option,
                             annotation=spec.annotation)
