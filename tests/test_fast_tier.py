"""The fast tier's classification (tests/fast_tier.txt, read by tests/conftest.py): every test module
is classified, every test it names exists, none of them is marked slow, and ``--fast`` runs exactly
the tier."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import FAST_TIER, read_fast_tier

TESTS = Path(__file__).resolve().parent


def module_tests(path: Path) -> dict[str, bool]:
    """The module-level ``test_*`` functions of ``path`` -> whether each is marked slow (by decorator or the
    module's ``pytestmark``)."""
    tree = ast.parse(path.read_text())
    module_slow = any(isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "pytestmark" for t in node.targets)
                      and "mark.slow" in ast.unparse(node.value) for node in tree.body)
    return {node.name: module_slow or any("mark.slow" in ast.unparse(d) for d in node.decorator_list)
            for node in tree.body if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")}


def test_every_module_is_classified_and_every_named_test_exists_and_is_not_slow() -> None:
    tier = read_fast_tier()
    modules = sorted(p.name for p in TESTS.glob("test_*.py"))
    missing = [m for m in modules if m not in tier]
    assert not missing, f"classify these in {FAST_TIER.name} (': -' if none of their tests is fast): {missing}"
    assert not set(tier) - set(modules), f"{FAST_TIER.name} names modules that do not exist"
    for module, names in tier.items():
        functions = module_tests(TESTS / module)
        if "*" in names:
            assert names == {"*"} and not any(functions.values()), f"{module}: '*' with other names or slow tests"
            continue
        assert names <= set(functions), f"{module}: no such tests {sorted(names - set(functions))}"
        assert not any(functions[n] for n in names), f"{module}: slow tests named {[n for n in names if functions[n]]}"
    assert any(tier.values()), "the fast tier is empty"


def test_the_parser_refuses_a_line_it_cannot_read(tmp_path) -> None:
    bad = tmp_path / "tier.txt"
    bad.write_text("# fine\ntest_a.py: *\ntest_b.py test_c\n")
    with pytest.raises(pytest.UsageError, match="tier.txt:3: expected"):
        read_fast_tier(bad)
    bad.write_text("test_a.py: test_x  # a comment\ntest_a.py: test_y\ntest_b.py: -\n")
    assert read_fast_tier(bad) == {"test_a.py": {"test_x", "test_y"}, "test_b.py": set()}


def test_fast_runs_the_named_tests_only() -> None:
    """``pytest --fast`` on this module and test_labels.py collects exactly what the tier names of them."""
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "--fast",
                           str(TESTS / "test_fast_tier.py"), str(TESTS / "test_labels.py")],
                          capture_output=True, text=True, timeout=300, cwd=TESTS.parent)
    ids = [line for line in done.stdout.splitlines() if "::" in line]
    tier = read_fast_tier()
    for module in ("test_fast_tier.py", "test_labels.py"):
        names = tier[module]
        got = {i.split("::")[1].split("[")[0] for i in ids if i.startswith(f"tests/{module}::")}
        want = set(module_tests(TESTS / module)) if "*" in names else names
        assert got == want, (module, done.stdout[-2000:])
