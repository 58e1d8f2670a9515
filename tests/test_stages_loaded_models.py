"""Stages take loaded models (issue 28): every stage runs on an already loaded model, records what
was passed (``curate.stages.common.model_identity``) and predicts what the spec of the same weights
predicts. Tiny worlds, tiny models, minimal settings: plumbing, never science."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from curate.collect.synthetic import DEFAULT_CLASSES, WorldSpec, assign_truth_groups, collect_synthetic
from curate.models import ModelSpec, load_model
from curate.store import Dataset

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"), pytest.mark.usefixtures("one_thread")]

CLASSES = DEFAULT_CLASSES[:3]
CLIP_ARCH = "curate-tiny-vit"


def _world(root: Path) -> Dataset:
    ds = collect_synthetic(root, WorldSpec(classes=CLASSES, per_class=6, image_size=32, p=0.5))
    assign_truth_groups(ds)
    return Dataset.open(ds.root)


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    return _world(tmp_path_factory.mktemp("loaded") / "world").root


@pytest.fixture()
def world(template, tmp_path) -> Dataset:
    """A fresh copy of the tiny world (stages write into it)."""
    import shutil

    shutil.copytree(template, tmp_path / "world")
    return Dataset.open(tmp_path / "world")


@pytest.fixture(scope="module")
def labels_file(template) -> Path:
    """The world's three classes as a label space (1 vs 3: cheap for every model)."""
    path = template.parent / "labels.txt"
    path.write_text("".join(f"{c.imagenet_index}  # {c.name}\n" for c in CLASSES))
    return path


@pytest.fixture(scope="module")
def clip_file(tmp_path_factory) -> Path:
    """A tiny CLIP saved as a curate weights file, so a spec and a loaded model name the same weights."""
    path = tmp_path_factory.mktemp("clip") / "tiny.pt"
    model = load_model(CLIP_ARCH, seed=0)
    torch.save({"state_dict": model.module.state_dict(), "curate": {"arch": CLIP_ARCH}}, path)
    return path


@pytest.fixture(scope="module")
def clip_spec(clip_file) -> ModelSpec:
    return ModelSpec(CLIP_ARCH, str(clip_file))


@pytest.fixture(scope="module")
def clip(clip_file):
    return load_model(CLIP_ARCH, clip_file)


@pytest.fixture(scope="module")
def llava_dir(tmp_path_factory) -> Path:
    from curate.lvlm.tiny import build_tiny_llava

    return build_tiny_llava(tmp_path_factory.mktemp("llava") / "tiny", seed=0, image_size=32)


@pytest.fixture(scope="module")
def llava(llava_dir):
    from curate.lvlm.hf import load_hf_lvlm

    return load_hf_lvlm(llava_dir)


def _config(run) -> dict:
    return json.loads((run.run_dir / "config.json").read_text())


def _loaded_identity(model, name, pretrained=None) -> dict:
    return {"name": name, "pretrained": pretrained, "model_id": model.model_id, "passed": "loaded"}


# ----------------------------------------------------------------------------- the rule
def test_model_identity_rule(clip, clip_spec, clip_file) -> None:
    """A spec is recorded as given; a loaded model by what it records of its own origin (its loader's
    info), its model_id always; an object that records nothing is named by its model_id."""
    from curate.stages.common import model_identity

    assert model_identity(clip_spec, clip) == {"name": CLIP_ARCH, "pretrained": str(clip_file),
                                               "model_id": clip.model_id, "passed": "spec"}
    assert model_identity(clip, clip) == _loaded_identity(clip, CLIP_ARCH, str(clip_file))
    assert model_identity(str(clip_file), clip)["name"] == "auto"  # a weights file is a spec too
    classifier = load_model("timm:test_resnet", seed=0)
    assert model_identity(classifier, classifier) == _loaded_identity(classifier, "timm:test_resnet")

    class Bare:
        kind = "clip"
        model_id = "bare:1"

    assert model_identity(Bare(), Bare()) == _loaded_identity(Bare(), "bare:1")
    Bare.model_id = None
    with pytest.raises(TypeError, match="model_id"):
        model_identity(Bare(), Bare())


