"""The demo's second process (issue 42): ``curate.demo`` runs its fidelity step beside the rest of
the demo, each process on one torch thread; the caller gets the step's result or its error, and
its own thread count back."""
from __future__ import annotations

import math

import pytest
import torch

from curate.demo import run_beside


def test_the_step_beside_returns_its_result_and_the_callers_threads_come_back() -> None:
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with run_beside(math.factorial, 10) as job:
            assert torch.get_num_threads() == 1  # the caller's half of the cores meanwhile
            assert job.result(timeout=120) == 3628800
        assert torch.get_num_threads() == 2
        with pytest.raises(ValueError, match="negative"), run_beside(math.factorial, -1):
            pass  # the step's error comes out of the block even when nobody asked for its result
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_the_demo_worlds_alone_are_portable_and_reused_by_the_demo(tmp_path) -> None:
    """``build_demo_worlds`` (step 1 alone; the test suite copies its folders between workers,
    conftest's ``demo_dir``) builds the specs ``run_demo`` would, reuses them when called again, and
    writes no path of its folder into them, so a copy elsewhere is the same world."""
    import shutil

    from curate.collect.synthetic import world_spec_of
    from curate.demo import DemoSettings, build_demo_worlds, eval_world_spec, training_world_specs, world_folder
    from curate.store import Dataset

    settings = DemoSettings(num_classes=2, per_class_train=3, per_class_eval=2, image_size=16)
    folders = build_demo_worlds(tmp_path / "a", settings)
    specs = {"world-eval": eval_world_spec(settings)}
    specs.update({world_folder(label): spec for label, spec in training_world_specs(settings).items()})
    assert [f.name for f in folders] == ["world-eval", "world-p0.9", "world-uncorrelated"] == list(specs)
    for folder in folders:
        assert world_spec_of(Dataset.open(folder)) == specs[folder.name]
    assert specs["world-p0.9"].p == 0.9 and specs["world-uncorrelated"].p == pytest.approx(1 / len(specs["world-uncorrelated"].backgrounds))
    stamps = {f: (f / "samples.parquet").stat().st_mtime_ns for f in folders}
    assert build_demo_worlds(tmp_path / "a", settings) == folders  # reused, not regenerated
    assert {f: (f / "samples.parquet").stat().st_mtime_ns for f in folders} == stamps
    written = [p.read_bytes() for p in (tmp_path / "a").rglob("*") if p.is_file() and p.suffix != ".png"]
    assert written and not any(str(tmp_path).encode() in blob for blob in written)
    shutil.copytree(tmp_path / "a", tmp_path / "b")  # a copy elsewhere is reused as the same world
    assert build_demo_worlds(tmp_path / "b", settings) == [tmp_path / "b" / f.name for f in folders]
    with pytest.raises(FileExistsError, match="different dataset"):
        build_demo_worlds(tmp_path / "b", DemoSettings(num_classes=2, per_class_train=4, per_class_eval=2, image_size=16))
