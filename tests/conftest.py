"""Fixtures shared by several suites, and the test run's settings from the environment.

Settings (read once, when pytest starts; unset means the library's own defaults):

- ``CURATE_TEST_BATCH_SIZE=N``: the default image batch of every stage that runs a model forward
  pass (the ``batch_size`` default of evaluate, explain, audit, split, label-backgrounds,
  propose-masks and discover's settings, of their CLI ``--batch-size``, and of
  :func:`curate.features.compute_features`). Tests that pass a batch size keep theirs. Fidelity's
  batch is left alone: it is also the fine-tuning step's (a hyperparameter of the measure, not a
  throughput knob). CLI runs a test starts in a subprocess use the library's defaults.
- ``CURATE_TEST_TORCH_THREADS=N``: ``torch.set_num_threads(N)`` in the pytest process, before every
  test (the ``one_thread`` fixture's suites included).

A test that passes under one batch size or thread count and fails under another compares floats
that depend on them (issue 48: a batched forward pass rounds differently for other batches, other
thread counts and other CPUs' kernels): compare labels and scores within a stated tolerance, or
give both runs identical batches.

Parallel runs (``make test`` runs ``pytest -n 2 --dist loadfile``; ``-n 0`` runs serially, for
debugging): each pytest-xdist worker is a process with its own session fixtures. A worker takes
``CURATE_TEST_TORCH_THREADS`` = cores / workers (at least 1) unless the variable is set, and
``OMP_NUM_THREADS``/``MKL_NUM_THREADS`` likewise for the CLI runs it starts, so every worker computes
with the same thread count and two workers do not oversubscribe the cores. Under ``--dist loadfile``
the modules of one :data:`xdist_groups.SHARED_MODULE_GROUPS` group count as one file (one Label
Studio server, one Ray at a time): :func:`pytest_xdist_make_scheduler`.

The fast tier (``make test-fast``, ``pytest --fast``): the tests :data:`FAST_TIER` names, marked
``fast``; with ``--fast`` only they run, and modules without one are not even imported. Every test
module is classified there (``tests/test_fast_tier.py`` checks), so a new one is placed knowingly.
"""
from __future__ import annotations

import dataclasses
import importlib
import os
from pathlib import Path
from typing import Any

import pytest
import timeline
import torch
from service_fixtures import fo, ls, mongo  # noqa: F401 - shared fixtures, registered once
from xdist_groups import group_scheduler, worker_threads

#: Stage settings whose ``batch_size`` is an image batch of a model forward pass (module, class).
FORWARD_BATCH_SETTINGS = (
    ("curate.stages.evaluate", "EvalSettings"), ("curate.stages.explain", "ExplainSettings"),
    ("curate.stages.audit", "AuditSettings"), ("curate.stages.split", "SplitSettings"),
    ("curate.stages.label_backgrounds", "LabelBackgroundsSettings"),
    ("curate.stages.propose_masks", "ProposeMasksSettings"), ("curate.stages.discover", "DiscoverSettings"),
)
#: Library functions whose ``batch_size`` default is such a batch (module, function).
FORWARD_BATCH_FUNCTIONS = (
    ("curate.features", "compute_features"), ("curate.features", "encode_images"),
    ("curate.split.backgrounds", "predict_backgrounds"), ("curate.train_reference", "evaluate_shortcut"),
)
#: The CLI's forward-pass ``--batch-size`` options are the ones ``curate.cli.options.batch_options`` makes.
FORWARD_BATCH_HELP = "Images per batch"


def env_count(name: str) -> int | None:
    """The positive integer in environment variable ``name``; None when unset or empty."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    if not raw.isdigit() or int(raw) < 1:
        raise pytest.UsageError(f"{name} must be a positive integer, got {raw!r}")
    return int(raw)


def set_default(func: Any, name: str, value: Any) -> None:
    """Make ``value`` the default of parameter ``name`` of ``func`` (keyword-only or positional)."""
    if func.__kwdefaults__ and name in func.__kwdefaults__:
        func.__kwdefaults__ = {**func.__kwdefaults__, name: value}
        return
    code = func.__code__
    names = code.co_varnames[:code.co_argcount]
    defaults = list(func.__defaults__ or ())
    index = names.index(name) - (len(names) - len(defaults))
    if index < 0:
        raise TypeError(f"{func.__qualname__}: {name} has no default")
    defaults[index] = value
    func.__defaults__ = tuple(defaults)


def cli_commands() -> list[Any]:
    """Every command of ``curate`` (verbs and subcommands), each verb's module imported."""
    import click

    from curate.cli import COMMANDS, main

    found, todo = [], [(main, name) for name in sorted(COMMANDS)]
    while todo:
        group, name = todo.pop()
        command = group.get_command(click.Context(group), name)
        if isinstance(command, click.Group):
            todo.extend((command, sub) for sub in command.list_commands(click.Context(command)))
        elif command is not None:
            found.append(command)
    return found


