"""The ``salient:`` mask backend on tiny ONNX models exported here from torch.

The tiny models take and give what the real families do (U2-Net: ``(N, 3, 320, 320)`` in, seven
``(N, 1, 320, 320)`` sigmoid maps out, free batch; BiRefNet: ``(1, 3, 1024, 1024)`` in, logits
out, batch fixed at 1) and are loaded through ONNX Runtime exactly as a downloaded file is. A
probe model whose output is its input's first channel lets the test recompute the whole formula
by hand; the CLI runs as a user types it, then ``--measure``.
"""
from __future__ import annotations

import json
import re
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from curate.collect.synthetic import DEFAULT_CLASSES, WorldSpec, collect_synthetic
from curate.masks.backends import MaskSpecError, load_mask_model, mask_model_identity, salient
from curate.masks.backends.salient import PRESETS, output_map, parse_salient_spec, proposal_from_map, with_options
from curate.masks.sources import mask_counts, mask_source
from curate.models.base import ModelError, WeightsNotFoundError
from curate.runs import MaskRun
from curate.store import Dataset

BIREFNET = "BiRefNet-general-epoch_244.onnx"  # rembg's release file name: the preset comes from it


class TinySalient(torch.nn.Module):
    """Two convolutions; ``outputs`` maps of ``(N, 1, H, W)``, sigmoid (U2-Net, IS-Net) or logits (BiRefNet)."""

    def __init__(self, outputs: int = 1, sigmoid: bool = True, channels: int = 3) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.c1, self.c2 = torch.nn.Conv2d(channels, 4, 3, padding=1), torch.nn.Conv2d(4, 1, 3, padding=1)
        self.outputs, self.sigmoid = outputs, sigmoid

    def forward(self, x: torch.Tensor):
        y = self.c2(torch.relu(self.c1(x)))
        y = torch.sigmoid(y) if self.sigmoid else y
        return tuple(y for _ in range(self.outputs)) if self.outputs > 1 else y


