"""The run lifecycle every stage shares (docs/design.md#run-folders): a finished run's name is
refused before any work unless overwrite, an unfinished one (no config.json: killed or interrupted)
is replaced, saying so, a run a live process writes is refused naming it, and a run that did
nothing does not hide the last real one. The stages' own CLI cases: tests/test_cli_evaluate.py,
tests/test_intervene.py (attribution), tests/test_discover_stage.py."""
from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from curate.runs.base import CONFIG_FILE, check_run_name, discard_if_empty, prepare_run_dir
from curate.runs.discovery import DiscoveryRun
from curate.runs.lock import RunLockedError, run_lock
from curate.stages.attribution import attribution
from curate.stages.audit import audit
from curate.stages.discover import discover
from curate.stages.evaluate import evaluate
from curate.stages.explain import explain
from curate.stages.fidelity import fidelity
from curate.stages.split import split
from curate.stages.vlm_explain import vlm_explain
from curate.stages.vlm_quality import vlm_quality
from curate.store import Dataset

STAGES = [attribution, audit, discover, evaluate, explain, fidelity, split, vlm_explain, vlm_quality]


@pytest.fixture(scope="module")
def empty(tmp_path_factory) -> Path:
    """A dataset folder without samples: no stage gets past its name check to find that out."""
    return Dataset.create(tmp_path_factory.mktemp("lifecycle") / "ds", name="lifecycle").root


def _finished(root: Path, name: str) -> Path:
    path = root / "runs" / name
    path.mkdir(parents=True, exist_ok=True)
    (path / CONFIG_FILE).write_text("{}")
    return path


def test_the_name_rule(tmp_path) -> None:
    """check_run_name writes nothing: a new name and an unfinished run pass, a finished run is
    refused unless overwrite, a name that is not a plain folder name is refused."""
    assert check_run_name(tmp_path, "new") == tmp_path / "runs" / "new" and not (tmp_path / "runs").exists()
    unfinished = tmp_path / "runs" / "killed"
    unfinished.mkdir(parents=True)
    (unfinished / "part.bin").write_bytes(b"x")
    assert check_run_name(tmp_path, "killed") == unfinished and (unfinished / "part.bin").is_file()
    finished = _finished(tmp_path, "done")
    with pytest.raises(FileExistsError, match="done exists; choose another --run-name or pass --overwrite"):
        check_run_name(tmp_path, "done")
    assert check_run_name(tmp_path, "done", overwrite=True) == finished
    for bad in ("a/b", "..", ""):
        with pytest.raises(ValueError, match="plain folder name"):
            check_run_name(tmp_path, bad)
    (tmp_path / "runs" / "file").write_text("")
    with pytest.raises(FileExistsError, match="not a run folder"):
        check_run_name(tmp_path, "file", overwrite=True)


def test_an_unfinished_run_is_emptied_and_replaced_saying_so(tmp_path, caplog) -> None:
    unfinished = tmp_path / "runs" / "killed"
    (unfinished / "maps").mkdir(parents=True)
    (unfinished / "maps" / "a.npz").write_bytes(b"x")
    (unfinished / "predictions.parquet").write_bytes(b"torn")
    with caplog.at_level(logging.WARNING, logger="curate.runs.base"):
        assert prepare_run_dir(tmp_path, "killed") == unfinished
    assert list(unfinished.iterdir()) == []
    assert "run killed" in caplog.text and "unfinished (no config.json" in caplog.text and "replacing it" in caplog.text
    finished = _finished(tmp_path, "done")
    (finished / "metrics.json").write_text("{}")
    prepare_run_dir(tmp_path, "done", overwrite=True)  # a finished run's files are replaced one by one when written
    assert sorted(p.name for p in finished.iterdir()) == [CONFIG_FILE, "metrics.json"]


def test_discard_if_empty_removes_only_a_run_that_holds_no_file(tmp_path) -> None:
    run = tmp_path / "runs" / "r"
    (run / "maps" / "deep").mkdir(parents=True)
    discard_if_empty(run)
    assert not run.exists()
    (run / "maps").mkdir(parents=True)
    (run / "maps" / "a.npz").write_bytes(b"x")
    discard_if_empty(run)
    assert (run / "maps" / "a.npz").is_file()
    finished = _finished(tmp_path, "done")
    discard_if_empty(finished)
    assert finished.is_dir()


@pytest.mark.parametrize("stage", STAGES, ids=lambda s: s.__name__)
def test_every_stage_checks_the_name_and_the_lock_before_any_work(empty, stage) -> None:
    """No model, no settings, no samples: the name is refused before any of them is looked at."""
    _finished(empty, "taken")
    with pytest.raises(FileExistsError, match="taken exists"):
        stage(empty, None, None, run_name="taken")
    with run_lock(empty, "live", purpose="test"):
        with pytest.raises(RunLockedError, match=f"being written by process {os.getpid()}"):
            stage(empty, None, None, run_name="live")
        with pytest.raises(RunLockedError):
            stage(empty, None, None, run_name="live", overwrite=True)
    assert not (empty / "runs" / "live").exists()


def test_discover_checks_the_name_before_loading_the_model(empty, monkeypatch) -> None:
    import curate.stages.discover as stage

    def loaded(*args, **kwargs):
        raise AssertionError("the model was loaded before the name was checked")

    monkeypatch.setattr(stage, "load_spec", loaded)
    _finished(empty, "disc")
    with pytest.raises(FileExistsError, match="disc exists"):
        discover(empty, "curate-tiny-vit", run_name="disc")


def test_a_discovery_that_grouped_no_photo_does_not_hide_the_last_real_one(tmp_path) -> None:
    """`curate groups DIR` / accept-group read the latest discovery that grouped photos; the
    latest of all when none did; a named run as asked."""
    def write(root: Path, name: str, grouped: int, when: int) -> None:
        config = {"settings": {"fdr": 0.1}, "counts": {"groups": 0, "grouped": grouped}, "classes": []}
        run = DiscoveryRun(config=config, groups=[], member_rows=[]).write(root / "runs" / name)
        os.utime(run, (when, when))

    write(tmp_path, "real", 40, 1_000_000)
    write(tmp_path, "nothing", 0, 1_000_010)  # every photo left out (no trusted mask)
    assert DiscoveryRun.of_folder(tmp_path).name == "real"
    assert DiscoveryRun.of_folder(tmp_path, "nothing").name == "nothing"
    write(tmp_path, "later", 12, 1_000_020)
    assert DiscoveryRun.of_folder(tmp_path).name == "later"
    write(tmp_path / "other", "empty-1", 0, 1_000_000)
    write(tmp_path / "other", "empty-2", 0, 1_000_010)
    assert DiscoveryRun.of_folder(tmp_path / "other").name == "empty-2"
