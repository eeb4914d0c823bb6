"""MkDocs hook: the reference pages' generated parts, read from latlab's code at build time.

A page asks for one with a line of its own, `<!-- generate: NAME -->` (NAME a key of
GENERATORS); the hand-written prose around it stays. Every generator raises when the code
it reads has changed shape, so `mkdocs build` fails instead of rendering an empty page.
"""

from __future__ import annotations

import ast
import dataclasses
import html
import inspect
import json
import re
import sys
import textwrap
import types
from collections.abc import Callable
from pathlib import Path

MARKER = re.compile(r"^<!-- generate: ([\w-]+) -->$", re.MULTILINE)


def on_config(config):
    # Document the checkout being built, whichever latlab the environment has installed
    # (mkdocs restores sys.path after loading this file, so not at import time).
    sys.path.insert(0, str(Path(config.config_file_path).resolve().parent))
    return config


def on_page_markdown(markdown: str, page, config, files) -> str:
    def expand(match: re.Match) -> str:
        name = match[1]
        if name not in GENERATORS:
            raise ValueError(f"{page.file.src_uri}: no generator named {name!r}")
        text = GENERATORS[name]()
        if not text.strip():
            raise ValueError(f"{page.file.src_uri}: generator {name!r} rendered nothing")
        return text

    return MARKER.sub(expand, markdown)


def cell(text: object) -> str:
    """Text for a table cell: one line, HTML and pipes escaped outside `code` spans."""
    parts = str(text).split("`")
    for i in range(0, len(parts), 2):  # the even parts are outside code spans
        parts[i] = html.escape(parts[i], quote=False).replace("*", r"\*")
    return " ".join("`".join(parts).split()).replace("|", r"\|")


# ---------------------------------------------------------------- every command's options

def cli() -> str:
    """Each command of `latlab` and its options, walked through click's objects."""
    import typer

    from latlab.cli import app

    root = typer.main.get_command(app)
    ctx = root.context_class(root, info_name="latlab")
    out = [_command("latlab", root, ctx)]
    for path, command, sub in _commands(root, ctx):
        out.append(_command(path, command, sub))
    if len(out) < 2:
        raise ValueError("the latlab command tree has no commands")
    return "\n".join(out)


def _commands(group, ctx, path="latlab"):
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        if command is None:
            raise ValueError(f"{path} lists {name!r} but has no such command")
        sub = command.context_class(command, info_name=name, parent=ctx)
        yield f"{path} {name}", command, sub
        if hasattr(command, "list_commands"):
            yield from _commands(command, sub, f"{path} {name}")


def _command(path: str, command, ctx) -> str:
    if not command.help:
        raise ValueError(f"`{path}` has no help text")
    params = [p for p in command.params if not getattr(p, "hidden", False)]
    arguments = [p for p in params if p.param_type_name == "argument"]
    options = [p for p in params if p.param_type_name == "option"]
    usage = [path, "[OPTIONS]"] + [p.metavar or p.name.upper() for p in arguments]
    if hasattr(command, "list_commands"):
        usage.append("COMMAND")
    lines = [f"## {path}", "", inspect.cleandoc(command.help), "",
             "```", " ".join(usage), "```", ""]
    if hasattr(command, "list_commands"):
        lines += ["| command | what it does |", "|---|---|"]
        for name in command.list_commands(ctx):
            help_ = inspect.cleandoc(command.get_command(ctx, name).help or "").split("\n\n")[0]
            lines.append(f"| [`{path} {name}`](#{path.replace(' ', '-')}-{name}) | {cell(help_)} |")
        lines.append("")
    if arguments:
        lines += ["| argument | description |", "|---|---|"]
        lines += [f"| `{p.metavar or p.name.upper()}` | {cell(getattr(p, 'help', '') or '')} |"
                  for p in arguments] + [""]
    groups: dict[str, list] = {}
    for p in options:  # a help group when the option names one, in order of appearance
        group = getattr(p, "help_group", None) or getattr(p, "rich_help_panel", None)
        groups.setdefault(group or "Options", []).append(p)
    for group, members in groups.items():
        if len(groups) > 1:
            lines += [f"**{group}**", ""]
        lines += ["| option | type | default | description |", "|---|---|---|---|"]
        lines += [_option(p) for p in members] + [""]
    return "\n".join(lines)