# ----------------------------------------------------------------------------- evaluate
def test_evaluate_takes_a_loaded_clip_and_predicts_what_its_spec_predicts(world, clip, clip_spec, labels_file) -> None:
    from curate.stages.evaluate import EvalSettings, evaluate

    settings = EvalSettings(label_space=str(labels_file), bootstrap=5, device="cpu", use_cache=False)
    by_spec = evaluate(world, clip_spec, settings, run_name="spec")
    by_loaded = evaluate(world, clip, settings, run_name="loaded")
    assert by_loaded.images_encoded == 18  # computed again, not read from the spec run's cache
    assert by_loaded.correct1_by_sample() == by_spec.correct1_by_sample()
    model = _config(by_loaded)["model"]
    assert {k: model[k] for k in ("name", "pretrained", "model_id", "passed")} == \
        _loaded_identity(clip, CLIP_ARCH, clip_spec.pretrained)
    assert model["family"] == "clip" and _config(by_spec)["model"]["passed"] == "spec"
    assert by_loaded.model_label == by_spec.model_label == clip_spec.label


def test_evaluate_takes_a_loaded_classifier(world, monkeypatch) -> None:
    import curate.stages.evaluate as ev
    from curate.stages.evaluate import EvalSettings, evaluate

    monkeypatch.setattr(ev, "_load", lambda spec, settings: load_model(spec.name, spec.pretrained, seed=0))
    settings = EvalSettings(label_space="imagenet1k", bootstrap=5, device="cpu", use_cache=False, batch_size=32)
    by_spec = evaluate(world, ModelSpec("timm:test_resnet"), settings, run_name="spec")
    classifier = load_model("timm:test_resnet", seed=0)
    by_loaded = evaluate(world, classifier, settings, run_name="loaded")
    assert by_loaded.correct1_by_sample() == by_spec.correct1_by_sample()
    model = _config(by_loaded)["model"]
    assert model["passed"] == "loaded" and model["name"] == "timm:test_resnet" and model["family"] == "classifier"
    assert model["model_id"] == classifier.model_id == by_spec.model_id


def test_evaluate_takes_a_loaded_lvlm_and_predicts_what_its_spec_predicts(world, llava, llava_dir, labels_file) -> None:
    from curate.stages.evaluate import EvalSettings, evaluate

    settings = EvalSettings(label_space=str(labels_file), bootstrap=5, device="cpu")
    by_spec = evaluate(world, ModelSpec(f"lvlm:{llava_dir}"), settings, run_name="spec")
    by_loaded = evaluate(world, llava, settings, run_name="loaded")
    assert by_loaded.correct1_by_sample() == by_spec.correct1_by_sample()
    model = _config(by_loaded)["model"]
    assert {k: model[k] for k in ("name", "pretrained", "model_id", "passed")} == \
        _loaded_identity(llava, f"lvlm:{llava_dir}")
    assert model["family"] == "lvlm" and by_loaded.candidate_losses().num_rows == 18 * 3


class _Counting:
    """A loaded LVLM that counts the answers it scores."""

    kind = "lvlm"

    def __init__(self, lvlm, model_id) -> None:
        self.lvlm, self.model_id, self.info, self.scored = lvlm, model_id, dict(lvlm.info), 0

    def answer_losses(self, images, question, answers, **kwargs):
        self.scored += sum(len(a) for a in answers)
        return self.lvlm.answer_losses(images, question, answers, **kwargs)


def test_evaluate_with_a_loaded_lvlm_fails_before_scoring(world, llava, llava_dir, labels_file) -> None:
    from curate.stages.evaluate import EvalSettings, evaluate

    settings = EvalSettings(label_space=str(labels_file), bootstrap=5, device="cpu")
    nameless = _Counting(llava, None)  # nothing to record the run under
    with pytest.raises(TypeError, match="model_id"):
        evaluate(world, nameless, settings, run_name="nameless")
    assert nameless.scored == 0

    class Mute:  # says it is an LVLM but cannot score answers
        kind = "lvlm"
        model_id = "mute"
        info: dict = {}

    with pytest.raises(TypeError, match="answer_losses"):
        evaluate(world, Mute(), settings, run_name="mute")
    assert not (world.root / "runs").exists() or not list((world.root / "runs").iterdir())

    counting = _Counting(llava, llava.model_id)
    run = evaluate(world, counting, settings, run_name="counting")
    assert counting.scored == 18 * 3 and _config(run)["model"]["name"] == f"lvlm:{llava_dir}"