def use_batch_size(size: int) -> list[str]:
    """Make ``size`` the forward-pass batch default everywhere :data:`FORWARD_BATCH_SETTINGS`,
    :data:`FORWARD_BATCH_FUNCTIONS` and the CLI's ``batch_options`` name; what was changed."""
    changed = []
    for module, name in FORWARD_BATCH_SETTINGS:
        cls = getattr(importlib.import_module(module), name)
        set_default(cls.__init__, "batch_size", size)
        cls.__dataclass_fields__["batch_size"].default = size
        cls.batch_size = size
        assert {f.name: f.default for f in dataclasses.fields(cls)}["batch_size"] == size
        changed.append(name)
    for module, name in FORWARD_BATCH_FUNCTIONS:
        set_default(getattr(importlib.import_module(module), name), "batch_size", size)
        changed.append(name)
    for command in cli_commands():
        for option in command.params:
            if option.name == "batch_size" and (getattr(option, "help", None) or "").startswith(FORWARD_BATCH_HELP):
                option.default = size
                changed.append(f"curate {command.name} --batch-size")
    return changed


#: The fast tier's classification of every test module (format: the file's header).
FAST_TIER = Path(__file__).with_name("fast_tier.txt")


def read_fast_tier(path: Path = FAST_TIER) -> dict[str, set[str]]:
    """Module file name -> the names of its fast tests (``{"*"}``: all of them; empty: none).

    Each line (``#`` starts a comment) is ``test_x.py: *``, ``test_x.py: -`` or ``test_x.py:``
    followed by test function names (every parametrization of each); a module may take several lines.
    """
    tier: dict[str, set[str]] = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        module, colon, names = line.partition(":")
        if not colon or not module.strip().endswith(".py") or not names.split():
            raise pytest.UsageError(f"{path.name}:{number}: expected 'test_x.py: *', 'test_x.py: -' or "
                                    f"'test_x.py: test_a test_b', got {line!r}")
        tier.setdefault(module.strip(), set()).update(n for n in names.split() if n != "-")
    return tier


def in_fast_tier(item: pytest.Item, tier: dict[str, set[str]]) -> bool:
    """Whether ``item`` is in the fast tier: named (or its module all of it) and not marked slow."""
    names = tier.get(item.path.name, set())
    name = getattr(item, "originalname", item.name)
    return ("*" in names or name in names) and item.get_closest_marker("slow") is None


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--fast", action="store_true",
                     help="only the fast tier (tests/fast_tier.txt); modules without a fast test are not imported")


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """With ``--fast``, skip importing test modules that hold no fast test (collection costs seconds)."""
    if config.getoption("fast") and collection_path.name.startswith("test_") and collection_path.suffix == ".py":
        return not read_fast_tier().get(collection_path.name)
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the fast tier ``fast``; with ``--fast``, deselect the rest."""
    tier = read_fast_tier()
    keep, drop = [], []
    for item in items:
        if in_fast_tier(item, tier):
            item.add_marker(pytest.mark.fast)
            keep.append(item)
        else:
            drop.append(item)
    if config.getoption("fast") and drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook: pytest without xdist does not know it
def pytest_configure_node(node: Any) -> None:
    """Hand each worker this process's ``COLUMNS`` (unset: None): a worker starts with ``COLUMNS=80`` (measured,
    xdist 3.8), which narrows the CLI's tables (curate.cli's console) and cut words tests look for."""
    node.workerinput["curate_columns"] = os.environ.get("COLUMNS")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadfile`` with :data:`xdist_groups.SHARED_MODULE_GROUPS` (the module doc); other modes: xdist's."""
    return group_scheduler(config, log) if config.getvalue("dist") == "loadfile" else None


