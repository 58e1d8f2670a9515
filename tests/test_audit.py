"""curate audit: the planted-problem world, each check's formula, the stage, the record, measure, bad input."""
from __future__ import annotations

import json
import shutil
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from curate.audit.base import parse_checks
from curate.audit.combine import ranks, retag, top_candidates
from curate.audit.duplicates import groups_of, nearest_cosine, nearest_hamming
from curate.audit.feature import flat_share, noise_sigma
from curate.audit.measure import precision_recall_at
from curate.audit.obscurity import obscurity_scores
from curate.collect.synthetic import DEFAULT_CLASSES, WorldSpec, collect_synthetic, generate_world
from curate.runs import AuditRun, load_run, run_kinds
from curate.stages.audit import AuditSettings, audit, measure_audit
from curate.store import Dataset, NewSample, check_dataset

RATES = dict(wrong_label_rate=0.06, duplicate_rate=0.06, near_duplicate_rate=0.06, feature_noise_rate=0.06,
             second_object_rate=0.06, small_object_rate=0.06)
SPEC = WorldSpec(classes=DEFAULT_CLASSES[:3], per_class=40, image_size=32, p=1 / 3, seed=11, **RATES)


@pytest.fixture(scope="module")
def tiny_clip():
    from curate.models import load_model

    return load_model("curate-tiny-vit", None, device="cpu", seed=0)


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("audit") / "world"
    collect_synthetic(root, SPEC)
    return root


@pytest.fixture(scope="module")
def audited(world, tiny_clip) -> tuple[Path, AuditRun]:
    run = audit(world, tiny_clip, AuditSettings(device="cpu", tag_fraction=0.1), run_name="a1")
    return world, run


# ------------------------------------------------------------------ the synthetic world
def test_planted_problems_come_at_their_rates_and_a_clean_world_is_unchanged() -> None:
    big = replace(SPEC, per_class=300, image_size=16)
    kinds = Counter(s.extra.get("planted") for s in generate_world(big))
    for kind in ("wrong_label", "exact_duplicate", "near_duplicate", "feature_noise", "second_object", "small_object"):
        assert abs(kinds[kind] / 900 - 0.06) < 0.025, (kind, kinds)
    clean = replace(SPEC, **{k: 0.0 for k in RATES})
    assert not any(k.endswith("_rate") for k in clean.to_dict())  # old worlds keep their record (and demo keys)
    assert all("planted" not in s.extra for s in generate_world(clean))
    # the clean part of a sample is what the world without problems draws
    planted = list(generate_world(SPEC))
    same = [np.array_equal(a.image, b.image) for a, b in zip(planted, generate_world(clean)) if "planted" not in a.extra]
    assert all(same) and len(same) > 60
    with pytest.raises(ValueError, match="add up to"):
        WorldSpec(wrong_label_rate=0.6, feature_noise_rate=0.6)


def test_the_truth_is_in_extra_and_round_trips_through_the_folder(world) -> None:
    ds = Dataset.open(world)
    extras = [json.loads(r["extra"]) for r in ds.rows()]
    assert {e.get("planted") for e in extras} >= {"wrong_label", "exact_duplicate", "small_object"}
    wrong = [e for e in extras if e.get("planted") == "wrong_label"]
    assert all(e["true_class"] != r["class_index"] for e, r in zip(extras, ds.rows()) if e.get("planted") == "wrong_label")
    assert wrong and from_spec(ds) == SPEC and not [p for p in check_dataset(world) if p.severity == "error"]


def from_spec(ds):
    from curate.collect.synthetic import world_spec_of

    return world_spec_of(ds)


# ------------------------------------------------------------------ formulas, by hand
def test_blockwise_nearest_neighbour_equals_brute_force_and_pairs_are_complete() -> None:
    rng = np.random.default_rng(0)
    e = rng.normal(size=(301, 16)).astype(np.float32)
    e[7] = e[100] + 1e-4
    e /= np.linalg.norm(e, axis=1, keepdims=True)
    sim, arg, pairs = nearest_cosine(e, block=37, threshold=0.999)
    full = e @ e.T
    np.fill_diagonal(full, -np.inf)
    assert np.allclose(sim, full.max(axis=1), atol=1e-6) and np.array_equal(arg, full.argmax(axis=1))
    assert [(a, b) for a, b, _ in pairs] == [(7, 100)]
    h = rng.integers(0, 2**63, size=50, dtype=np.int64).astype(np.uint64)
    h[3] = h[40] ^ np.uint64(0b101)
    dist, harg, hpairs = nearest_hamming(h, block=7, threshold=2)
    assert dist[3] == 2 and harg[3] == 40 and [(a, b) for a, b, _ in hpairs] == [(3, 40)]
    assert groups_of(6, [(0, 4), (4, 5), (1, 2)]) == [[0, 4, 5], [1, 2]]


