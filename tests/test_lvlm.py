"""LVLM scoring by answer likelihood (papers/003 App. C.4) on a tiny random LLaVA built locally."""
from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from curate.collect.synthetic import DEFAULT_CLASSES, WorldSpec, assign_truth_groups, collect_synthetic
from curate.labels import imagenet1k
from curate.lvlm.hf import DEFAULT_QUESTION, HFLvlm, load_hf_lvlm
from curate.lvlm.tiny import build_tiny_llava
from curate.models.base import ModelError, WeightsNotFoundError
from curate.models.spec import ModelSpec
from curate.runs import load_run
from curate.stages.evaluate import EvalSettings, evaluate
from curate.store import Dataset

CLASSES = DEFAULT_CLASSES[:4]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    return build_tiny_llava(tmp_path_factory.mktemp("lvlm") / "tiny", seed=0)


@pytest.fixture(scope="module")
def lvlm(tiny_dir) -> HFLvlm:
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield load_hf_lvlm(tiny_dir)
    torch.set_num_threads(previous)


@pytest.fixture(scope="module")
def images() -> list[Image.Image]:
    rng = np.random.default_rng(0)
    return [Image.fromarray(rng.integers(0, 256, (24 + 8 * i, 40, 3), dtype=np.uint8)) for i in range(3)]


@pytest.fixture(scope="module")
def answers() -> list[list[str]]:
    names = imagenet1k().names
    rng = np.random.default_rng(1)
    return [[f"A {names[j]}." for j in rng.choice(1000, size=20, replace=False)] for _ in range(3)]


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("lvlm-world") / "world"
    collect_synthetic(root, WorldSpec(classes=CLASSES, per_class=5, image_size=32, seed=3, p=0.25))
    assign_truth_groups(Dataset.open(root))
    return root


@pytest.fixture(scope="module")
def labels_file(world) -> Path:
    path = world.parent / "labels.txt"
    path.write_text("".join(f"{c.imagenet_index}  # {c.name}\n" for c in CLASSES))
    return path


def test_loss_is_the_mean_nll_of_the_answer_tokens_by_hand(lvlm, images) -> None:
    context = lvlm.context(DEFAULT_QUESTION)
    answer = "A great white shark."
    inputs = lvlm._prefix_inputs(images[:1], context + " " + answer)
    n_prefix = lvlm._prefix_inputs(images[:1], context)["input_ids"].shape[1]
    labels = inputs["input_ids"].clone()
    labels[:, :n_prefix] = -100
    with torch.no_grad():
        out = lvlm.module(**inputs, labels=labels)
    logp = torch.log_softmax(out.logits[0, :-1].double(), dim=-1)
    targets = labels[0, 1:]
    picked = torch.stack([logp[i, t] for i, t in enumerate(targets.tolist()) if t != -100])
    assert len(picked) == 5  # "a great white shark ." in the tiny word-level vocabulary
    mean, total = lvlm.answer_losses(images[:1], DEFAULT_QUESTION, [[answer]])
    assert mean[0, 0] == pytest.approx(float(-picked.mean()), abs=1e-5)
    assert total[0, 0] == pytest.approx(float(-picked.sum()), abs=5e-5)
    assert mean[0, 0] == pytest.approx(float(out.loss), abs=1e-5)  # the model's own masked loss


def test_kv_cache_route_equals_the_naive_route(lvlm, images, answers) -> None:
    mean, total = lvlm.answer_losses(images, DEFAULT_QUESTION, answers)
    naive_mean, naive_total = lvlm.answer_losses_naive(images, DEFAULT_QUESTION, answers)
    assert mean.shape == (3, 20)
    np.testing.assert_allclose(mean, naive_mean, atol=1e-5)
    np.testing.assert_allclose(total, naive_total, atol=1e-4)
    assert np.ptp(mean) > 0.01  # the candidates differ; equal numbers would prove nothing


