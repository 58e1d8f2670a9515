"""Fixtures shared by several suites, and the test run's settings from the environment.

Settings (read once, when pytest starts; unset means the library's own defaults):

- ``CURATE_TEST_BATCH_SIZE=N``: the default image batch of every stage that runs a model forward
  pass (the ``batch_size`` default of evaluate, explain, audit, split, label-backgrounds,
  propose-masks and discover's settings, of their CLI ``--batch-size``, and of
  :func:`curate.features.compute_features`). Tests that pass a batch size keep theirs. Fidelity's
  batch is left alone: it is also the fine-tuning step's (a hyperparameter of the measure, not a
  throughput knob). CLI runs a test starts in a subprocess use the library's defaults.
- ``CURATE_TEST_TORCH_THREADS=N``: ``torch.set_num_threads(N)`` for the pytest process.

A test that passes under one batch size or thread count and fails under another compares floats
that depend on them (issue 48: a batched forward pass rounds differently for other batches, other
thread counts and other CPUs' kernels): compare labels and scores within a stated tolerance, or
give both runs identical batches.
"""
from __future__ import annotations

import dataclasses
import importlib
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from service_fixtures import fo, ls, mongo  # noqa: F401 - shared fixtures, registered once

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


def pytest_configure(config: pytest.Config) -> None:
    """Apply ``CURATE_TEST_BATCH_SIZE`` and ``CURATE_TEST_TORCH_THREADS`` (the module doc)."""
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
    """The demo's worlds and weights (``curate.demo.run_demo``: two reference CLIPs, about 2 minutes).

    ``$CURATE_DEMO_WORKDIR`` if set (reused when current), else trained once per session and
    shared by the slow suites (explain, fidelity).
    """
    from curate.demo import run_demo

    workdir = Path(os.environ.get("CURATE_DEMO_WORKDIR") or tmp_path_factory.mktemp("demo"))
    run_demo(workdir)
    return workdir


@pytest.fixture()
def one_thread():
    """Torch on one thread for the test (small models run faster so on 2 shared cores); restored after."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