def pytest_configure(config: pytest.Config) -> None:
    """Apply ``CURATE_TEST_BATCH_SIZE`` and ``CURATE_TEST_TORCH_THREADS`` (the module doc); register ``fast``
    here, not in pyproject.toml (the Makefile's install stamp hashes that file: an edit reinstalls)."""
    config.addinivalue_line("markers", "fast: the fast tier, `make test-fast` (pytest --fast): tests/fast_tier.txt")
    workers = env_count("PYTEST_XDIST_WORKER_COUNT")
    if workers is not None and os.environ.get("PYTEST_XDIST_WORKER"):  # a worker: the module doc's thread counts
        count = str(worker_threads(workers, os.cpu_count()))
        for name in ("CURATE_TEST_TORCH_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ.setdefault(name, count)
        columns = getattr(config, "workerinput", {}).get("curate_columns", os.environ.get("COLUMNS"))
        if columns is None:  # the terminal width as where pytest was started (pytest_configure_node)
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = columns
    if os.environ.get(timeline.ENV):  # record when each test ran, on which worker (tests/timeline.py)
        config.pluginmanager.register(timeline, "curate-timeline")
    threads = env_count("CURATE_TEST_TORCH_THREADS")
    if threads is not None:
        torch.set_num_threads(threads)
    size = env_count("CURATE_TEST_BATCH_SIZE")
    if size is not None:
        config.curate_batch_defaults = use_batch_size(size)  # type: ignore[attr-defined]


def pytest_report_header(config: pytest.Config) -> list[str]:
    """The run's settings, first thing in the output (a failure can then be reproduced)."""
    size = env_count("CURATE_TEST_BATCH_SIZE")
    return [f"curate: torch threads {torch.get_num_threads()}, forward-pass batch size "
            f"{size if size is not None else 'library defaults'}"]


@pytest.fixture(scope="session")
def demo_dir(tmp_path_factory) -> Path:
    """The demo's worlds and weights (``curate.demo.run_demo``), shared by the slow suites (explain,
    fidelity, attribution worlds, the demo's own test).

    In ``$CURATE_DEMO_WORKDIR`` if set, else a fresh folder per session (per xdist worker). The three
    tiny CLIPs (about 2 minutes of training) and the three worlds they train on (about 14 s of CPU)
    come from the model cache (tests/model_cache.py): made once per clone and recipe, the first worker
    to ask makes them while another waits and copies them; ``run_demo`` reuses both.
    """
    import shutil

    from model_cache import demo_models, demo_worlds

    from curate.demo import build_demo_worlds, run_demo

    workdir = Path(os.environ.get("CURATE_DEMO_WORKDIR") or tmp_path_factory.mktemp("demo"))
    worlds = demo_worlds(build_demo_worlds)
    for world in sorted(p for p in worlds.iterdir() if p.is_dir()):
        if not (workdir / world.name).exists():  # a reused $CURATE_DEMO_WORKDIR keeps its own (run_demo checks them)
            shutil.copytree(world, workdir / world.name, ignore=shutil.ignore_patterns(".tmp", ".curate.lock*"))

    def train(folder: Path) -> None:
        run_demo(workdir)
        for weights in (workdir / "models").glob("*.pt"):
            shutil.copy2(weights, folder / weights.name)

    cached = demo_models(train)
    (workdir / "models").mkdir(parents=True, exist_ok=True)
    for weights in cached.glob("*.pt"):
        shutil.copy2(weights, workdir / "models" / weights.name)
    rows = run_demo(workdir)
    assert not any(row.trained for row in rows), f"{cached} holds weights run_demo does not reuse; delete it"
    return workdir


@pytest.fixture(autouse=True)
def run_torch_threads():
    """``CURATE_TEST_TORCH_THREADS``, applied again before every test where set: a library call that sets
    its own count and keeps it (``curate.train_reference.train_reference`` sets its config's ``threads``)
    must not carry into the tests after it."""
    threads = env_count("CURATE_TEST_TORCH_THREADS")
    if threads is not None:
        torch.set_num_threads(threads)
    yield


@pytest.fixture()
def one_thread():
    """Torch on one thread for the test (small models run faster so on 2 shared cores); restored after.
    ``CURATE_TEST_TORCH_THREADS`` wins where set, so a run can check these suites on another count."""
    previous = torch.get_num_threads()
    torch.set_num_threads(env_count("CURATE_TEST_TORCH_THREADS") or 1)
    yield
    torch.set_num_threads(previous)