# ----------------------------------------------------------------------------- explain
def test_explain_records_a_loaded_clip_and_classifier(world, clip, clip_spec) -> None:
    from curate.stages.explain import ExplainSettings, explain

    settings = ExplainSettings(label_space="present", limit=4, device="cpu")
    by_spec = explain(world, clip_spec, settings, run_name="spec")
    by_loaded = explain(world, clip, settings, run_name="loaded")
    model = by_loaded.config["model"]
    assert {k: model[k] for k in ("name", "pretrained", "model_id", "passed")} == \
        _loaded_identity(clip, CLIP_ARCH, clip_spec.pretrained)
    assert by_spec.config["model"]["passed"] == "spec" and by_loaded.model_label == by_spec.model_label
    assert by_loaded.predictions().to_pylist() == by_spec.predictions().to_pylist()

    classifier = load_model("timm:test_resnet", seed=0)
    run = explain(world, classifier, ExplainSettings(label_space="present", limit=2, device="cpu"), run_name="timm")
    assert run.config["model"]["passed"] == "loaded" and run.config["model"]["name"] == "timm:test_resnet"
    assert run.config["model"]["model_id"] == classifier.model_id


# ----------------------------------------------------------------------------- fidelity
def test_fidelity_records_a_loaded_model(world, clip, clip_spec) -> None:
    from curate.stages.fidelity import FidelitySettings, fidelity

    settings = FidelitySettings(methods=("mask", "random"), sparsities="0.5", samples=1, limit=3, finetune_epochs=0,
                                batch_size=4, seeds=1, device="cpu")
    by_spec = fidelity(world, clip_spec, settings, run_name="spec")
    spec_record = Dataset.open(world.root).provenance["fidelity"]
    by_loaded = fidelity(world, clip, settings, run_name="loaded")
    record = Dataset.open(world.root).provenance["fidelity"]
    assert record["run"] == "loaded" and record["model"] == _loaded_identity(clip, CLIP_ARCH, clip_spec.pretrained)
    assert spec_record["run"] == "spec" and spec_record["model"]["passed"] == "spec"
    assert by_loaded.config.model == by_spec.config.model == clip.model_id
    assert by_loaded.aucs == by_spec.aucs
    # ... and the run itself records it (config.json's model_identity), read back through the record
    from curate.runs.fidelity import FidelityRun

    assert FidelityRun.load(world.root / "runs" / "loaded").config.model_identity == record["model"]
    assert FidelityRun.load(world.root / "runs" / "spec").config.model_identity["passed"] == "spec"


# ----------------------------------------------------------------------------- audit
def test_audit_records_a_loaded_clip_and_refuses_a_classifier(world, clip, clip_spec) -> None:
    from curate.stages.audit import AuditSettings, audit

    settings = AuditSettings(checks=("label",), device="cpu")
    by_spec = audit(world, clip_spec, settings, run_name="spec")
    by_loaded = audit(world, clip, settings, run_name="loaded")
    assert by_loaded.model == _loaded_identity(clip, CLIP_ARCH, clip_spec.pretrained)
    assert by_spec.model["passed"] == "spec" and by_loaded.model_label == by_spec.model_label
    assert np.array_equal(by_loaded.scores("label"), by_spec.scores("label"), equal_nan=True)
    with pytest.raises(ValueError, match="needs a CLIP"):
        audit(world, load_model("timm:test_resnet", seed=0), settings, run_name="timm")


# ----------------------------------------------------------------------------- label-backgrounds
def _unlabelled(root: Path) -> Dataset:
    from PIL import Image

    from curate.store import NewSample

    ds = Dataset.create(root, backgrounds=["snow", "grass", "water"])
    rng = np.random.default_rng(0)
    ds.add_samples([NewSample(image=Image.fromarray(rng.integers(0, 255, (16, 16, 3), dtype=np.uint8)),
                              class_index=296, status="accepted") for _ in range(4)])
    return ds


