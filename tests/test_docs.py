"""The documentation: the site builds with --strict (broken links, anchors and generated pages
fail it), the README stays a front door whose links lead somewhere, and the generated
reference pages cover every command and metric."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import typer

from latlab.cli import app
from latlab.records.catalog import formulas

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"),
         "-d", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def test_readme_is_a_front_door() -> None:
    assert len(README.splitlines()) <= 300
    commands = re.findall(r"^make \S+", README, flags=re.MULTILINE)
    assert "make test" in commands and "make demo" in commands


def test_readme_links_lead_somewhere(site: Path) -> None:
    relative = [t for t in LINK.findall(README) if not re.match(r"[a-z]+:", t)]
    assert relative
    for target in relative:
        path, _, anchor = target.partition("#")
        file = ROOT / path if path else ROOT / "README.md"
        assert file.exists(), f"README links to {target}: no such file"
        if anchor and file.suffix == ".md" and file.is_relative_to(ROOT / "docs"):
            rel = file.relative_to(ROOT / "docs")
            url = rel.parent if rel.stem == "index" else rel.with_suffix("")
            page = site / url / "index.html"
            assert f'id="{anchor}"' in page.read_text(encoding="utf-8"), \
                f"README links to {target}: the page has no such anchor"


def _command_paths(group, ctx, path: str = "latlab") -> list[str]:
    paths = []
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        paths.append(f"{path} {name}")
        if hasattr(command, "list_commands"):
            sub = command.context_class(command, info_name=name, parent=ctx)
            paths += _command_paths(command, sub, f"{path} {name}")
    return paths


def test_options_page_lists_every_command(site: Path) -> None:
    root = typer.main.get_command(app)
    paths = _command_paths(root, root.context_class(root, info_name="latlab"))
    assert "latlab bench" in paths and "latlab model export" in paths
    page = (site / "reference" / "cli" / "index.html").read_text(encoding="utf-8")
    missing = [p for p in paths if f'id="{p.replace(" ", "-")}"' not in page]
    assert not missing, f"commands without a section on the options page: {missing}"


def test_metrics_page_lists_every_metric(site: Path) -> None:
    page = (site / "reference" / "metrics" / "index.html").read_text(encoding="utf-8")
    missing = [name for name in formulas() if f"<code>{name}</code>" not in page]
    assert not missing, f"metrics missing from the metrics page: {missing}"
