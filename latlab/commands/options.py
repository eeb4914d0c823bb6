"""Command-line options, declared once as fields of option classes, typer options derived.

    class StopOptions(Options):
        duration: float | None = opt(None, "Seconds of load.", to="duration_s")

    @command(app, BenchOptions)
    def bench(options: BenchOptions) -> None: ...

A field's name gives its flag (`max_concurrency` → `--max-concurrency`) unless `flags` says
otherwise; `to` names the config field it fills, so a config's validation error names the
flag the user typed. Commands share groups of options by inheriting the classes.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any, Callable, ClassVar, TypeVar

import typer
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from latlab.commands.common import UsageError, run_command

O = TypeVar("O", bound="Options")


def opt(default: Any, help: str, *flags: str, to: str | None = None,
        envvar: str | None = None, metavar: str | None = None) -> Any:
    """A field that is a command-line option (see the module's doc)."""
    return Field(default, description=help, json_schema_extra={
        "flags": list(flags), "to": to, "envvar": envvar, "metavar": metavar})


class Options(BaseModel):
    model_config = ConfigDict(arbitrary_types_allowed=True)
    # Fields a command inherits with a group but does not take: no flag, the default.
    not_options: ClassVar[frozenset[str]] = frozenset()

    @classmethod
    def flag(cls, field: str) -> str:
        extra = cls.model_fields[field].json_schema_extra or {}
        flags = extra.get("flags") or [f"--{field.replace('_', '-')}"]
        return flags[0].split("/")[0]

    @classmethod
    def flags_by_target(cls) -> dict[str, str]:
        """Config field (or option field) → the flag that sets it."""
        out = {}
        for name, f in cls.model_fields.items():
            extra = f.json_schema_extra or {}
            out[extra.get("to") or name] = cls.flag(name)
        return out


Argument = tuple[str, Any, Any]  # name, type, typer.Argument(...)


def command(app: typer.Typer, options: type[O], name: str | None = None,
            arguments: tuple[Argument, ...] = (), **settings: Any) -> Callable:
    """Register `handler(*arguments, options)` as a command whose typer options are
    `options`' fields (and whose positional `arguments` are given as typer arguments)."""

    def register(handler: Callable[..., None]) -> Callable[..., None]:
        params = [inspect.Parameter(arg, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default,
                                    annotation=kind) for arg, kind, default in arguments]
        params += [_parameter(field, options.model_fields[field]) for field in _ordered(options)
                   if field not in options.not_options]
        positional = [arg for arg, _, _ in arguments]

        def cli(**values: Any) -> None:
            cmd = name or handler.__name__
            args = [values.pop(arg) for arg in positional]
            run_command(cmd.replace("_", " "), lambda: handler(*args, _build(options, values)))

        cli.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        cli.__name__, cli.__doc__ = handler.__name__, _unwrapped(handler.__doc__ or "")
        app.command(name, context_settings={"help_option_names": ["-h", "--help"]},
                    **settings)(cli)
        return handler

    return register


def _ordered(options: type[Options]) -> list[str]:
    """The fields in the order of the groups as the class lists them, its own fields last."""
    classes = [c for c in options.__mro__ if issubclass(c, Options) and c is not Options]
    groups = classes[1:] + classes[:1]
    where = {}
    for rank, cls in enumerate(groups):
        for i, name in enumerate(cls.__annotations__):
            if name in options.model_fields:
                where.setdefault(name, (rank, i))
    return sorted(options.model_fields, key=lambda name: where.get(name, (len(groups), 0)))


_METAVARS = {str: "TEXT", int: "INT", float: "NUMBER", Path: "PATH"}


def _metavar(annotation: Any) -> str | None:
    kinds = [a for a in (getattr(annotation, "__args__", None) or (annotation,))
             if a is not type(None)]
    inner = getattr(kinds[0], "__args__", None) if kinds else None
    return _METAVARS.get(inner[0] if inner else kinds[0]) if kinds else None


def _unwrapped(doc: str) -> str:
    """A docstring's paragraphs each on one line, so help text wraps to the terminal."""
    paragraphs = inspect.cleandoc(doc).split("\n\n")
    return "\n\n".join(" ".join(p.split()) for p in paragraphs)


def _parameter(field: str, info: Any) -> inspect.Parameter:
    extra = info.json_schema_extra or {}
    default = (... if info.is_required() else info.default_factory()
               if callable(info.default_factory) else info.default)
    option = typer.Option(default, *(extra.get("flags") or []), help=info.description,
                          envvar=extra.get("envvar"), show_envvar=bool(extra.get("envvar")),
                          metavar=extra.get("metavar") or _metavar(info.annotation))
    return inspect.Parameter(field, inspect.Parameter.KEYWORD_ONLY, default=option,
                             annotation=info.annotation)


def _build(options: type[O], values: dict[str, Any]) -> O:
    try:
        return options(**values)
    except ValidationError as e:
        raise UsageError(validation_message(e, options.flags_by_target())) from None


def validation_message(e: ValidationError, flags: dict[str, str]) -> str:
    """The first error of `e`, led by the flag of the field it is about."""
    first = e.errors()[0]
    field = next((str(p) for p in reversed(first["loc"]) if str(p) in flags), None)
    message = first["msg"].removeprefix("Value error, ")
    if field is None:
        return message
    value = first.get("input")
    shown = f" {value!r}" if isinstance(value, (int, float, str)) else ""
    return f"{flags[field]}{shown}: {message}"


def parse_numbers(text: str | None, option: str, kind: type = float) -> list | None:
    """`"1,2,4"` → `[1.0, 2.0, 4.0]` (None stays None); a bad list is a usage error."""
    if text is None:
        return None
    try:
        return [kind(item) for item in text.split(",") if item.strip()]
    except ValueError:
        raise UsageError(f"{option} {text!r}: expected a comma-separated list of "
                         f"{'whole ' if kind is int else ''}numbers") from None


_UNITS_S = {"ms": 1e-3, "s": 1.0, "m": 60.0, "": 1.0}


def parse_seconds(text: str, option: str) -> list[float]:
    """`"500ms,5s,1m"` → `[0.5, 5.0, 60.0]` (a bare number is seconds)."""
    gaps = []
    for item in (i.strip() for i in text.split(",") if i.strip()):
        number = item.rstrip("ms")
        unit = item[len(number):]
        try:
            gaps.append(float(number) * _UNITS_S[unit])
        except (ValueError, KeyError):
            raise UsageError(f"{option} {item!r}: expected a duration like 500ms, 5s or 1m")
    return gaps