class Probe(torch.nn.Module):
    """The normalised input's first channel: the output the test can recompute by hand."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[:, :1] * 1.0


def export(path: Path, module: torch.nn.Module, size: tuple[int, int], *, batch: int | None = None,
           channels: int = 3) -> Path:
    """``module`` as an ONNX file with input ``(batch or free, channels, *size)``."""
    example = torch.zeros(batch or 1, channels, *size)
    with torch.no_grad():
        n_out = len(module(example)) if isinstance(module(example), tuple) else 1
    outputs = [f"d{i}" for i in range(n_out)]
    dynamic = None if batch else {name: {0: "batch"} for name in ["input.1", *outputs]}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module.eval(), example, str(path), dynamo=False, input_names=["input.1"],
                          output_names=outputs, dynamic_axes=dynamic)
    return path


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("salient-models")
    return {"u2net": export(root / "u2net.onnx", TinySalient(outputs=7), (320, 320)),
            "u2net-fixed2": export(root / "u2netp.onnx", TinySalient(outputs=7), (320, 320), batch=2),
            "birefnet": export(root / BIREFNET, TinySalient(sigmoid=False), (1024, 1024), batch=1),
            "probe": export(root / "probe.onnx", Probe(), (40, 48)),
            "gray": export(root / "gray.onnx", TinySalient(channels=1), (320, 320), channels=1)}


@pytest.fixture(scope="module")
def images() -> list[Image.Image]:
    """Five photos of different sizes: noise with a bright rectangle (the 'object')."""
    rng = np.random.default_rng(4)
    out = []
    for w, h in [(64, 48), (50, 70), (33, 33), (120, 40), (48, 64)]:
        a = rng.integers(0, 120, (h, w, 3), dtype=np.uint8)
        a[h // 4:3 * h // 4, w // 3:2 * w // 3] = rng.integers(180, 256, 3, dtype=np.uint8)
        out.append(Image.fromarray(a))
    return out


def test_specs_presets_and_options() -> None:
    # rembg's sessions (rembg/sessions/u2net.py, dis_general_use.py, dis_anime.py, birefnet_general.py)
    assert PRESETS["u2net"].text() == "size=320x320,mean=0.485/0.456/0.406,std=0.229/0.224/0.225,output=minmax"
    assert PRESETS["isnet"].text() == "size=1024x1024,mean=0.5/0.5/0.5,std=1/1/1,output=minmax"
    assert PRESETS["isnet-anime"].text() == "size=1024x1024,mean=0.485/0.456/0.406,std=1/1/1,output=minmax"
    assert PRESETS["birefnet"].text() == \
        "size=1024x1024,mean=0.485/0.456/0.406,std=0.229/0.224/0.225,output=sigmoid-minmax"
    picked = {name: parse_salient_spec(f"salient:/m/{name}").preset
              for name in ("u2net.onnx", "u2netp.onnx", "silueta.onnx", "isnet-general-use.onnx", "isnet-anime.onnx",
                           "birefnet-general-lite.onnx", BIREFNET)}
    assert picked == {"u2net.onnx": "u2net", "u2netp.onnx": "u2net", "silueta.onnx": "u2net",
                      "isnet-general-use.onnx": "isnet", "isnet-anime.onnx": "isnet-anime",
                      "birefnet-general-lite.onnx": "birefnet", BIREFNET: "birefnet"}
    over = parse_salient_spec("salient:/m/u2net.onnx#birefnet,size=512")
    assert over.preset == "birefnet" and over.prep.size == (512, 512) and over.prep.output == "sigmoid-minmax"
    assert over.family.startswith("custom-") and parse_salient_spec("salient:/m/x.onnx#isnet").family == "isnet"
    custom = with_options("salient:/m/x.onnx", input_size="64x96", mean="0.5,0.5,0.5", std="1,1,1",
                          postprocess="sigmoid")
    assert custom == "salient:/m/x.onnx#size=64x96,mean=0.5/0.5/0.5,std=1/1/1,output=sigmoid"
    assert parse_salient_spec(custom).prep == salient.Preprocessing((64, 96), (0.5,) * 3, (1.0,) * 3, "sigmoid")
    for bad, words in [("salient:/m/model.onnx", "--preset u2net|isnet|isnet-anime|birefnet"),
                       ("salient:/m/x.onnx#u2nett", "unknown preset"), ("salient:/m/x.onnx#u2net,sise=3", "sise"),
                       ("salient:/m/x.onnx#u2net,mean=1/2", "three numbers"),
                       ("salient:/m/x.onnx#u2net,output=softmax", "softmax"), ("salient:/m/x.onnx#u2net,isnet", "two")]:
        with pytest.raises(MaskSpecError, match=re.escape(words)):
            parse_salient_spec(bad)


def test_output_map_and_threshold_follow_the_formula() -> None:
    raw = np.array([[0.0, 1.0], [2.0, 4.0]])
    prob, reason = output_map(raw, "minmax")
    assert reason is None and np.allclose(prob, [[0, 0.25], [0.5, 1.0]])
    p = proposal_from_map(prob, (2, 2), 0.5)  # the photo's size: no resampling
    assert p.mask.tolist() == [[False, False], [True, True]] and p.score == pytest.approx(0.75) and p.reason is None
    logits = np.array([[-2.0, 0.0], [1.0, 3.0]])
    s = 1 / (1 + np.exp(-logits))
    assert np.allclose(output_map(logits, "sigmoid")[0], s)
    assert np.allclose(output_map(logits, "sigmoid-minmax")[0], (s - s.min()) / (s.max() - s.min()))
    assert np.allclose(output_map(np.array([[-0.5, 0.3], [1.5, 0.9]]), "none")[0], [[0, 0.3], [1, 0.9]])
    low = proposal_from_map(output_map(np.full((3, 3), -5.0), "sigmoid")[0], (3, 3), 0.5)
    assert low.mask is None and low.reason == "nothing above threshold 0.50"
    assert low.score == pytest.approx(1 / (1 + np.exp(5)))
    assert output_map(np.full((3, 3), 0.7), "minmax") == (None, salient.CONSTANT_REASON)
    assert output_map(np.array([[0.1, np.nan]]), "sigmoid") == (None, salient.NONFINITE_REASON)
    big = proposal_from_map(prob, (40, 30), 0.5)  # to a 40 x 30 photo: (H, W) = (30, 40); the 1.0 corner is kept
    assert big.mask.shape == (30, 40) and big.mask[-5:, -5:].all() and not big.mask[0].any()


def test_a_probe_model_gives_the_hand_computed_mask(models, images) -> None:
    """Every step of the module docstring recomputed with numpy and PIL on a non-square input."""
    spec = f"salient:{models['probe']}#size=40x48,mean=0.3/0.5/0.5,std=0.25/1/1,output=minmax"
    proposer = load_mask_model(spec, device="cpu")
    image = images[1]  # 50 x 70
    x = np.asarray(image.resize((48, 40), Image.Resampling.LANCZOS), dtype=np.float64)
    x = x / x.max()
    channel0 = (x[..., 0] - 0.3) / 0.25
    m = (channel0 - channel0.min()) / (channel0.max() - channel0.min())
    back = np.asarray(Image.fromarray(m.astype(np.float32)).resize((50, 70), Image.Resampling.LANCZOS))
    expected = np.clip(back, 0, 1) >= 0.4
    (p,) = proposer.propose([image], ["ignored"], 0.4)
    assert p.mask.shape == (70, 50) and np.array_equal(p.mask, expected)
    assert p.score == pytest.approx(float(np.clip(back, 0, 1)[expected].mean()), abs=1e-5)
    assert proposer.info["preset"] is None and proposer.model_id.startswith("salient-custom-")


def _same(a, b) -> None:
    """The same proposals from differently batched runs. Not bit for bit (issue 48): a batched forward pass
    rounds differently per batch shape and CPU (~1e-7), so a pixel whose probability sits that close to
    the threshold may flip; a batching bug (mixed-up or padded-into photos) changes far more than 0.1%."""
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.reason == y.reason and x.score == pytest.approx(y.score, abs=1e-6)
        assert (x.mask is None) == (y.mask is None) and (x.mask is None or (x.mask != y.mask).mean() <= 1e-3)


def test_batches_equal_one_by_one_and_fixed_batches_are_honoured(models, images) -> None:
    prompts = ["a"] * len(images)
    one = load_mask_model(f"salient:{models['u2net']}", device="cpu", batch_size=1).propose(images, prompts, 0.5)
    three = load_mask_model(f"salient:{models['u2net']}", device="cpu", batch_size=3).propose(images, prompts, 0.5)
    _same(one, three)
    # the same weights exported with the batch fixed at 2: groups of 2, the fifth photo padded
    fixed = load_mask_model(f"salient:{models['u2net-fixed2']}", device="cpu", batch_size=5)
    assert fixed.plan.batch == 2
    _same(one, fixed.propose(images, prompts, 0.5))
    for p, image in zip(one, images):  # minmax: the peak is 1, every photo has a mask
        assert p.mask.shape == (image.height, image.width) and p.mask.any() and 0.5 <= p.score <= 1.0
    birefnet = load_mask_model(f"salient:{models['birefnet']}", device="cpu", batch_size=4)
    assert birefnet.plan.batch == 1 and birefnet.model_id.startswith("salient-birefnet:BiRefNet-general-epoch_244@")
    (found,) = birefnet.propose(images[1:2], prompts[1:2], 0.5)  # one photo: 1024 px inputs cost 0.5 s each here
    assert found.mask is not None and found.mask.shape == (70, 50)


def test_identity_without_loading_is_the_loaded_models(models) -> None:
    spec = f"salient:{models['u2net']}"
    proposer = load_mask_model(spec, device="cpu")
    assert mask_model_identity(spec) == (proposer.model_id, proposer.info)
    assert re.fullmatch(r"salient-u2net:u2net@[0-9a-f]{12}", proposer.model_id), proposer.model_id
    info = json.loads(json.dumps(proposer.info))
    assert info["preset"] == "u2net" and info["input_size"] == [320, 320] and info["output"] == "minmax"
    assert proposer.providers == ["CPUExecutionProvider"]


def test_a_file_that_does_not_fit_is_refused_in_one_line(models, tmp_path, monkeypatch) -> None:
    def refused(spec: str, error: type, *words: str, **kwargs) -> None:
        with pytest.raises(error) as caught:
            load_mask_model(spec, device=kwargs.pop("device", "cpu"), **kwargs)
        message = str(caught.value)
        assert "\n" not in message and all(w in message for w in words), message

    refused(f"salient:{models['birefnet']}#u2net", ModelError, "1x3x1024x1024", "preset u2net feeds 320x320",
            "--preset isnet or --preset isnet-anime or --preset birefnet")
    renamed = shutil.copy(models["birefnet"], tmp_path / "u2net.onnx")  # a file whose name picks the wrong preset
    refused(f"salient:{renamed}", ModelError, "(picked by the file's name)")
    refused(f"salient:{models['gray']}#u2net", ModelError, "1 channels")
    refused(f"salient:{models['u2net']}#size=256", ModelError, "--input-size feeds 256x256")
    (tmp_path / "notes.onnx").write_text("not a model")
    refused(f"salient:{tmp_path / 'notes.onnx'}#u2net", ModelError, "does not load in ONNX Runtime")
    refused(f"salient:{tmp_path / 'absent.onnx'}#u2net", WeightsNotFoundError, "does not exist")
    refused(f"salient:{models['u2net']}", ValueError, "--precision fp16", precision="fp16")
    monkeypatch.setattr("onnxruntime.get_available_providers", lambda: ["CPUExecutionProvider"])
    refused(f"salient:{models['u2net']}", ModelError, "salient-gpu", device="cuda")


def test_cli_proposes_with_a_salient_model_and_measures(models, tmp_path, monkeypatch) -> None:
    """As a user types it: ``~`` in the path, ``--preset``, then ``--measure``; the proposals are
    model masks (never over an exact one, left out of mask-based numbers until verified)."""
    from click.testing import CliRunner

    from curate.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    ds = collect_synthetic(tmp_path / "world", WorldSpec(classes=DEFAULT_CLASSES[:3], per_class=6, image_size=32,
                                                          seed=5))
    unmasked = ds.sample_ids()[::2]
    ds.set_masks({sid: None for sid in unmasked}, clear_status=True, actor="test")
    (tmp_path / "models").mkdir()
    for key in ("u2net", "birefnet"):
        shutil.copy(models[key], tmp_path / "models")
    runner = CliRunner()
    result = runner.invoke(main, ["propose-masks", "world", "--model", "salient:~/models/u2net.onnx", "--preset",
                                  "u2net", "--run-name", "sal", "--device", "cpu", "--batch-size", "4"])
    assert result.exit_code == 0, result.output
    record = MaskRun.load(tmp_path / "world" / "runs" / "sal")
    assert record.model_id.startswith("salient-u2net:u2net@")
    assert record.config["model"]["backend"] == "salient" and record.config["settings"]["prompt"] == "{}"
    assert record.config["model"]["spec"] == f"salient:{tmp_path}/models/u2net.onnx#u2net"
    c = record.counts
    assert (c["in_scope"], c["found"], c["applied"], c["kept_trusted"]) == (18, 18, len(unmasked), 18 - len(unmasked))
    ds = Dataset.open(tmp_path / "world")
    rows = {r["sample_id"]: r for r in ds.rows()}
    assert all(rows[sid]["mask_status"] == f"model:{record.model_id}" and mask_source(rows[sid]) == "model"
               for sid in unmasked)
    assert all(mask_source(r) == "exact" for sid, r in rows.items() if sid not in unmasked)
    counts = mask_counts(list(rows.values()))  # the trust rule: unverified proposals are left out of numbers
    assert counts.skipped_model == len(unmasked) and counts.used["model"] == 0
    measured = runner.invoke(main, ["propose-masks", "world", "--measure", "--json"])
    assert measured.exit_code == 0, measured.output
    data = json.loads(measured.output)
    assert data["measurement"]["truth"]["exact"] == 18 - len(unmasked) and data["review"]["applied"] == len(unmasked)
    wrong = runner.invoke(main, ["propose-masks", "world", "--model", f"salient:models/{BIREFNET}", "--preset", "u2net"])
    assert wrong.exit_code == 1 and wrong.output.count("\n") == 1 and "error:" in wrong.output, wrong.output
    assert "feeds 320x320" in wrong.output
    misplaced = runner.invoke(main, ["propose-masks", "world", "--model", "clipseg:models", "--preset", "u2net"])
    assert misplaced.exit_code == 2 and "options of salient: models" in misplaced.output, misplaced.output
    assert not (tmp_path / "world" / "runs" / "sal-2").exists()


def test_a_file_without_preset_or_rembg_name_names_the_presets_that_fit(models, tmp_path) -> None:
    """No --preset and a name rembg does not use: the refusal reads the file's input shape and
    names the presets that feed it (all of them when the size is free), in one line."""
    def refusal(path: Path) -> str:
        with pytest.raises(MaskSpecError) as caught:
            parse_salient_spec(f"salient:{path}")
        assert "\n" not in str(caught.value)
        return str(caught.value)

    big = refusal(Path(shutil.copy(models["birefnet"], tmp_path / "my-export.onnx")))
    assert "its input is 1x3x1024x1024, which presets isnet, isnet-anime, birefnet feed" in big, big
    assert "--preset isnet|isnet-anime|birefnet, or all of --input-size" in big and "docs/masks.md" in big, big
    small = refusal(Path(shutil.copy(models["u2net"], tmp_path / "segmenter.onnx")))
    assert "its input is ?x3x320x320, which preset u2net feeds" in small and "--preset u2net, or" in small, small
    odd = refusal(Path(shutil.copy(models["probe"], tmp_path / "probe-copy.onnx")))
    assert "which no preset feeds" in odd and "give all of --input-size, --mean, --std and --postprocess" in odd, odd
    assert salient.presets_for_shape(["batch", 3, "height", "width"]) == list(PRESETS)
    assert salient.presets_for_shape([1, 1, 320, 320]) == []


def test_salient_options_help_reads_as_sentences() -> None:
    from click.testing import CliRunner

    from curate.cli import main

    text = CliRunner(env={"COLUMNS": "200"}).invoke(main, ["propose-masks", "--help"]).output
    assert "salient: only:" not in text and text.count("Salient models only.") == 5, text