def test_batched_over_images_equals_one_at_a_time_and_ragged_lists_pad_with_nan(lvlm, images, answers) -> None:
    lvlm.batch_size, lvlm.candidate_batch = 8, 160
    batched, _ = lvlm.answer_losses(images, DEFAULT_QUESTION, answers)
    one = np.concatenate([lvlm.answer_losses([im], DEFAULT_QUESTION, [a])[0] for im, a in zip(images, answers)])
    np.testing.assert_allclose(batched, one, atol=1e-5)
    ragged, _ = lvlm.answer_losses(images[:2], DEFAULT_QUESTION, [answers[0][:3], answers[1][:1]])
    assert np.isnan(ragged[1, 1:]).all() and np.isfinite(ragged[0]).all()
    np.testing.assert_allclose(ragged[0], batched[0, :3], atol=1e-5)


def test_out_of_memory_halves_the_batch_and_goes_on(lvlm, images, answers, monkeypatch, caplog) -> None:
    reference, _ = lvlm.answer_losses(images, DEFAULT_QUESTION, answers)
    forward = lvlm.module.forward
    seen = []

    def tight(*args, **kwargs):
        rows = (kwargs.get("input_ids") if kwargs.get("input_ids") is not None else args[0]).shape[0]
        seen.append(rows)
        if rows > 7:
            raise torch.OutOfMemoryError("CUDA out of memory (injected)")
        return forward(*args, **kwargs)

    monkeypatch.setattr(lvlm.module, "forward", tight)
    lvlm.batch_size, lvlm.candidate_batch = 8, 64
    with caplog.at_level(logging.WARNING):
        mean, _ = lvlm.answer_losses(images, DEFAULT_QUESTION, answers)
    np.testing.assert_allclose(mean, reference, atol=1e-5)
    assert lvlm.candidate_batch <= 7 and max(seen[-3:]) <= 7
    assert "out of memory" in caplog.text and "halving" in caplog.text
    lvlm.batch_size, lvlm.candidate_batch = 8, 160


def test_an_answer_that_tokenises_to_nothing_is_refused(lvlm, images) -> None:
    from curate.lvlm.scoring import answer_text

    with pytest.raises(ValueError, match="tokenises to nothing"):
        lvlm.answer_losses(images[:1], DEFAULT_QUESTION, [["A tench.", "  "]])
    with pytest.raises(ValueError, match="no '\\{\\}'"):
        answer_text("A thing.", "tench")


def test_generate_is_greedy_and_deterministic(lvlm, images) -> None:
    first = lvlm.generate(images[:2] + [None], [DEFAULT_QUESTION] * 3, max_new_tokens=4)
    again = lvlm.generate(images[:2] + [None], [DEFAULT_QUESTION] * 3, max_new_tokens=4, system=None)
    assert first == again and all(isinstance(t, str) and t for t in first)


def test_missing_model_and_missing_chat_template_fail_clearly(tiny_dir, tmp_path) -> None:
    with pytest.raises(WeightsNotFoundError, match="never downloads"):
        load_hf_lvlm(tmp_path / "nowhere")
    with pytest.raises(WeightsNotFoundError, match="local Hugging Face cache"):
        load_hf_lvlm("curate-tests/no-such-llava")
    broken = tmp_path / "no-template"
    shutil.copytree(tiny_dir, broken)
    (broken / "chat_template.jinja").unlink()
    for name in ("processor_config.json", "tokenizer_config.json"):
        data = json.loads((broken / name).read_text())
        data.pop("chat_template", None)
        (broken / name).write_text(json.dumps(data))
    with pytest.raises(ModelError, match="no chat template"):
        load_hf_lvlm(broken)


def test_registry_loads_lvlm_names_and_model_id_names_the_weights(tiny_dir) -> None:
    from curate.models import backends, load_model

    assert {"lvlm", "endpoint"} <= set(backends())
    model = load_model(f"lvlm:{tiny_dir}")
    assert model.kind == "lvlm" and model.model_id.startswith("lvlm:tiny:file-")
    assert model.revision == model.info["revision"]
    other = build_tiny_llava(tiny_dir.parent / "tiny-seed1", seed=1)
    assert load_hf_lvlm(other).model_id != model.model_id  # other weights, other id