def _option(p) -> str:
    flags = ", ".join(p.opts) + (" / " + ", ".join(p.secondary_opts) if p.secondary_opts else "")
    kind = "flag" if p.is_flag else (p.metavar or "")
    if p.multiple:
        kind += ", repeatable"
    notes = [getattr(p, "help", None) or ""]
    if p.envvar:
        notes.append(f"(environment: `{p.envvar}`)")
    if p.required:
        notes.append("(required)")
    return f"| `{flags}` | {cell(kind)} | {cell(_default(p))} | {cell(' '.join(notes))} |"


def _default(p) -> str:
    if isinstance(p.show_default, str):
        return p.show_default
    value = p.default() if callable(p.default) else p.default
    if p.is_flag and p.secondary_opts:
        return (p.opts if value else p.secondary_opts)[0]
    if p.is_flag:
        return "on" if value else "off"
    if value is None or value == "" or (p.multiple and not value):
        return "–"
    return ", ".join(map(str, value)) if p.multiple else str(getattr(value, "value", value))


# ---------------------------------------------------------------- metrics

def metric_definitions() -> dict[str, str]:
    """name → definition of every metric: the one place that reads them."""
    from latlab.records.catalog import formulas

    FORMULAS = formulas()

    if not isinstance(FORMULAS, dict) or not FORMULAS:
        raise ValueError("latlab.records.catalog.formulas() is no longer a filled dict")
    return FORMULAS


def metrics() -> str:
    rows = [f"| `{name}` | {cell(text)} |" for name, text in metric_definitions().items()]
    return "\n".join(["| metric | definition |", "|---|---|", *rows])


# ---------------------------------------------------------------- findings and thresholds

def findings() -> str:
    """Each diagnosis rule, in the order it runs, with the thresholds its code uses."""
    from latlab.analysis.diagnose import RULES

    if not RULES:
        raise ValueError("latlab.analysis.diagnose.RULES is empty")
    out, module, thresholds = [], None, 0
    for rule in RULES:
        if rule.__module__ != module:
            module = rule.__module__
            out += [f"## {module.rsplit('.', 1)[-1]}", "",
                    inspect.cleandoc(sys.modules[module].__doc__ or ""), "",
                    f"Source: `{module.replace('.', '/')}.py`", ""]
        out += [f"### {rule.__name__}", ""]
        if rule.__doc__:
            out += [inspect.cleandoc(rule.__doc__), ""]
        used = _names(rule)
        constants = {name: note for name, note in _constants(sys.modules[module]).items()
                     if name in used}
        notes = any(constants.values())
        if constants:
            columns = ["threshold", "value"] + (["note"] if notes else [])
            out += ["| " + " | ".join(columns) + " |", "|---" * len(columns) + "|"]
            for name, note in constants.items():
                value = rule.__globals__[name]
                out.append(f"| `{name}` | {value!r} |" + (f" {cell(note)} |" if notes else ""))
            out.append("")
        else:
            out += ["No thresholds: it fires on any occurrence.", ""]
        thresholds += len(constants)
    if not thresholds:
        raise ValueError("no diagnosis rule reads a module-level threshold constant any more")
    return "\n".join(out)


def _names(function: Callable, seen: set | None = None) -> set[str]:
    """The global names a function reads, through its nested functions and the functions of
    its own module that it calls."""
    seen = seen if seen is not None else set()
    seen.add(function)
    codes, names = [function.__code__], set()
    while codes:
        code = codes.pop()
        names.update(code.co_names)
        codes += [c for c in code.co_consts if isinstance(c, types.CodeType)]
    for name in list(names):
        value = function.__globals__.get(name)
        if isinstance(value, types.FunctionType) and value not in seen \
                and value.__module__ == function.__module__:
            names |= _names(value, seen)
    return names


def _constants(module: types.ModuleType) -> dict[str, str]:
    """The module's own UPPER_CASE numbers, in order, each with its line's comment."""
    source = inspect.getsource(module)
    lines = source.splitlines()
    found = {}
    for node in ast.parse(source).body:
        if not isinstance(node, ast.Assign):
            continue
        try:  # numbers written as such, not computed sentinels such as np.iinfo(...).max
            ast.literal_eval(node.value)
        except ValueError:
            continue
        comment = lines[node.end_lineno - 1].partition("#")[2].strip()
        for name in (n.id for target in node.targets for n in ast.walk(target)
                     if isinstance(n, ast.Name) and n.id.isupper()):
            value = getattr(module, name)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                found[name] = comment
    return found


# ---------------------------------------------------------------- the server-timing protocol