def test_feature_components_and_obscurity_by_hand() -> None:
    rng = np.random.default_rng(1)
    photo = rng.integers(0, 255, size=(32, 32, 3), dtype=np.uint8)
    truncated = photo.copy()
    truncated[20:] = 128
    assert flat_share(photo) == 0.0 and flat_share(truncated) == pytest.approx(12 / 32)
    smooth = np.tile(np.linspace(0, 200, 32)[None, :, None], (32, 1, 3)).astype(np.uint8)
    noisy = np.clip(smooth + rng.normal(0, 20, smooth.shape), 0, 255).astype(np.uint8)
    assert noise_sigma(smooth) < 2 < 10 < noise_sigma(noisy)
    probs = np.array([[0.5, 0.45, 0.05], [0.02, 0.97, 0.01], [0.98, 0.01, 0.01]])
    assert np.allclose(obscurity_scores(probs, np.array([0, 0, 0])), [0.45, 0.02, 0.01])


def test_ranks_tags_and_precision_at_k() -> None:
    scores = np.array([0.1, np.nan, 0.9, 0.5, 0.9])
    assert ranks(scores).tolist() == [4, -1, 1, 3, 2]
    assert top_candidates(scores, 0.5).tolist() == [2, 4]
    assert top_candidates(scores, 0.5, eligible=np.array([1, 1, 0, 1, 1], bool)).tolist() == [4, 3]
    assert retag({"a": ["x", "suspect:label"], "b": []}, {"b": {"label"}}, ["label"]) == {"a": ["x"], "b": ["suspect:label"]}
    p, r = precision_recall_at(np.arange(10.0), np.array([0] * 8 + [1, 0], bool), (0.1, 0.2, 0.5))
    assert p == {0.1: 0.0, 0.2: 0.5, 0.5: 0.2} and r == {0.1: 0.0, 0.2: 1.0, 0.5: 1.0}
    assert parse_checks("clarity,label") == ("label", "clarity")
    with pytest.raises(ValueError, match="unknown audit check"):
        parse_checks("label,typo")


# ------------------------------------------------------------------ the stage
def test_audit_writes_a_typed_run_and_tags_without_touching_status(audited) -> None:
    world, run = audited
    assert "audit" in run_kinds()
    loaded = load_run(run.run_dir)
    assert isinstance(loaded, AuditRun) and loaded.checks == list(parse_checks("all"))
    ds = Dataset.open(world)
    n = len(ds)
    assert loaded.sample_ids and len(loaded.sample_ids) == n
    for check in loaded.checks:
        assert np.isfinite(loaded.scores(check)).all(), check
        assert len(loaded.tagged(check)) == int(np.ceil(0.1 * n))
        tagged = {r["sample_id"] for r in ds.rows() if f"suspect:{check}" in r["tags"]}
        assert tagged == loaded.tagged(check)
    assert {r["status"] for r in ds.rows()} == {"accepted"}  # a tag is never a decision
    assert loaded.summary("clarity").detail["sources"]["mask"] == n
    assert any(g["sample_ids"] for g in loaded.duplicate_groups)


def test_pixel_checks_find_their_planted_problems_even_with_a_random_clip(audited) -> None:
    """Duplicates (phash), feature noise and clarity (masks) do not depend on the CLIP's quality."""
    world, _ = audited
    measures = {m.check: m for m in measure_audit(world, "a1", truth="planted")}
    for check in ("duplicates", "feature", "clarity"):
        m = measures[check]
        assert m.positives > 0 and m.precision[0.1] > 2 * m.base_rate, (check, m.precision, m.base_rate)
    assert measures["clarity"].recall[0.2] > 0.8


def test_measure_against_reviewers_decisions(audited, tmp_path) -> None:
    world, run = audited
    copy = tmp_path / "reviewed"
    shutil.copytree(world, copy)
    ds = Dataset.open(copy)
    clarity = run.scores("clarity")
    top = [run.sample_ids[i] for i in np.argsort(-clarity)[:4]]
    ds.update(top, {"status": "rejected", "reject_reason": "clarity"}, actor="test")
    measures = {m.check: m for m in measure_audit(copy, "a1")}
    assert measures["clarity"].positives == 4 and measures["clarity"].recall[0.05] == 1.0
    assert measures["outliers"].truth == "any reject" and "duplicates" not in measures