def test_label_backgrounds_records_a_loaded_clip(tmp_path, clip, clip_spec) -> None:
    from curate.stages.label_backgrounds import LabelBackgroundsSettings, label_backgrounds

    def labels(ds):
        return sorted((r["sample_id"], r["background"], r["background_score"]) for r in Dataset.open(ds.root).rows())

    settings = LabelBackgroundsSettings(device="cpu")
    spec_ds, loaded_ds = _unlabelled(tmp_path / "spec"), _unlabelled(tmp_path / "loaded")
    label_backgrounds(spec_ds, clip_spec, settings)
    report = label_backgrounds(loaded_ds, clip, settings)
    assert report.labelled == 4 and labels(loaded_ds) == labels(spec_ds)
    record = Dataset.open(loaded_ds.root).provenance["label_backgrounds"]
    assert record["model"] == _loaded_identity(clip, CLIP_ARCH, clip_spec.pretrained)
    assert record["model_id"] == clip.model_id
    assert Dataset.open(spec_ds.root).provenance["label_backgrounds"]["model"]["passed"] == "spec"
    with pytest.raises(ValueError, match="need a CLIP"):
        label_backgrounds(loaded_ds, load_model("timm:test_resnet", seed=0), settings)


# ----------------------------------------------------------------------------- vlm-explain, vlm-quality
def _vlm_world(root: Path) -> Dataset:
    from curate.zeroshot.candidates import save_top20

    ds = _world(root)
    top = [c.imagenet_index for c in CLASSES]
    save_top20(ds.root, {c: np.array(top) for c in top}, {"reference_spec": "test table"})
    return ds


def test_vlm_explain_takes_a_loaded_lvlm(tmp_path, llava, llava_dir) -> None:
    from curate.stages.vlm_explain import VlmExplainSettings, vlm_explain

    ds = _vlm_world(tmp_path / "world")
    settings = VlmExplainSettings(answer_mode="likelihood", limit=3, explain_max_tokens=4, use_cache=False)
    by_spec = vlm_explain(ds, f"lvlm:{llava_dir}", settings, run_name="spec")
    by_loaded = vlm_explain(ds, llava, settings, run_name="loaded")
    model = by_loaded.config["model"]
    assert {k: model[k] for k in ("name", "pretrained", "model_id", "passed")} == \
        _loaded_identity(llava, f"lvlm:{llava_dir}")
    assert by_spec.config["model"]["passed"] == "spec" and by_spec.config["model"]["name"] == f"lvlm:{llava_dir}"
    columns = ["sample_id", "predicted_index", "correct", "explanation"]
    assert by_loaded.table.select(columns).to_pylist() == by_spec.table.select(columns).to_pylist()


def test_vlm_quality_takes_loaded_judges(tmp_path, llava, llava_dir) -> None:
    from fake_judges import ScriptedJudge
    from fake_openai import FakeOpenAI

    from curate.stages.vlm_explain import VlmExplainSettings, vlm_explain
    from curate.stages.vlm_quality import Judges, VlmQualitySettings, vlm_quality
    from curate.vlm_quality.nli import load_nli
    from curate.vlm_quality.tiny import build_tiny_nli

    ds = _vlm_world(tmp_path / "world")
    nli_dir = build_tiny_nli(tmp_path / "nli", words=["The main object in the image is a"])
    nli = load_nli(nli_dir)
    vlm_explain(ds, llava, VlmExplainSettings(answer_mode="likelihood", limit=2, explain_max_tokens=6), run_name="ex")
    with FakeOpenAI(chat_handler=ScriptedJudge(), model_name="judge") as server:
        url = f"endpoint:{server.base_url}#judge"
        settings = VlmQualitySettings(run="ex", use_cache=False)
        by_spec = vlm_quality(ds, Judges(url, f"lvlm:{llava_dir}", url, f"hf:{nli_dir}", verifier_mode="likelihood"),
                              settings, run_name="spec")
        by_loaded = vlm_quality(ds, Judges(url, llava, url, nli, verifier_mode="likelihood"), settings,
                                run_name="loaded")
    judges = by_loaded.judges
    assert {k: judges["verifier"][k] for k in ("name", "pretrained", "model_id", "passed")} == \
        _loaded_identity(llava, f"lvlm:{llava_dir}")
    assert {k: judges["nli"][k] for k in ("name", "pretrained", "model_id", "passed")} == \
        _loaded_identity(nli, f"hf:{nli_dir}")
    assert judges["verifier"]["mode"] == "likelihood" and judges["qgen"]["passed"] == "spec"
    assert by_spec.judges["verifier"]["passed"] == "spec" and by_spec.judges["nli"]["name"] == f"hf:{nli_dir}"
    columns = ["sample_id", "vf", "contr", "p_yes", "entailment"]
    assert by_loaded.scores(columns).to_pylist() == by_spec.scores(columns).to_pylist()