def server_timing() -> str:
    """The protocol's stages (records), the interval each measures (the server's code), the
    fields every adapter fills, and an example of both encodings made by the code itself."""
    from latlab.records.server_timing import SERVER_TIMING_STAGES, ServerTiming
    from latlab.server import timing

    intervals = _intervals(inspect.getsource(timing.server_timing))
    missing = set(SERVER_TIMING_STAGES) - set(intervals)
    if missing:
        raise ValueError(f"latlab.server.timing.server_timing computes no {sorted(missing)}")
    example = ServerTiming(preprocess=0.4, queue=2.1, prefill=35.0, decode=410.2,
                           postprocess=0.1, total=447.9)
    fields = dataclasses.fields(ServerTiming)
    if not fields:
        raise ValueError("ServerTiming has no fields")
    return "\n".join([
        "### Stages", "",
        "| stage | interval, on the server's clock |", "|---|---|",
        *[f"| `{stage}` | `{intervals[stage][0]}` → `{intervals[stage][1]}` |"
          for stage in SERVER_TIMING_STAGES], "",
        "### Encodings", "",
        "In a stream's final usage event (and a non-streamed body), next to `usage`:", "",
        "```json", f'{{"usage": {{...}}, "server_timing": {json.dumps(example.to_json())}}}',
        "```", "",
        "As a W3C header of a non-streamed response:", "",
        "```", f"Server-Timing: {example.to_header()}", "```", "",
        "### What latlab keeps per request", "",
        inspect.cleandoc(ServerTiming.__doc__ or ""), "",
        "| field | type | in the protocol |", "|---|---|---|",
        *[f"| `{f.name}` | {cell(f.type)} | {'yes' if f.name in SERVER_TIMING_STAGES else '–'} |"
          for f in fields],
    ])


def _intervals(source: str) -> dict[str, tuple[str, str]]:
    """stage → (start, end) from `stage=ms_between(times.END, times.START)` keywords."""
    found = {}
    for node in ast.walk(ast.parse(textwrap.dedent(source))):
        if isinstance(node, ast.keyword) and isinstance(node.value, ast.Call) \
                and getattr(node.value.func, "id", None) == "ms_between":
            end, start = (arg.attr for arg in node.value.args)
            found[node.arg] = (start, end)
    return found


def server_adapters() -> str:
    """The per-server adapters' table (the module's docstring) and the `--server-kind` values."""
    from latlab.load.request import server_timing as adapters

    if "| server |" not in (adapters.__doc__ or ""):
        raise ValueError("latlab.load.request.server_timing's docstring lost its table of servers")
    kinds = ", ".join(f"`{kind.value}`" for kind in adapters.ServerKind)
    return inspect.cleandoc(adapters.__doc__) + f"\n\n`--server-kind` takes: {kinds}."


# ---------------------------------------------------------------- each server's flag per knob

def advice_flags() -> str:
    """`latlab.analysis.advice.FLAGS`: which flag each finding's advice names, per server."""
    from latlab.analysis.advice import FLAGS

    servers = ("latlab", "vllm", "sglang", "llamacpp", "tgi", "ollama")
    names = {"latlab": "latlab serve", "vllm": "vLLM", "sglang": "SGLang",
             "llamacpp": "llama.cpp", "tgi": "TGI", "ollama": "Ollama"}
    found = {kind for flags in FLAGS.values() for kind in flags}
    if not found <= set(servers) or not FLAGS:
        raise ValueError(f"advice.FLAGS names servers this page does not know: {found}")
    out = ["| knob | " + " | ".join(names[s] for s in servers) + " |",
           "|---|" + "---|" * len(servers)]
    for knob, flags in FLAGS.items():
        row = []
        for server in servers:
            flag = flags.get(server)
            if flag is None:
                row.append("–")
                continue
            text = f"`{flag.spelling.format(n='N')}`"
            if flag.where != "option":
                text += f" ({flag.where})"
            if flag.default is not None:
                text += f", default {str(flag.default).lower()}"
            if flag.note:
                text += f": {flag.note}"
            row.append(cell(text))
        out.append(f"| `{knob}` | " + " | ".join(row) + " |")
    return "\n".join(out)


GENERATORS: dict[str, Callable[[], str]] = {
    "advice-flags": advice_flags,
    "cli": cli,
    "metrics": metrics,
    "findings": findings,
    "server-timing": server_timing,
    "server-adapters": server_adapters,
}
