"""The test run's settings from the environment (tests/conftest.py, issue 48): ``CURATE_TEST_BATCH_SIZE``
reaches every forward-pass batch default (stage settings, CLI options, library functions) and nothing
else; bad values are refused in one line."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import env_count

TESTS = Path(__file__).resolve().parent

_PROBE = """
import dataclasses, importlib, json
import conftest
changed = conftest.use_batch_size(7)
from curate.features import compute_features
from curate.stages.fidelity import FidelitySettings
from curate.train_reference import TrainConfig
settings = {name: importlib.import_module(module).__dict__[name]().batch_size for module, name in conftest.FORWARD_BATCH_SETTINGS}
cli = {c.name: p.default for c in conftest.cli_commands() for p in c.params if p.name == "batch_size"}
print("PROBE " + json.dumps({"settings": settings, "cli": cli, "features": compute_features.__kwdefaults__["batch_size"],
                             "fidelity": FidelitySettings().batch_size, "train": TrainConfig().batch_size, "changed": changed}))
"""


def test_env_count_reads_a_positive_integer_and_refuses_the_rest(monkeypatch) -> None:
    monkeypatch.delenv("CURATE_X", raising=False)
    assert env_count("CURATE_X") is None
    monkeypatch.setenv("CURATE_X", " 3 ")
    assert env_count("CURATE_X") == 3
    for bad in ("0", "-2", "three", "1.5"):
        monkeypatch.setenv("CURATE_X", bad)
        with pytest.raises(pytest.UsageError, match="CURATE_X must be a positive integer"):
            env_count("CURATE_X")


def test_the_batch_size_reaches_every_forward_pass_default_and_nothing_else() -> None:
    done = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=300, cwd=TESTS)
    line = next((x for x in done.stdout.splitlines() if x.startswith("PROBE ")), None)
    assert line, done.stdout + done.stderr
    probe = json.loads(line.removeprefix("PROBE "))
    assert set(probe["settings"].values()) == {7} and len(probe["settings"]) == 7
    assert probe["features"] == 7
    # the stages' --batch-size (forward passes) change; collect's rows per commit and training's batch do not
    assert {k: v for k, v in probe["cli"].items() if v == 7}.keys() == {"evaluate", "explain", "audit", "split",
                                                                         "label-backgrounds", "propose-masks"}
    assert probe["cli"]["fidelity"] == 32 and probe["cli"]["train-reference"] == 128 and probe["cli"]["hub"] == 256
    assert probe["fidelity"] == 32 and probe["train"] == 128  # a hyperparameter of the measure / the training
