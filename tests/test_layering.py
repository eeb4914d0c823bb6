"""The package layering of docs/design.md, enforced: no module imports a package its layer
may not import (function-level imports included); a module past `SMELL_LINES` is a smell
(a warning: one concept may need more), past `MAX_LINES` an error."""

import ast
import graphlib
import re
import warnings
from pathlib import Path

ROOT = Path(__file__).parent.parent
PACKAGE = ROOT / "latlab"
SMELL_LINES = 300  # worth a look: is this one concept?
MAX_LINES = 500  # surely several
ANYWHERE = {"__init__"}  # `latlab.__version__`


def rules() -> dict[str, set[str]]:
    """`layer → the layers it may import`, from the block under "may import" in the design."""
    text = (ROOT / "docs" / "design.md").read_text()
    block = re.search(r"```\nlayer\s+may import\n(.*?)```", text, re.S)
    assert block, "docs/design.md lost its layering block"
    out = {}
    for line in block.group(1).strip().splitlines():
        layer, *allowed = line.split()
        out[layer] = set() if allowed == ["(nothing)"] else set(allowed)
    return out


def imports(path: Path) -> set[str]:
    """The top-level latlab packages `path` imports."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [n.name for n in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] == "latlab":
                found.add(parts[1] if len(parts) > 1 else "__init__")
    return found


def layer_of(path: Path) -> str:
    return path.relative_to(PACKAGE).with_suffix("").parts[0]


def test_every_package_is_in_the_design():
    packages = {layer_of(p) for p in PACKAGE.rglob("*.py")} - {"__init__", "__main__"}
    assert packages <= set(rules()), f"not in docs/design.md: {packages - set(rules())}"


def test_no_module_imports_against_the_layering():
    allowed = rules()
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        layer = layer_of(path)
        if layer not in allowed:
            continue
        for target in imports(path) - {layer} - ANYWHERE - allowed[layer]:
            wrong.append(f"{path.relative_to(ROOT)} imports latlab.{target}")
    assert not wrong, "imports against docs/design.md's layering:\n" + "\n".join(wrong)


def test_the_rule_catches_a_back_edge(tmp_path):
    bad = tmp_path / "m.py"
    bad.write_text("def f():\n    from latlab.report.console import print_summary\n")
    assert "report" in imports(bad) and "report" not in rules()["load"]


def test_no_module_is_over_the_limit():
    lengths = {p.relative_to(ROOT): len(p.read_text().splitlines())
               for p in PACKAGE.rglob("*.py")}
    smells = [f"{p}: {n} lines" for p, n in lengths.items() if SMELL_LINES < n <= MAX_LINES]
    if smells:
        warnings.warn("over 300 lines: one concept each?\n" + "\n".join(smells), stacklevel=1)
    long = [f"{p}: {n} lines" for p, n in lengths.items() if n > MAX_LINES]
    assert not long, "split these by concept:\n" + "\n".join(long)


def module_imports(path: Path) -> set[str]:
    """The latlab modules `path` imports (function-level and TYPE_CHECKING imports too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found |= {f"{node.module}.{a.name}" for a in node.names} | {node.module}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
    return {name for name in found if name.startswith("latlab")}


def test_no_import_circles():
    """No module reaches itself through imports: each concept depends on lower ones only."""
    modules = {".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): p
               for p in PACKAGE.rglob("*.py")}
    graph = {name: {m for m in module_imports(path) if m in modules and m != name}
             for name, path in modules.items()}
    try:
        tuple(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as e:
        raise AssertionError(f"an import circle: {' -> '.join(e.args[1])}") from None


def package_rows() -> dict[str, str]:
    """The package table of docs/design.md: `package → its row's text`."""
    text = (ROOT / "docs" / "design.md").read_text()
    return {m["name"]: m["text"] for m in re.finditer(
        r"^\| `(?P<name>[a-z_]+)` \| (?P<text>.*) \|$", text, re.M)}


def test_the_design_names_every_module_of_every_package():
    """docs/design.md is the contract: a module it does not name is one it does not know."""
    rows = package_rows()
    missing = []
    packages = (p for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists())
    for package in sorted(packages):
        row = rows.get(package.name)
        if row is None:
            missing.append(f"{package.name} (no row)")
            continue
        named = set(re.findall(r"`([a-z_]+)", row))
        for module in package.rglob("*.py"):
            if module.stem != "__init__" and module.stem not in named:
                missing.append(f"{package.name}/{module.relative_to(package)}")
    assert not missing, "docs/design.md does not name:\n" + "\n".join(missing)


def test_the_design_names_every_diagnosis_rule():
    from latlab.analysis.diagnose import RULES

    text = (ROOT / "docs" / "design.md").read_text()
    section = text[text.index("## Diagnosis"):text.index("## The run folder")]
    missing = [rule.__name__ for rule in RULES if f"`{rule.__name__}`" not in section]
    assert not missing, f"docs/design.md's Diagnosis does not name: {missing}"
