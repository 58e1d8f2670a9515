"""The paper's LVLM question on our data (papers/003 §3.3): does a tiny LLaVA fine-tuned on a world
with a planted background (p = 0.9) drop more from easy to hard than one fine-tuned without it?"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from curate.collect.synthetic import DEFAULT_CLASSES, WorldSpec, assign_truth_groups, collect_synthetic
from curate.lvlm.tiny import build_tiny_llava
from curate.lvlm.train import LlavaTrainConfig, finetune_on_world
from curate.models.spec import ModelSpec
from curate.stages.evaluate import EvalSettings, evaluate
from curate.store import Dataset

pytestmark = pytest.mark.slow
CLASSES = DEFAULT_CLASSES[:4]
CONFIG = LlavaTrainConfig(steps=100, batch_size=16, lr=3e-3, threads=1)


def test_a_planted_background_gives_a_larger_easy_hard_drop(tmp_path: Path) -> None:
    base = build_tiny_llava(tmp_path / "base", seed=0)
    spec = WorldSpec(classes=CLASSES, per_class=40, image_size=32, seed=0)
    eval_root = tmp_path / "eval"
    collect_synthetic(eval_root, replace(spec, p=spec.uncorrelated_p, per_class=15, seed=1000))
    assign_truth_groups(Dataset.open(eval_root))
    labels = tmp_path / "labels.txt"
    labels.write_text("".join(f"{c.imagenet_index}\n" for c in CLASSES))
    drops = {}
    for name, world in (("p0.9", replace(spec, p=0.9)), ("uncorrelated", replace(spec, p=spec.uncorrelated_p, seed=1))):
        root = tmp_path / f"world-{name}"
        collect_synthetic(root, world)
        result, reused = finetune_on_world(base, Dataset.open(root), tmp_path / f"llava-{name}", CONFIG)
        assert not reused and result.losses[-1] < 0.5 * result.losses[0]
        run = evaluate(eval_root, ModelSpec(f"lvlm:{result.path}"), EvalSettings(label_space=str(labels),
                                                                                  bootstrap=200), run_name=name)
        drops[name] = run.drop
        print(f"{name}: easy {run.group('easy').acc1:.3f} hard {run.group('hard').acc1:.3f} "
              f"drop {run.drop.acc1:.3f} {run.drop.acc1_ci} (1 vs {len(CLASSES)}, chance {1 / len(CLASSES):.2f})")
    assert drops["p0.9"].acc1 > drops["uncorrelated"].acc1 + 0.2
    assert drops["p0.9"].acc1_ci[0] > drops["uncorrelated"].acc1_ci[1]  # the intervals do not overlap
    again, reused = finetune_on_world(base, Dataset.open(tmp_path / "world-p0.9"), tmp_path / "llava-p0.9", CONFIG)
    assert reused and again.path == tmp_path / "llava-p0.9"
