"""Issue 24 §4 "Trust": every mask consumer uses human and exact masks, a model's unverified
proposals (``mask_status = model:<id>``) only with ``allow_model_masks`` / ``--allow-model-masks``,
masks reviewers marked bad never; each counts what it left out and states the masks it used by
source (:class:`curate.masks.sources.MaskCounts`). Consumers: explain (SSS / RMA), fidelity's
``mask`` reference, the audit's clarity check, composites, and the report.

One 12-image synthetic world (exact masks) and tiny random models; in it three masks become model
proposals, one is marked bad and one is a verified proposal (``ok``: human).
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from curate.cli import main
from curate.collect.synthetic import DEFAULT_CLASSES, WorldSpec, collect_synthetic
from curate.masks.sources import MaskCounts
from curate.store import Dataset

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"), pytest.mark.usefixtures("one_thread")]

PROPOSAL = "model:tiny@abc"
#: The marked world: 12 samples (3 classes x 4); 3 proposals, 1 bad, 1 verified (human), 7 exact.
USED_BY_DEFAULT = {"human": 1, "exact": 7, "model": 0, "skipped_model": 3, "skipped_rejected": 1,
                   "allow_model_masks": False}
USED_WITH_FLAG = {"human": 1, "exact": 7, "model": 3, "skipped_model": 0, "skipped_rejected": 1,
                  "allow_model_masks": True}


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("trust") / "world"
    collect_synthetic(root, WorldSpec(classes=DEFAULT_CLASSES[:3], per_class=4, image_size=32, seed=3, p=0.9))
    return root


def _mark(root: Path, *, everything: bool = False) -> dict[str, list[str]]:
    """Turn masks into model proposals (their own exact masks, so only the status differs), mark one
    bad and one verified; ``everything``: every mask becomes a proposal."""
    ds = Dataset.open(root)
    rows = ds.rows()
    ids = [r["sample_id"] for r in rows]
    model = ids if everything else [ids[0], ids[4], ids[8]]  # one per class
    ds.set_masks({sid: ds.load_mask(sid) for sid in model}, mask_status=PROPOSAL, actor="propose-masks:test")
    if everything:
        return {"model": model, "bad": [], "human": []}
    ds.update([ids[1]], {"mask_status": "bad"}, actor="reviewer")
    ds.update([ids[5]], {"mask_status": "ok"}, actor="reviewer")
    return {"model": model, "bad": [ids[1]], "human": [ids[5]]}


@pytest.fixture()
def world(template, tmp_path) -> tuple[Path, dict[str, list[str]]]:
    root = tmp_path / "world"
    shutil.copytree(template, root)
    return root, _mark(root)


@pytest.fixture()
def all_model(template, tmp_path) -> Path:
    root = tmp_path / "all-model"
    shutil.copytree(template, root)
    _mark(root, everything=True)
    return root


@pytest.fixture(scope="module")
def clip():
    from curate.models import load_model

    return load_model("curate-tiny-rn", seed=0)


def _refusal(text: str) -> None:
    """The all-model error names both ways forward."""
    assert "made by a model" in text and "--allow-model-masks" in text and "curate review" in text, text


# ----------------------------------------------------------------------------- explain (SSS / RMA)
def test_explain_skips_and_counts_untrusted_masks_and_uses_proposals_when_allowed(world, clip) -> None:
    from curate.runs.explain import ExplainRun
    from curate.stages.explain import SKIP_REASONS, ExplainSettings, explain

    root, marked = world
    assert {"model_mask", "rejected_mask"} <= set(SKIP_REASONS)
    run = explain(root, clip, ExplainSettings(label_space="present", device="cpu"), run_name="default")
    assert run.n_images == 8 and run.skipped_reasons == {"model_mask": 3, "rejected_mask": 1}
    left_out = {s["sample_id"]: s["reason"] for s in run.skipped_samples}
    assert left_out == {**dict.fromkeys(marked["model"], "model_mask"), marked["bad"][0]: "rejected_mask"}
    assert set(marked["model"]).isdisjoint(run.predictions().column("sample_id").to_pylist())
    assert run.mask_counts.as_dict() == USED_BY_DEFAULT
    assert run.mask_line == ("masks: 1 human, 7 exact (synthetic / COCO), 0 model-made; 3 unverified model proposals "
                             "left out (--allow-model-masks uses them); 1 mask marked bad by reviewers left out")
    entry = ExplainRun.load(run.run_dir).by_group()  # the record carries them to report / demo / compare
    assert entry["masks"] == USED_BY_DEFAULT and entry["mask_line"] == run.mask_line
    assert run.settings["allow_model_masks"] is False

    allowed = explain(root, clip, ExplainSettings(label_space="present", device="cpu", allow_model_masks=True),
                      run_name="allowed")
    assert allowed.n_images == 11 and allowed.skipped_reasons == {"rejected_mask": 1}  # bad masks: never
    assert set(marked["model"]) <= set(allowed.predictions().column("sample_id").to_pylist())
    assert allowed.mask_counts.as_dict() == USED_WITH_FLAG
    assert "3 model-made (unverified proposals, used with --allow-model-masks)" in allowed.mask_line
    assert ExplainRun.load(allowed.run_dir).settings["allow_model_masks"] is True


def test_explain_refuses_a_folder_of_model_proposals_and_the_cli_flag_opens_it(all_model) -> None:
    from curate.saliency import SaliencyError
    from curate.stages.common import load_spec
    from curate.stages.explain import ExplainSettings, compute_explanations

    with pytest.raises(SaliencyError) as error:
        compute_explanations(all_model, load_spec("curate-tiny-rn", device="cpu"), ExplainSettings())
    _refusal(str(error.value))
    assert "the 12 masks explain would use" in str(error.value)

    runner = CliRunner(env={"COLUMNS": "250"})
    args = ["explain", str(all_model), "--model", "curate-tiny-rn", "--label-space", "present", "--device", "cpu"]
    result = runner.invoke(main, [*args, "--run-name", "refused"])
    assert result.exit_code == 1 and "--allow-model-masks" in result.output and "curate review" in result.output
    assert not (all_model / "runs" / "refused").exists()
    result = runner.invoke(main, [*args, "--allow-model-masks", "--run-name", "cli"])
    assert result.exit_code == 0, result.output
    assert "masks: 0 human, 0 exact (synthetic / COCO), 12 model-made (unverified proposals" in result.output
    summary = json.loads((all_model / "runs" / "cli" / "summary.json").read_text())
    assert summary["mask_sources"]["model"] == 12 and summary["n_images"] == 12
    result = runner.invoke(main, [*args, "--allow-model-masks", "--run-name", "cli-json", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output[result.output.index("{"):])
    assert data["mask_sources"]["model"] == 12 and data["config"]["settings"]["allow_model_masks"] is True


# ----------------------------------------------------------------------------- fidelity's mask reference
def _fidelity_settings(**overrides):
    from curate.stages.fidelity import FidelitySettings

    fast = {"methods": ("mask", "random"), "sparsities": "0.5", "samples": 1, "finetune_epochs": 0,
            "families": ("fid",), "seeds": 1, "batch_size": 12, "score": "probability", "device": "cpu"}
    return FidelitySettings(**{**fast, **overrides})


def test_fidelity_mask_reference_follows_the_rule_and_the_report_states_the_counts(world, clip) -> None:
    from curate.metrics.fidelity import FidelityError
    from curate.report import build_report
    from curate.runs.fidelity import FidelityRun
    from curate.stages.explain import ExplainSettings, explain
    from curate.stages.fidelity import compute_fidelity, fidelity

    root, _ = world
    run = fidelity(root, clip, _fidelity_settings(), run_name="fid")
    assert run.config.images == 8 and dict(run.config.skipped) == {"model_mask": 3, "rejected_mask": 1}
    assert run.config.masks == USED_BY_DEFAULT
    loaded = FidelityRun.load(run.run_dir)
    assert loaded.config == run.config and loaded.mask_line == MaskCounts.from_dict(USED_BY_DEFAULT).line()

    allowed = compute_fidelity(root, clip, _fidelity_settings(allow_model_masks=True), write_cache=False)
    assert allowed.config.images == 11 and allowed.config.masks == USED_WITH_FLAG
    assert dict(allowed.config.skipped) == {"rejected_mask": 1}
    # no mask method: no mask value is read, every masked sample is scored and no counts are claimed
    unmasked = compute_fidelity(root, clip, _fidelity_settings(methods=("random",)), write_cache=False)
    assert unmasked.config.images == 12 and unmasked.config.masks is None and unmasked.mask_line == ""

    explain(root, clip, ExplainSettings(label_space="present", device="cpu"), run_name="sss")
    md = build_report(root).read_text()
    line = MaskCounts.from_dict(USED_BY_DEFAULT).line()
    assert f"`sss`: {line}" in md  # the saliency section, per run
    assert f"The mask reference's {line}." in md and "model_mask 3" in md  # the fidelity section

    with pytest.raises(FidelityError) as error:
        compute_fidelity(_only_proposals(root), clip, _fidelity_settings(), write_cache=False)
    _refusal(str(error.value))


def _only_proposals(root: Path) -> Path:
    """``root`` with its trusted masks removed: what is left is 3 proposals and 1 bad mask."""
    ds = Dataset.open(root)
    trusted = [r["sample_id"] for r in ds.rows() if r["mask_status"] in ("synthetic", "ok")]
    ds.set_masks(dict.fromkeys(trusted), clear_status=True, actor="test")
    return root


# ----------------------------------------------------------------------------- the audit's clarity check
def test_clarity_uses_trusted_masks_and_counts_the_rest(world) -> None:
    from curate.models import load_model
    from curate.runs import AuditRun
    from curate.stages.audit import AuditSettings, audit

    root, marked = world
    vit = load_model("curate-tiny-vit", None, device="cpu", seed=0)
    run = audit(root, vit, AuditSettings(checks=("clarity",), device="cpu", tag=False), run_name="a")
    clarity = run.summary("clarity")
    assert clarity.detail["sources"] == {"mask": 8, "saliency proxy": 4, "none": 0}
    assert clarity.detail["masks"] == USED_BY_DEFAULT
    assert AuditRun.load(run.run_dir).clarity_masks.as_dict() == USED_BY_DEFAULT
    note = next(n for n in clarity.notes if "may not use" in n)
    assert "3 unverified model masks" in note and "1 mask marked bad" in note and "--allow-model-masks" in note
    share = run.column("clarity", "object_share")
    model = [run.sample_ids.index(s) for s in marked["model"]]
    assert np.isfinite(share[model]).all()  # the proxy, not the proposal

    no_proxy = audit(root, vit, AuditSettings(checks=("clarity",), device="cpu", tag=False, saliency_proxy=False),
                     run_name="b")
    failed = no_proxy.summary("clarity")
    assert failed.failed == 4 and failed.failed_reasons == {"unverified model mask and no saliency proxy": 3,
                                                             "mask marked bad and no saliency proxy": 1}

    allowed = audit(root, vit, AuditSettings(checks=("clarity",), device="cpu", tag=False, allow_model_masks=True),
                    run_name="c")
    assert allowed.summary("clarity").detail["sources"]["mask"] == 11
    assert allowed.clarity_masks.as_dict() == USED_WITH_FLAG and allowed.settings["allow_model_masks"] is True
    mask_share = allowed.column("clarity", "object_share")[model]
    exact = [float((Dataset.open(root).load_mask(s) > 0).mean()) for s in marked["model"]]
    assert mask_share == pytest.approx(exact)  # now the proposals' own shares

    # a folder of proposals only: clarity falls back to its saliency proxy; without the proxy
    # there is nothing to score it with, and the refusal says so
    only = _only_proposals(root)
    proxied = audit(only, vit, AuditSettings(checks=("clarity",), device="cpu", tag=False), run_name="d")
    assert proxied.summary("clarity").detail["sources"].get("mask", 0) == 0
    with pytest.raises(ValueError) as error:
        audit(only, vit, AuditSettings(checks=("clarity",), device="cpu", saliency_proxy=False), run_name="e")
    _refusal(str(error.value))
    assert not (root / "runs" / "e").exists()


# ----------------------------------------------------------------------------- composites
def test_composites_leave_out_proposals_and_keep_their_source_when_allowed(world, tmp_path) -> None:
    from curate.collect.composite import CompositeSpec, compose

    root, marked = world
    colors = ("red", "green", "blue")
    report = compose(root, tmp_path / "c", CompositeSpec(p=1.0, colors=colors, seed=1))
    rows = Dataset.open(tmp_path / "c").rows()
    assert len(rows) == 8 and report.info["masks"] == USED_BY_DEFAULT
    assert {r["mask_status"] for r in rows} == {"exact"}
    objects = {json.loads(r["extra"])["object_sample_id"] for r in rows}
    assert objects.isdisjoint(marked["model"] + marked["bad"])
    provenance = Dataset.open(tmp_path / "c").provenance["collect.composite"]
    assert provenance["masks"] == USED_BY_DEFAULT

    allowed = compose(root, tmp_path / "m", CompositeSpec(p=1.0, colors=colors, seed=1, allow_model_masks=True))
    assert allowed.info["masks"] == USED_WITH_FLAG
    ds = Dataset.open(tmp_path / "m")
    by_object = {json.loads(r["extra"])["object_sample_id"]: r for r in ds.rows()}
    assert len(by_object) == 11 and marked["bad"][0] not in by_object
    for sid, row in by_object.items():
        extra = json.loads(row["extra"])
        if sid in marked["model"]:  # a model's mask never becomes "exact" by being pasted
            assert row["mask_status"] == PROPOSAL and extra["object_mask_source"] == "model"
            assert extra["object_mask_status"] == PROPOSAL
        else:
            assert row["mask_status"] == "exact" and extra["object_mask_source"] in ("exact", "human")
    # and the composite folder's own consumers apply the same rule to them
    from curate.masks.sources import trusted_rows

    assert trusted_rows(ds.rows())[1].skipped_model == 3

    with pytest.raises(ValueError) as error:
        compose(_only_proposals(root), tmp_path / "x", CompositeSpec(colors=colors))
    _refusal(str(error.value))


def test_cli_collect_composite_with_model_masks(all_model, tmp_path) -> None:
    runner = CliRunner(env={"COLUMNS": "200"})
    args = ["collect", "composite", str(tmp_path / "c"), "--objects", str(all_model), "--colors", "red,green,blue"]
    result = runner.invoke(main, args)
    assert result.exit_code == 1 and "--allow-model-masks" in result.output and "curate review" in result.output
    result = runner.invoke(main, [*args, "--allow-model-masks"])
    assert result.exit_code == 0, result.output
    assert "objects' masks: 0 human, 0 exact (synthetic / COCO), 12 model-made" in result.output
    assert "keep mask_status model:<id>" in result.output
    assert {r["mask_status"] for r in Dataset.open(tmp_path / "c").rows()} == {PROPOSAL}
