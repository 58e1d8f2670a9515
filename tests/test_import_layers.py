"""curate/ has no import circles, its packages form a stack of floors (docs/design.md#architecture),
and the run registry finds every record kind without importing them at module import time.

The import graph is read from the source (``ast``), not from ``sys.modules``: every ``import`` and
``from ... import`` statement counts, at module level or inside a function, under
``if TYPE_CHECKING`` or not, relative ones resolved against their package.
"""
from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "curate"
DESIGN = ROOT / "docs" / "design.md"


def module_files() -> dict[str, tuple[Path, bool]]:
    """``{dotted module name: (file, is a package __init__)}`` for every .py file under curate/."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts = parts[:-1]
        out[".".join(parts)] = (path, is_package)
    return out


def import_graph() -> dict[str, dict[str, int]]:
    """``{module: {imported curate module: line of its first import}}``. ``from X import Y`` is an
    import of ``X.Y`` when that is a module, else of ``X``; a name that is no module resolves to
    the nearest enclosing module."""
    mods = module_files()

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, dict[str, int]] = {m: {} for m in mods}
    for module, (path, is_package) in mods.items():
        package = module if is_package else module.rpartition(".")[0]
        targets: list[tuple[str | None, int]] = []
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                targets += [(resolve(a.name), node.lineno) for a in node.names if a.name.split(".")[0] == "curate"]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                if source.split(".")[0] != "curate":
                    continue
                for alias in node.names:
                    full = f"{source}.{alias.name}"
                    targets.append((full if full in mods else resolve(source), node.lineno))
        for target, line in targets:
            if target and target != module:
                graph[module].setdefault(target, line)
    return graph


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def package_of(module: str) -> str:
    """The floor a module stands on: its first package under curate/ (``curate.store.x`` ->
    ``store``), a top-level module itself (``curate.features`` -> ``features``), ``curate`` for
    the package's own ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "curate"


def package_graph(graph: dict[str, dict[str, int]]) -> dict[str, dict[str, list[str]]]:
    """``{package: {imported package: ["module:line -> module", ...]}}`` (other packages only)."""
    out: dict[str, dict[str, list[str]]] = defaultdict(dict)
    for module, targets in graph.items():
        out[package_of(module)]
        for target, line in targets.items():
            a, b = package_of(module), package_of(target)
            if a != b:
                out[a].setdefault(b, []).append(f"{module}:{line} -> {target}")
    return out


def floors(packages: dict[str, dict[str, list[str]]]) -> dict[str, int]:
    """Floor of each package: 0 when it imports no other package, else 1 + the highest floor it imports."""
    memo: dict[str, int] = {}

    def floor(p: str) -> int:
        if p not in memo:
            memo[p] = 1 + max((floor(q) for q in packages[p]), default=-1)
        return memo[p]

    return {p: floor(p) for p in packages}


def describe(component: list[str], graph: dict[str, set[str]], lines: dict[tuple[str, str], str]) -> str:
    """The imports inside one strongly connected component, one per line."""
    members = set(component)
    return "\n".join(f"  {lines.get((a, b), f'{a} -> {b}')}" for a in component for b in sorted(graph[a] & members))


def test_no_module_imports_itself_back_through_a_circle() -> None:
    graph = import_graph()
    assert "curate.store.dataset" in graph and "curate.runs.base" in graph  # the walk found the package
    simple = {m: set(t) for m, t in graph.items()}
    lines = {(m, t): f"{m}:{line} -> {t}" for m, ts in graph.items() for t, line in ts.items()}
    circles = strongly_connected(simple)
    assert not circles, "import circles in curate/:\n" + "\n".join(describe(c, simple, lines) for c in circles)


def test_packages_form_a_stack_of_floors() -> None:
    packages = package_graph(import_graph())
    simple = {p: set(t) for p, t in packages.items()}
    lines = {(a, b): "; ".join(e) for a, t in packages.items() for b, e in t.items()}
    circles = strongly_connected(simple)
    assert not circles, "packages that import each other back (move the shared code to the lower one):\n" + \
        "\n".join(describe(c, simple, lines) for c in circles)
    assert {"store", "runs", "models", "stages", "cli"} <= set(packages)


