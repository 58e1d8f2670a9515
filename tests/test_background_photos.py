"""Issue 45: photos of a background alone, the donors of the fill control that needs no fill.

``curate intervene DS --out OUT --background-photos BG`` pastes each hard photo's object, beside each of its
swaps, on a photo of the swap donor's easy background with no object in it (``swap-bgonly``: no hole, nothing
filled). BG is a dataset folder of photos with no class and a background label
(:mod:`curate.interventions.background_photos`); the synthetic generator writes one
(:func:`curate.collect.synthetic.collect_synthetic_backgrounds`, ``collect synthetic --backgrounds-only N``).
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from click.testing import CliRunner
from PIL import Image

from curate.cli import main
from curate.collect.synthetic import (
    BACKGROUND_ALONE_STREAM,
    BACKGROUNDS,
    DEFAULT_CLASSES,
    WorldSpec,
    assign_truth_groups,
    collect_synthetic,
    collect_synthetic_backgrounds,
    generate_sample,
    render_background_alone,
    vignette_light,
)
from curate.collect.world_draw import background_texture
from curate.interventions import image_ops as ops
from curate.runs.attribution import AttributionRun
from curate.runs.evaluation import EvaluationRun
from curate.runs.interventions import InterventionRun
from curate.stages.intervene import InterveneSettings, finish_command, intervene
from curate.store import Dataset, NewSample

SPEC = WorldSpec(classes=DEFAULT_CLASSES[:3], per_class=8, p=0.5, seed=1, image_size=32, outline="double",
                 vignette=0.5)


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> Path:
    """A small world with its truth groups and two photos of each of its backgrounds alone."""
    root = tmp_path_factory.mktemp("bgonly")
    assign_truth_groups(collect_synthetic(root / "world", SPEC))
    collect_synthetic_backgrounds(root / "alone", SPEC, 2)
    return root


def _alone(root: Path, photos: list[tuple[str, str, int | None]], size: int = 32) -> Path:
    """A background-alone folder by hand: (background, licence, class index) per photo, each a flat colour."""
    ds = Dataset.create(root, name=root.name, backgrounds=list(BACKGROUNDS), recipe="background-photos")
    ds.add_samples([NewSample(image=ops.png_bytes(np.full((size, size, 3), 40 + 20 * i, np.uint8)), class_index=cls,
                              source="folder", source_id=f"bg{i}", license=licence, attribution="someone",
                              status="accepted", background=background, background_source="human")
                    for i, (background, licence, cls) in enumerate(photos)], actor="test")
    return root


def test_background_alone_photos_are_the_worlds_textures_with_its_vignette_and_change_nothing_of_it(made) -> None:
    """A background-alone photo is a texture of its kind from its own stream, lit like the world; writing them
    changes no sample of the world (the world's images before and after are the same bytes)."""
    image = render_background_alone(SPEC, "water", 3)
    rng = np.random.default_rng([SPEC.seed, BACKGROUND_ALONE_STREAM, BACKGROUNDS.index("water"), 3])
    expected = np.clip(background_texture(32, rng, "water") * vignette_light(32, 0.5)[..., None], 0, 255)
    assert np.array_equal(image, expected.astype(np.uint8))
    assert not np.array_equal(image, render_background_alone(SPEC, "water", 4))
    alone = Dataset.open(made / "alone")
    rows = alone.rows()
    assert len(rows) == 6 and {r["background"] for r in rows} == set(SPEC.backgrounds)
    assert all(r["class_index"] is None and r["mask_path"] is None and r["license"] for r in rows)
    world = Dataset.open(made / "world")  # its samples' bytes are what the generator alone draws
    assert sorted(r["sha256"] for r in world.rows()) == sorted(
        hashlib.sha256(ops.png_bytes(generate_sample(SPEC, i).image)).hexdigest() for i in range(24))


def test_swap_bgonly_pastes_each_hard_object_on_a_photo_of_its_donors_background_alone(made, tmp_path) -> None:
    settings = InterveneSettings(variants="swap", swaps=2, background_photos=str(made / "alone"))
    record = intervene(made / "world", tmp_path / "out", settings)
    rows = record.rows()
    world, alone, out = Dataset.open(made / "world"), Dataset.open(made / "alone"), Dataset.open(tmp_path / "out")
    sources = {r["sample_id"]: r for r in world.rows()}
    photos = {r["sample_id"]: r for r in alone.rows()}
    images = {r["sample_id"]: r for r in out.rows()}
    swaps = {(r["source_sample_id"], r["k"]): r for r in rows if r["variant"] == "swap" and r["group"] == "hard"}
    bgonly = [r for r in rows if r["variant"] == "swap-bgonly"]
    assert bgonly and len(bgonly) == len(swaps) and all(r["group"] == "hard" for r in bgonly)
    for row in bgonly:
        swap, photo = swaps[row["source_sample_id"], row["k"]], photos[row["donor_sample_id"]]
        assert photo["background"] == sources[swap["donor_sample_id"]]["background"] == row["background"]
        assert row["filled_fraction"] == 0.0 and row["fill"] is None and row["license"] == "cc0"
        source = sources[row["source_sample_id"]]
        mask = world.load_mask(source)
        expected = ops.paste(np.asarray(Image.open(world.image_path(source)).convert("RGB")), mask,
                             np.asarray(Image.open(alone.image_path(photo)).convert("RGB")))
        image = images[row["sample_id"]]
        assert np.array_equal(np.asarray(Image.open(out.image_path(image)).convert("RGB")), expected)
        assert '"background_photos": "alone"' in image["extra"] and photo["sample_id"] in image["extra"]
    firsts = {r["source_sample_id"]: r["donor_sample_id"] for r in bgonly if r["k"] == 0}
    seconds = {r["source_sample_id"]: r["donor_sample_id"] for r in bgonly if r["k"] == 1}
    assert all(firsts[p] != seconds[p] for p in seconds)  # two photos of the background, two swaps
    assert record.config["background_photos"]["usable"] == 6 and record.counts["variants"]["swap-bgonly"] == len(bgonly)
    again = intervene(made / "world", tmp_path / "again", settings)  # deterministic for the seed
    assert sorted(r["sample_id"] for r in again.rows()) == sorted(r["sample_id"] for r in rows)
    assert f"--background-photos {made / 'alone'}" in finish_command(made / "world", tmp_path / "out", settings)


def test_bad_background_photos_are_refused_in_one_line_and_nothing_is_written(made, tmp_path) -> None:
    def refused(folder: Path, match: str, **more: object) -> None:
        with pytest.raises(ValueError, match=match) as error:
            intervene(made / "world", tmp_path / "out", InterveneSettings(
                variants=more.pop("variants", "swap"), background_photos=str(folder), **more))  # type: ignore[arg-type]
        assert "\n" not in str(error.value) and not (tmp_path / "out").exists()

    every = [(b, "cc0", None) for b in SPEC.backgrounds]
    refused(tmp_path / "missing", "not a dataset folder")
    refused(made / "alone", "ask for the swap variant", variants="only-fg")
    refused(_alone(tmp_path / "classed", [*every, ("sky", "cc0", 23)]), "has a class .*shows no object")
    refused(_alone(tmp_path / "road", [*every, ("road", "cc0", None)]), "shows background 'road', which is not one")
    refused(_alone(tmp_path / "few", [("snow", "cc0", None)]), r"no usable photo of the easy background\(s\) \['sky'")
    restricted = _alone(tmp_path / "nd", [("snow", "cc0", None), ("water", "cc0", None), ("sky", "cc-by-nd", None)])
    refused(restricted, r"\['sky'\] the swaps need \(\{'license_restricted': 1\} left out\)")
    assert intervene(made / "world", tmp_path / "nd-out", InterveneSettings(
        variants="swap", background_photos=str(restricted), allow_restricted_licenses=True)).counts["variants"][
        "swap-bgonly"] > 0  # allowed when asked, as for the source photos
    for name, damage, match in (("corrupt", b"not a png", "does not decode"), ("resized", None, "is 20 x 20 px")):
        folder = _alone(tmp_path / name, every)
        ds = Dataset.open(folder)
        path = Path(ds.image_path(ds.rows()[0]))
        path.chmod(0o644)
        if damage is None:
            Image.new("RGB", (20, 20)).save(path, format="PNG")
        else:
            path.write_bytes(damage)
        refused(folder, match)


def test_cli_collect_backgrounds_only_and_intervene_with_them(made, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    runner = CliRunner(env={"COLUMNS": "200"})
    made_bg = runner.invoke(main, ["-q", "collect", "synthetic", "alone", "--classes", "3", "--image-size", "32",
                                   "--seed", "1", "--vignette", "0.5", "--backgrounds-only", "2"])
    assert made_bg.exit_code == 0, made_bg.output
    assert "6 photos of backgrounds alone (2 of each of snow, water, sky)" in made_bg.output
    assert sorted(r["sha256"] for r in Dataset.open("alone").rows()) == sorted(
        r["sha256"] for r in Dataset.open(made / "alone").rows())  # the library's photos, byte for byte
    result = runner.invoke(main, ["-q", "intervene", str(made / "world"), "--out", "out", "--variants", "swap",
                                  "--background-photos", "alone"])
    assert result.exit_code == 0, result.output
    assert "swap-bgonly" in result.output
    assert InterventionRun.of_folder("out").settings["background_photos"] == str((tmp_path / "alone").resolve())
    bad = runner.invoke(main, ["-q", "intervene", str(made / "world"), "--out", "bad", "--variants", "swap",
                               "--background-photos", "nowhere"])
    assert bad.exit_code == 1 and "not a dataset folder" in bad.output
    assert len(bad.output.strip().splitlines()) == 1 and not (tmp_path / "bad").exists()


def test_an_earlier_folder_is_still_the_same_intervention_and_an_unlabelled_donor_is_counted(made, tmp_path) -> None:
    """Without background photos the recorded settings are as before the option existed (a folder made then is
    re-run, not refused); a hard swap whose donor has no background label gets no swap-bgonly, counted."""
    assert "background_photos" not in InterveneSettings().to_dict()
    world = Dataset.open(made / "world")
    easy = [r["sample_id"] for r in world.rows() if r["group"] == "easy" and r["class_index"] == SPEC.classes[0].imagenet_index]
    copy = collect_synthetic(tmp_path / "world", SPEC)
    assign_truth_groups(copy)
    copy.update(easy, per_sample={sid: {"background": None} for sid in easy}, actor="test", reason="unlabelled")
    record = intervene(copy, tmp_path / "out", InterveneSettings(variants="swap", background_photos=str(made / "alone")))
    hard = {r["source_sample_id"] for r in record.rows() if r["variant"] == "swap" and r["group"] == "hard"
            and r["class_index"] == SPEC.classes[0].imagenet_index}
    assert hard and record.counts["skipped_sources"]["bgonly_donor_unlabelled"] == len(hard)
    assert not {r["source_sample_id"] for r in record.rows() if r["variant"] == "swap-bgonly"} & hard


def _planted_evaluation(folder: Path, wrong: set[str]) -> None:
    """An evaluation run on ``folder`` right on every image but those of the variants ``wrong``."""
    record = InterventionRun.of_folder(folder)
    variants = {r["sample_id"]: r["variant"] for r in record.rows()}
    rows = Dataset.open(folder).rows()
    correct = [variants.get(r["sample_id"]) not in wrong for r in rows]
    table = pa.table({"sample_id": [r["sample_id"] for r in rows], "class_index": [r["class_index"] for r in rows],
                      "group": [r["group"] for r in rows], "background": [r["background"] for r in rows],
                      "topk_labels": [[r["class_index"] if ok else 0] for r, ok in zip(rows, correct)],
                      "topk_scores": [[1.0] for _ in rows], "correct1": correct, "correct5": correct})
    EvaluationRun(model={"name": "planted", "pretrained": None, "model_id": "hand:planted", "family": "clip"},
                  label_space={"name": "imagenet1k"}, prompts={"name": "none", "templates": []}, settings={},
                  dataset={}, predictions_table=table,
                  metrics={"overall": {}, "label_space": "imagenet1k", "candidates_per_sample": 3},
                  ).write(folder / "runs" / "planted")


def test_cli_attribution_prints_and_flags_the_fill_effect_wherever_the_ghost_control_is(made, tmp_path,
                                                                                       monkeypatch) -> None:
    """A model planted right on every image but the swap-bgonly ones: fill effect = swap - swap-bgonly = +100
    points in every class (each photo 1 - 0, so the interval is [100, 100]), B bg-alone = -100; flagged where
    the interval rule gives an interval (this small world has classes with one easy or one hard photo: there it
    is withheld and the class is not flagged); in the CLI's tables and flags, attribution.md, .csv, the report."""
    monkeypatch.chdir(tmp_path)
    intervene(made / "world", tmp_path / "out", InterveneSettings(variants="swap", swaps=2,
                                                                  background_photos=str(made / "alone")))
    _planted_evaluation(tmp_path / "out", {"swap-bgonly"})
    runner = CliRunner(env={"COLUMNS": "250"})
    result = runner.invoke(main, ["-q", "attribution", "out", "--runs", "planted", "--bootstrap", "50", "--classes",
                                  "--run-name", "a"])
    assert result.exit_code == 0, result.output
    assert "fill effect" in result.output and "B bg-alone" in result.output and "bg-alone n" in result.output
    run = AttributionRun.load(tmp_path / "out" / "runs" / "a")
    model = run.models[0]
    assert model.value("fill_effect") == 1.0 and model.value("background_part_bgonly") == -1.0
    withheld = [c for c in model.classes if np.isnan(c.intervals["fill_effect"][0])]  # a cell under the minimum
    flagged = [c for c in model.classes if c.flag.startswith("fill effect:")]
    assert flagged and all(c.intervals["fill_effect"] == (1.0, 1.0) for c in flagged)
    assert withheld and all(c.values["fill_effect"] == 1.0 and not c.flag for c in withheld)
    assert len(flagged) + len(withheld) == len(model.classes)
    rows = InterventionRun.of_folder(tmp_path / "out").rows()
    hard_swaps = sum(1 for r in rows if r["variant"] == "swap" and r["group"] == "hard")
    assert model.n_bgonly == sum(c.n_bgonly for c in model.classes) == hard_swaps  # one a hard swap
    assert "+100.0 points" in result.output
    assert "| fill effect | B bg-alone | bg-alone n |" in (tmp_path / "out" / "runs" / "a" / "attribution.md").read_text()
    assert "n_bgonly" in (tmp_path / "out" / "runs" / "a" / "attribution.csv").read_text().splitlines()[0]
    report = runner.invoke(main, ["-q", "report", "out", "--out", "rep"])
    assert report.exit_code == 0, report.output
    assert "fill effect" in next(Path("rep").glob("*.md")).read_text()