class _Planted:
    """An LVLM whose losses are planted: the true class has the LOWEST mean NLL and the HIGHEST sum."""

    kind = "lvlm"
    model_id = "planted"
    revision = "test"
    info = {"backend": "planted"}

    def __init__(self, true_answer: dict[str, str]) -> None:
        self.true_answer = true_answer

    def answer_losses(self, images, question, answers_per_image, **_):
        mean = np.full((len(images), max(map(len, answers_per_image))), np.nan)
        total = mean.copy()
        for i, answers in enumerate(answers_per_image):
            for c, answer in enumerate(answers):
                right = answer in self.true_answer.values() and answer == self._truth(images[i])
                mean[i, c] = 0.5 if right else 2.0 + c
                total[i, c] = 50.0 if right else 2.0 + c
        return mean, total

    def _truth(self, image) -> str:
        return self.true_answer[image.info["sid"]]


def test_prediction_is_the_argmin_of_the_mean_loss_not_argmax_nor_sum(world, labels_file, monkeypatch) -> None:
    import curate.lvlm.scoring as scoring

    ds = Dataset.open(world)
    names = ds.label_space.names
    truth = {r["sample_id"]: f"A {names[r['class_index']]}." for r in ds.rows()}
    planted = _Planted(truth)
    load_image = Dataset.load_image

    def tagged(self, sid):
        image = load_image(self, sid)
        image.info["sid"] = sid
        return image

    monkeypatch.setattr(Dataset, "load_image", tagged)
    monkeypatch.setattr(scoring, "load_lvlm", lambda spec, settings: planted)
    run = evaluate(world, ModelSpec("lvlm:planted"), EvalSettings(label_space=str(labels_file), bootstrap=50),
                   run_name="planted", overwrite=True)
    assert run.overall["acc1"] == 1.0  # argmax of the loss, or ranking by the sum, would give 0
    losses = run.candidate_losses().to_pylist()
    assert len(losses) == 4 * len(truth)
    right = [r for r in losses if truth[r["sample_id"]] == f"A {names[r['label']]}."]
    assert {r["mean_nll"] for r in right} == {0.5} and {r["sum_nll"] for r in right} == {50.0}
    top = run.predictions(["topk_scores"]).column(0).to_pylist()[0]
    assert top[0] == -0.5  # scores are minus the mean loss


def test_evaluate_an_lvlm_end_to_end_records_the_protocol(world, labels_file, tiny_dir) -> None:
    spec = ModelSpec(f"lvlm:{tiny_dir}")
    settings = EvalSettings(label_space=str(labels_file), bootstrap=50, question="What is this?",
                            answer_template="It is a {}.")
    run = evaluate(world, spec, settings, run_name="lvlm-e2e", overwrite=True)
    loaded = load_run(run.run_dir)
    config = json.loads((run.run_dir / "config.json").read_text())
    assert config["record_version"] == 3 and loaded.family == "lvlm"
    assert config["model"]["info"]["backend"] == "lvlm" and config["model"]["info"]["revision"].startswith("file-")
    assert config["settings"]["question"] == "What is this?" and config["settings"]["answer_template"] == "It is a {}."
    assert loaded.prompts_name.startswith("qa-") and loaded.templates == ["It is a {}."]
    table = loaded.candidate_losses()
    assert table.num_rows == 4 * 20 and set(table.column_names) == {"sample_id", "label", "mean_nll", "sum_nll"}
    # the stored top-1 is the candidate with the lowest stored mean loss
    by_sample: dict[str, list] = {}
    for r in table.to_pylist():
        by_sample.setdefault(r["sample_id"], []).append((r["mean_nll"], r["label"]))
    preds = loaded.predictions(["sample_id", "topk_labels"]).to_pydict()
    for sid, topk in zip(preds["sample_id"], preds["topk_labels"]):
        assert topk[0] == min(by_sample[sid])[1]
    # the same model re-run as the paper's pair lands in another prompt set for compare
    other = evaluate(world, spec, EvalSettings(label_space=str(labels_file), bootstrap=50), run_name="lvlm-paper",
                     overwrite=True)
    assert other.prompts_name == "paper-qa"
    # an overwritten LVLM run as a CLIP run would not keep a stale losses table
    (run.run_dir / "config.json").write_text(json.dumps({**config, "record_version": 2}))
    (run.run_dir / "candidate_losses.parquet").unlink()
    old = load_run(run.run_dir)
    assert old.candidate_losses() is None and old.family == "lvlm"