def test_a_rerun_reuses_the_feature_cache_and_replaces_its_tags(world, tiny_clip, tmp_path) -> None:
    assert tiny_clip.cache_safe  # seeded random weights are cached like real ones
    copy = tmp_path / "w"
    shutil.copytree(world, copy)
    shutil.rmtree(copy / "features", ignore_errors=True)
    first = audit(copy, tiny_clip, AuditSettings(checks=("label",), device="cpu"), run_name="one")
    second = audit(copy, tiny_clip, AuditSettings(checks=("label",), device="cpu", tag_fraction=0.02), run_name="two")
    assert first.dataset["images_encoded"] == len(Dataset.open(copy)) and second.dataset["images_encoded"] == 0
    tagged = {r["sample_id"] for r in Dataset.open(copy).rows() if "suspect:label" in r["tags"]}
    assert tagged == second.tagged("label") and len(tagged) < len(first.tagged("label"))


# ------------------------------------------------------------------ bad input
def _folder(root: Path, n: int = 6, *, masks: bool = False) -> Dataset:
    samples = list(generate_world(WorldSpec(classes=DEFAULT_CLASSES[:2], per_class=n // 2, image_size=32, seed=3)))
    from curate.collect.synthetic import png_bytes

    ds = Dataset.create(root, name="bad", backgrounds=["snow", "water"])
    ds.add_samples([NewSample(image=png_bytes(s.image), class_index=s.cls.imagenet_index, source="folder",
                              source_id=str(s.index), license="CC0-1.0", mask=s.mask if masks else None)
                    for s in samples], actor="test")
    return Dataset.open(root)


def test_no_masks_one_sample_classes_and_undecodable_images(tmp_path, tiny_clip) -> None:
    ds = _folder(tmp_path / "d", 6)
    first = ds.rows()[0]
    ds.update([first["sample_id"]], {"class_index": 1}, actor="test")  # a class with one sample
    broken = ds.rows()[1]
    ds.image_path(broken).write_bytes(b"not an image any more")
    run = audit(ds, tiny_clip, AuditSettings(device="cpu"), run_name="bad")
    clarity = run.summary("clarity")
    assert clarity.detail["sources"]["saliency proxy"] == 5 and any("PROXY" in n for n in clarity.notes)
    assert run.excluded["count"] == 1 and run.summary("feature").failed == 1
    assert np.isnan(run.scores("label")[run.sample_ids.index(broken["sample_id"])])
    assert np.isfinite(run.scores("label")[run.sample_ids.index(first["sample_id"])])
    assert not [p for p in check_dataset(ds.root) if p.severity == "error"]


def test_a_label_space_without_the_class_is_a_clear_error(tmp_path, tiny_clip) -> None:
    ds = _folder(tmp_path / "d", 4)
    space = tmp_path / "labels.txt"
    space.write_text("polar bear\n")
    with pytest.raises(ValueError, match="does not contain the class name.*black swan"):
        audit(ds, tiny_clip, AuditSettings(device="cpu", label_space=str(space)))
    with pytest.raises(ValueError, match="pass --model"):
        audit(ds, None, AuditSettings(device="cpu", checks=("label",)))
    assert not (ds.root / "runs").exists() or not list((ds.root / "runs").iterdir())


def test_cli_audit_and_measure(world, tmp_path) -> None:
    from click.testing import CliRunner

    from curate.cli import main

    copy = tmp_path / "c"
    shutil.copytree(world, copy)
    runner = CliRunner(env={"COLUMNS": "250"})
    result = runner.invoke(main, ["audit", str(copy), "--checks", "feature", "--run-name", "px", "--tag-fraction", "0.1"])
    assert result.exit_code == 0, result.output
    assert "tagged suspect:<check>" in result.output and "flat-block" in result.output
    info = runner.invoke(main, ["info", str(copy)])
    assert info.exit_code == 0 and "suspect:feature" in info.output and "not decisions" in info.output
    result = runner.invoke(main, ["audit", str(copy), "--measure", "--truth", "planted"])
    assert result.exit_code == 0, result.output
    assert "random = base rate" in result.output and "planted feature_noise" in result.output
    result = runner.invoke(main, ["audit", str(copy), "--measure"])  # synthetic rows are accepted, none rejected
    assert result.exit_code == 0 and "no positives" in result.output


@pytest.mark.slow
def test_label_clarity_and_feature_checks_beat_random_with_the_trained_reference_clip(demo_dir, tmp_path) -> None:
    """The demo's uncorrelated reference CLIP (it learned the shapes) on a world with 5% of each problem."""
    from curate.demo import audit_world_spec

    root = tmp_path / "planted"
    collect_synthetic(root, audit_world_spec(per_class=50))
    weights = demo_dir / "models" / "reference-uncorrelated.pt"
    audit(root, weights, AuditSettings(device="cpu"), run_name="ref")
    measures = {m.check: m for m in measure_audit(root, "ref", truth="planted")}
    for check in ("label", "duplicates", "feature", "clarity"):
        assert measures[check].precision[0.05] > 3 * measures[check].base_rate, (check, measures[check])
