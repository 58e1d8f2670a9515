"""The test suites' on-disk cache of trained tiny models (tests/model_cache.py, issue 42): one
training per recipe, a new one when the recipe or the trainer's code changes, one training when
two processes ask at once, and no entry left by a failed training."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from model_cache import cached, recipe_key


def counting_build(log: Path, text: str = "weights"):
    """A stand-in training: appends a line to ``log`` per call and writes ``model.pt``."""
    def build(folder: Path) -> None:
        with log.open("a") as handle:
            handle.write("trained\n")
        (folder / "model.pt").write_text(text)
    return build


def trainings(log: Path) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


def test_the_same_recipe_trains_once(tmp_path: Path) -> None:
    log, recipe = tmp_path / "log", {"steps": 3, "seed": 0, "world": {"p": 0.9}}
    first = cached("tiny", recipe, counting_build(log), root=tmp_path / "cache")
    second = cached("tiny", dict(reversed(recipe.items())), counting_build(log), root=tmp_path / "cache")
    assert first == second and (second / "model.pt").read_text() == "weights"
    assert trainings(log) == 1
    assert '"steps": 3' in (first / "recipe.json").read_text()


def test_a_changed_recipe_or_trainer_code_trains_again(tmp_path: Path) -> None:
    log, root = tmp_path / "log", tmp_path / "cache"
    trainer = tmp_path / "trainer.py"
    trainer.write_text("LR = 1e-3\n")
    base = cached("tiny", {"seed": 0}, counting_build(log), code=[trainer], root=root)
    other_seed = cached("tiny", {"seed": 1}, counting_build(log), code=[trainer], root=root)
    trainer.write_text("LR = 3e-3\n")
    other_code = cached("tiny", {"seed": 0}, counting_build(log), code=[trainer], root=root)
    assert len({base, other_seed, other_code}) == 3 and trainings(log) == 3
    assert recipe_key({"seed": 0}, [counting_build]) != recipe_key({"seed": 0}, [trainings])  # a function's source


def test_a_failed_training_leaves_no_entry(tmp_path: Path) -> None:
    def broken(folder: Path) -> None:
        (folder / "half.pt").write_text("torn")
        raise RuntimeError("out of memory")

    with pytest.raises(RuntimeError, match="out of memory"):
        cached("tiny", {"seed": 0}, broken, root=tmp_path / "cache")
    assert [p.name for p in (tmp_path / "cache").iterdir() if not p.name.endswith(".lock")] == []
    entry = cached("tiny", {"seed": 0}, counting_build(tmp_path / "log"), root=tmp_path / "cache")
    assert (entry / "model.pt").is_file() and not (entry / "half.pt").exists()


WORKER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    sys.path.insert(0, {tests!r})
    from model_cache import cached

    log, ready = Path({log!r}), Path({log!r} + ".ready")
    with ready.open("a") as handle:  # a barrier: both processes ask only once both have started
        handle.write("up\\n")
    while len(ready.read_text().splitlines()) < 2:
        time.sleep(0.01)
    def build(folder):
        with log.open("a") as handle:
            handle.write("trained\\n")
        time.sleep(0.4)  # long enough for the other process to ask meanwhile
        (folder / "model.pt").write_text("weights")
    print(cached("tiny", {{"seed": 0}}, build, root=Path({root!r})))
""")


def test_two_processes_asking_at_once_train_once(tmp_path: Path) -> None:
    """Two pytest-xdist workers requesting the same model: the second waits for the first's and reuses it."""
    script = WORKER.format(tests=str(Path(__file__).parent), log=str(tmp_path / "log"), root=str(tmp_path / "cache"))
    workers = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True) for _ in range(2)]
    paths = [worker.communicate(timeout=60)[0].strip() for worker in workers]
    assert [worker.returncode for worker in workers] == [0, 0]
    assert paths[0] == paths[1] and (Path(paths[0]) / "model.pt").read_text() == "weights"
    assert trainings(tmp_path / "log") == 1