def design_floors() -> list[list[str]]:
    """The floors docs/design.md#architecture lists (``floor N: a, b, c`` lines), lowest first."""
    text = DESIGN.read_text(encoding="utf-8")
    section = text.split("\n## architecture", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^floor (\d+): (.+)$", section, flags=re.MULTILINE)
    assert rows, "docs/design.md#architecture lists no floors"
    assert [int(n) for n, _ in rows] == list(range(len(rows)))
    return [[name.strip().strip("`").rstrip("/") for name in names.split(",")] for _, names in rows]


def test_design_lists_every_package_on_a_floor_above_what_it_imports() -> None:
    packages = package_graph(import_graph())
    listed = design_floors()
    floor_of = {name: n for n, names in enumerate(listed) for name in names}
    assert set(floor_of) == set(packages), (f"missing from docs/design.md: {sorted(set(packages) - set(floor_of))}; "
                                            f"not packages: {sorted(set(floor_of) - set(packages))}")
    wrong = [e for a, targets in packages.items() for b, es in targets.items() if floor_of[b] >= floor_of[a] for e in es]
    assert not wrong, "imports that do not go down a floor of docs/design.md:\n" + "\n".join(wrong)
    assert max(floors(packages).values()) == len(listed) - 1


#: A module longer than this says at the top of its docstring why its one job needs the size.
LONG_MODULE = 700


def test_every_long_module_says_why_it_is_long() -> None:
    silent = []
    for module, (path, _) in module_files().items():
        text = path.read_text(encoding="utf-8")
        if text.count("\n") <= LONG_MODULE:
            continue
        doc = ast.get_docstring(ast.parse(text)) or ""
        if "Why it is long" not in "\n".join(doc.splitlines()[:4]):
            silent.append(f"{module} ({text.count(chr(10))} lines)")
    assert not silent, "modules over 700 lines that do not say why, in their docstring's first lines: " + \
        ", ".join(silent)


# ----------------------------------------------------------------------------- the run registry
def decorated_kinds() -> dict[str, str]:
    """``{KIND: module}`` of every class under curate/runs/ decorated ``@register_run_kind``."""
    out = {}
    for path in sorted((PACKAGE / "runs").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and any(getattr(d, "id", None) == "register_run_kind"
                                                      for d in node.decorator_list):
                kinds = [s.value.value for s in node.body if isinstance(s, ast.AnnAssign)
                         and getattr(s.target, "id", "") == "KIND" and isinstance(s.value, ast.Constant)]
                out[kinds[0]] = f"curate.runs.{path.stem}"
    return out


def fresh_python(code: str) -> str:
    """Run ``code`` in a new interpreter (nothing imported yet) and return its stdout."""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_registry_table_names_every_kind_and_imports_none() -> None:
    from curate.runs.registry import BUILTIN_KINDS

    assert BUILTIN_KINDS == decorated_kinds()
    registry_imports = set(import_graph()["curate.runs.registry"])
    assert not registry_imports & set(BUILTIN_KINDS.values())
    out = json.loads(fresh_python(
        "import json, sys\n"
        "from curate.runs.base import record_class, run_kinds\n"
        "from curate.runs.registry import BUILTIN_KINDS\n"
        "before = sorted(m for m in BUILTIN_KINDS.values() if m in sys.modules)\n"
        "classes = {k: [record_class(k).KIND, record_class(k).__module__] for k in BUILTIN_KINDS}\n"
        "print(json.dumps({'before': before, 'classes': classes, 'all': sorted(run_kinds())}))\n"))
    assert out["before"] == []
    assert out["classes"] == {k: [k, m] for k, m in BUILTIN_KINDS.items()}
    assert out["all"] == sorted(BUILTIN_KINDS)


def test_load_run_by_folder_imports_only_its_kind(tmp_path: Path) -> None:
    from curate.runs.base import RunError, record_class
    from curate.runs.masks import MaskRun, proposals_table

    run_dir = MaskRun(config={"model": {"model_id": "m"}, "settings": {"prompt": "a bird"}, "counts": {"found": 0}},
                      proposals_rows=proposals_table([])).write(tmp_path / "runs" / "masks-1")
    out = json.loads(fresh_python(
        "import json, sys\n"
        "from curate.runs import load_run\n"
        f"run = load_run({str(run_dir)!r})\n"
        "print(json.dumps({'type': type(run).__name__, 'prompt': run.prompt,\n"
        "                  'kinds': sorted(m for m in sys.modules if m.startswith('curate.runs.')\n"
        "                                  and m not in ('curate.runs.base', 'curate.runs.registry'))}))\n"))
    assert out == {"type": "MaskRun", "prompt": "a bird", "kinds": ["curate.runs.masks"]}
    with pytest.raises(RunError, match="unknown run kind 'nope'; known: (agreement, )?(annotator-spread, )?attribution, audit"):
        record_class("nope")
