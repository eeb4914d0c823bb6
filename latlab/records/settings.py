"""Settings declared once. A config field that is also a command-line option is declared with
`setting()`: its help is the field's description (so the JSON Schema documents config files
too), its default the field's default, and an `Option` marker says its flag and help group.

    class RequestConfig(BaseModel):
        timeout_s: float = setting(300.0, "Per-request timeout in seconds.", "--timeout",
                                   group=CLIENT, gt=0)

Commands derive their options from the configs they build (`specs`): a field whose type
is a config and that carries no marker is a sub-config, its options flattened into the
command's. A field whose command-line form differs from its value (a distribution written
`lognormal:256,128`, repeated `NAME:WEIGHT` labels) takes that form through the field's own
validator, so a config file may use it too.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Union

from pydantic import BaseModel, Field
from pydantic.fields import FieldInfo

# Help groups, in the order `--help` shows them.
TARGET, CLIENT, WORKLOAD, SESSIONS, LOAD, TRACE, STOP, SWEEP, AB, TELEMETRY, OUTPUT = (
    "Target", "Client", "Workload", "Sessions and agents", "Load", "Trace replay",
    "When to stop", "Sweep", "A/B", "Telemetry", "Output")
ENGINE, BATCHING, TECHNIQUES, SERVER = ("Model and engine", "Batching and KV cache",
                                        "Latency techniques", "Server")
CALIBRATION, INTERVALS, FLEET, AUTOSCALE, COLDSTART, VERDICT, OBSERVE, TUNE, OTHER = (
    "Calibration", "Intervals and trust", "Fleet", "Autoscaling", "Cold start", "Verdicts",
    "Observe", "Tune", "Other")
GROUPS = (TARGET, OBSERVE, COLDSTART, CALIBRATION, INTERVALS, VERDICT, TUNE, WORKLOAD, SESSIONS,
          LOAD, TRACE, SWEEP, AB, STOP, FLEET, AUTOSCALE, ENGINE, BATCHING, TECHNIQUES, SERVER,
          TELEMETRY, CLIENT, OUTPUT,
          OTHER)


@dataclass(frozen=True)
class Option:
    """How a config field appears on the command line."""

    flags: tuple[str, ...] = ()  # default: --field-name, a unit suffix (_s) dropped
    group: str = OTHER
    cli_type: Any = None  # what the command line gives, when it is not the field's type
    metavar: str | None = None
    envvar: tuple[str, ...] = ()
    show_default: bool = True  # False: the default is derived (the help says how)


def setting(default: Any, help: str, *flags: str, group: str = OTHER, cli_type: Any = None,
            metavar: str | None = None, envvar: tuple[str, ...] = (), show_default: bool = True,
            **field: Any) -> Any:
    """A config field that is a command-line option (see the module's doc); `field` takes
    pydantic's constraints (`gt=0`, `default_factory`, ...)."""
    info: FieldInfo = Field(default, description=help, **field)
    info.metadata.append(Option(flags, group, cli_type, metavar, envvar, show_default))
    return info


class Derived:
    """Marks a field a run derives (its prompt salt, the server's context): recorded in
    config.json, but not a setting: a config file's value is dropped and derived again."""


def derived(default: Any = None, **field: Any) -> Any:
    """A field that is recorded, not set (`Derived`)."""
    info: FieldInfo = Field(default, **field)
    info.metadata.append(Derived())
    return info


def settings_of(model: type[BaseModel], data: dict[str, Any]) -> dict[str, Any]:
    """`data` (a config as written to disk) without the fields a run derived."""
    out = {}
    for key, value in data.items():
        info = model.model_fields.get(key)
        if info is not None and any(isinstance(m, Derived) for m in info.metadata):
            continue
        child = sub_config(info.annotation) if info is not None else None
        out[key] = settings_of(child, value) if child and isinstance(value, dict) else value
    return out


@dataclass(frozen=True)
class Spec:
    """One option derived from a config field: where its value goes (`path`, from the root
    config), its flags, help, group, default and command-line type."""

    path: tuple[str, ...]
    flags: tuple[str, ...]
    help: str
    group: str
    default: Any
    annotation: Any
    metavar: str | None
    envvar: tuple[str, ...]
    show_default: bool

    @property
    def key(self) -> str:
        """A Python name for the option (its path joined)."""
        return "__".join(self.path)

    @property
    def flag(self) -> str:
        return self.flags[0].split("/")[0]


def option(info: FieldInfo) -> Option | None:
    return next((m for m in info.metadata if isinstance(m, Option)), None)


def flag_of(model: type[BaseModel], name: str) -> str:
    """The flag of `model`'s field `name` (for messages)."""
    info = model.model_fields.get(name)
    marker = option(info) if info is not None else None
    return (marker.flags[0].split("/")[0] if marker and marker.flags
            else f"--{name.removesuffix('_s').replace('_', '-')}")


def sub_config(annotation: Any) -> type[BaseModel] | None:
    """The config class of a field typed `Config` or `Config | None`, else None."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)] \
        if _is_union(annotation) else [annotation]
    model = args[0] if len(args) == 1 else None
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


def _is_union(annotation: Any) -> bool:
    return typing.get_origin(annotation) in (Union, types.UnionType)


def specs(model: type[BaseModel], exclude: frozenset[str] = frozenset(),
          defaults: BaseModel | None = None, path: tuple[str, ...] = (),
          absent: bool = False) -> Iterator[Spec]:
    """Every option of `model` and its sub-configs, in declaration order; `exclude` holds
    dotted paths (a sub-config's path drops all of it); `defaults` is the instance whose
    values are the defaults (a parent's default sub-config); `absent`: the sub-config is
    absent unless one of its options is given (its options have no default)."""
    for name, info in model.model_fields.items():
        where = (*path, name)
        if ".".join(where) in exclude:
            continue
        marker = option(info)
        default = getattr(defaults, name) if defaults is not None else _default(info)
        if marker is None:
            child = sub_config(info.annotation)
            if child is not None:
                yield from specs(child, exclude, default if isinstance(default, child)
                                 else None, where, absent or default is None)
            continue
        annotation = marker.cli_type or info.annotation
        flags = marker.flags or (flag_of(model, name),)
        if annotation is bool and "/" not in flags[0]:
            flags = (f"{flags[0]}/--no-{flags[0].removeprefix('--')}", *flags[1:])
        yield Spec(where, flags, info.description or "", marker.group,
                   None if absent else _cli_default(default), annotation, marker.metavar,
                   marker.envvar, marker.show_default and not absent)


def _default(info: FieldInfo) -> Any:
    if info.is_required():
        return ...
    return info.default_factory() if info.default_factory is not None else info.default


def _cli_default(value: Any) -> Any:
    """A default as the command line writes it (a distribution as its text, labels as
    NAME:WEIGHT items, a secret hidden)."""
    if isinstance(value, dict):
        return [f"{k}:{v:g}" for k, v in value.items()]
    if isinstance(value, BaseModel):
        return str(value)
    return value


def derive(model: BaseModel, **values: Any) -> None:
    """Fill defaults derived from other settings (a warm-up from the duration) without
    counting them as given: `model_fields_set` keeps only what was given, so a config laid
    over another, or rebuilt from what was given, derives them again."""
    model.__dict__.update(values)


def nest(values: dict[tuple[str, ...], Any]) -> dict[str, Any]:
    """`{("workload", "seed"): 1}` → `{"workload": {"seed": 1}}`."""
    out: dict[str, Any] = {}
    for path, value in values.items():
        node = out
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = value
    return out


def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`over` laid on `base`, sub-dicts merged key by key."""
    out = dict(base)
    for key, value in over.items():
        out[key] = (merge(out[key], value) if isinstance(value, dict)
                    and isinstance(out.get(key), dict) else value)
    return out