def test_auto_label_space_is_top20_for_lvlms_and_1_vs_1000_warns_the_cost(world, tiny_dir, caplog) -> None:
    from curate.lvlm.scoring import resolve_label_space
    from curate.zeroshot.candidates import save_top20

    ds = Dataset.open(world)
    rng = np.random.default_rng(0)
    table = {}
    for c in CLASSES:
        others = [j for j in rng.choice(1000, size=25, replace=False) if j != c.imagenet_index][:19]
        table[c.imagenet_index] = np.array([c.imagenet_index, *others], dtype=np.int64)
    save_top20(ds.root, table, {"reference_spec": "test", "reference_model_id": "test"})
    assert resolve_label_space(EvalSettings(label_space="auto"), ModelSpec("ViT-B-32")).label_space == "imagenet1k"
    assert resolve_label_space(EvalSettings(label_space="auto"), ModelSpec("endpoint:x")).label_space == "top20"
    spec = ModelSpec(f"lvlm:{tiny_dir}")
    run = evaluate(world, spec, EvalSettings(label_space="auto", bootstrap=20), run_name="auto", overwrite=True)
    assert run.label_space_name == "top20" and run.candidate_losses().num_rows == 20 * 20
    small = world.parent / "small"
    collect_synthetic(small, WorldSpec(classes=CLASSES[:2], per_class=1, image_size=32, seed=4, p=0.5))
    with caplog.at_level(logging.WARNING):
        big = evaluate(small, spec, EvalSettings(label_space="imagenet1k", bootstrap=20), run_name="big")
    assert "2 images x 1000 candidates = 2000 answers" in caplog.text and "(50x the 1-vs-20 cost)" in caplog.text
    assert big.candidate_losses().num_rows == 2000


def test_images_that_fail_to_decode_are_excluded_and_counted(world, labels_file, tiny_dir, tmp_path) -> None:
    copy = tmp_path / "world"
    shutil.copytree(world, copy)
    ds = Dataset.open(copy)
    victim = ds.rows()[0]
    ds.image_path(victim["sample_id"]).write_bytes(b"not an image")
    run = evaluate(copy, ModelSpec(f"lvlm:{tiny_dir}"), EvalSettings(label_space=str(labels_file), bootstrap=20),
                   run_name="bad", overwrite=True)
    assert run.excluded_count == 1 and run.overall["n"] == len(ds.rows()) - 1
    assert victim["sample_id"] not in set(run.candidate_losses().column("sample_id").to_pylist())


def test_a_batch_whose_prefixes_differ_in_length_is_split_by_image_size(lvlm, images, answers, monkeypatch) -> None:
    reference, _ = lvlm.answer_losses(images, DEFAULT_QUESTION, answers)
    original = lvlm._prefix_inputs
    calls = []

    def like_llava_next(batch, context):  # image tokens per image size: a mixed batch cannot be stacked
        calls.append(len(batch))
        if len({im.size for im in batch}) > 1:
            raise ValueError("Unable to create tensor, you should probably activate padding")
        return original(batch, context)

    monkeypatch.setattr(lvlm, "_prefix_inputs", like_llava_next)
    mean, _ = lvlm.answer_losses(images, DEFAULT_QUESTION, answers)
    np.testing.assert_allclose(mean, reference, atol=1e-5)
    assert calls == [3, 1, 1, 1]


def test_an_endpoint_on_the_ray_engine_is_refused_before_any_work(world, labels_file) -> None:
    """An endpoint: model already batches on its server; Ray is refused before Ray starts or a
    request is sent (lvlm: models on Ray: tests/test_engine_ray.py)."""
    spec = ModelSpec("endpoint:http://127.0.0.1:9/v1#tiny")
    settings = EvalSettings(label_space=str(labels_file), bootstrap=10, engine="ray")
    with pytest.raises(ValueError, match="scored by its server"):
        evaluate(world, spec, settings, run_name="endpoint-ray", overwrite=True)
    assert not (Path(world) / "runs" / "endpoint-ray" / "config.json").exists()
