"""The ``cam:<clip spec>`` mask backend (curate.masks.backends.cam): spec syntax, identity,
masks at each photo's own size, the geometry back to the photo, constant maps, bad specs.

The fast tests use a 12-image synthetic world and tiny CLIPs with random seeded weights saved
as curate weights files. The slow test uses the demo's two trained reference CLIPs (the
``demo_dir`` fixture, about 2 minutes, or ``$CURATE_DEMO_WORKDIR``) and measures the masks'
IoU against the world's exact masks and against trivial baselines.
"""
from __future__ import annotations

import logging
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from curate.collect.synthetic import DEFAULT_CLASSES, WorldSpec, collect_synthetic
from curate.masks.backends import cam
from curate.masks.backends.base import MaskSpecError, load_mask_model, mask_model_identity
from curate.models import WeightsNotFoundError, load_model
from curate.saliency import Explainer, mask_transform_for
from curate.saliency.inputs import row_extra
from curate.store import Dataset

logger = logging.getLogger(__name__)
pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"), pytest.mark.usefixtures("one_thread")]


# ----------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def weights(tmp_path_factory) -> dict[str, Path]:
    """Tiny CLIPs with seeded random weights, saved as curate weights files (arch in the metadata)."""
    folder = tmp_path_factory.mktemp("weights")
    out = {}
    for arch in ("curate-tiny-rn", "curate-tiny-vit"):
        model = load_model(arch, seed=0)
        path = folder / f"{arch}.pt"
        torch.save({"state_dict": model.module.state_dict(), "curate": {"arch": arch}}, path)
        out[arch] = path
    return out


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> tuple[list[Image.Image], list[str], list[np.ndarray]]:
    """12 photos of a synthetic world (48 px), 4 of them resized to non-square sizes, with
    their prompts ("a photo of a {class}.") and exact masks at the photo's size."""
    root = tmp_path_factory.mktemp("worlds") / "world"
    collect_synthetic(root, WorldSpec(classes=DEFAULT_CLASSES[:3], per_class=4, image_size=48, seed=5, p=0.9))
    ds = Dataset.open(root)
    images, prompts, masks = [], [], []
    sizes = {1: (72, 48), 4: (40, 64), 7: (97, 31), 10: (20, 20)}
    for i, row in enumerate(ds.rows()):
        image = ds.load_image(row).convert("RGB")
        mask = ds.load_mask(row) != 0
        if i in sizes:
            image = image.resize(sizes[i], Image.BICUBIC)
            mask = np.asarray(Image.fromarray(mask.astype(np.uint8) * 255).resize(sizes[i], Image.NEAREST)) >= 128
        images.append(image)
        prompts.append(f"a photo of a {row['class_name']}.")
        masks.append(mask)
    return images, prompts, masks


@pytest.fixture(scope="module")
def proposer(weights) -> cam.CamProposer:
    return cam.load(f"cam:{weights['curate-tiny-rn']}", device="cpu", batch_size=5)


# ----------------------------------------------------------------------------- the spec
def test_spec_forms(weights, tmp_path) -> None:
    path = str(weights["curate-tiny-rn"])
    assert cam.parse_cam_spec(f"cam:{path}") == cam.CamSpec("auto", path, "layercam", None, f"cam:{path}")
    spec = cam.parse_cam_spec(f"cam:curate-tiny-rn@{path}#grad-cam@visual.layer3")
    assert (spec.name, spec.pretrained, spec.method, spec.layer) == ("curate-tiny-rn", path, "gradcam", "visual.layer3")
    spec = cam.parse_cam_spec("cam:ViT-B-32-quickgelu@laion400m_e31#gradcam++")
    assert (spec.name, spec.pretrained, spec.method, spec.layer) == ("ViT-B-32-quickgelu", "laion400m_e31", "gradcam++",
                                                                     None)
    spec = cam.parse_cam_spec("cam:CLIP-LAION400M-ViT-B/32")  # a zoo name (with '/') is not a path
    assert (spec.name, spec.pretrained) == ("CLIP-LAION400M-ViT-B/32", None)
    assert cam.identity("cam:CLIP-LAION400M-ViT-B/32")[0] == "cam-layercam:open_clip:ViT-B-32-quickgelu:laion400m_e31"
    assert cam.parse_cam_spec("cam:missing/ref.pt").name == "auto"  # looks like a file: loading will say
    odd = tmp_path / "run@2" / "ref.pt"  # an existing file is a path, '@' and all
    odd.parent.mkdir()
    odd.write_bytes(weights["curate-tiny-rn"].read_bytes())
    assert cam.parse_cam_spec(f"cam:{odd}").pretrained == str(odd)


@pytest.mark.parametrize(("text", "words"), [
    ("cam:ViT-B-32", "neither a weights file nor a zoo name"),
    ("cam:ViT-B-32@none", "no weights"),
    ("cam:ref.pt#nosuchcam", "unknown saliency method"),
    ("cam:ref.pt#eigencam", "ignores the target"),
    ("cam:ref.pt#rollout", "ignores the target"),
    ("cam:ref.pt#fullgrad@visual.layer4", "reads no single layer"),
    ("cam:timm:resnet50@a1_in1k", "not a CLIP"),
    ("cam:#layercam", "names no CLIP"),
])
def test_bad_specs_say_what_is_wrong(text, words) -> None:
    with pytest.raises(MaskSpecError, match=words):
        cam.parse_cam_spec(text)


def test_missing_weights_file_is_a_clear_error(tmp_path) -> None:
    missing = tmp_path / "nowhere" / "ref.pt"
    for call in (lambda: cam.load(f"cam:{missing}", device="cpu"), lambda: cam.identity(f"cam:{missing}"),
                 lambda: load_mask_model(f"cam:curate-tiny-rn@{missing}", device="cpu")):
        with pytest.raises(WeightsNotFoundError, match="does not exist") as caught:
            call()
        assert str(missing) in str(caught.value) and "mask model 'cam:" in str(caught.value)


@pytest.mark.parametrize("form", ["{path}", "curate-tiny-rn@{path}", "{path}#gradcam", "{path}#xgradcam@visual.layer3",
                                  "curate-tiny-vit@{vit}#grad-rollout"])
def test_identity_equals_the_loaded_proposer(weights, form) -> None:
    text = "cam:" + form.format(path=weights["curate-tiny-rn"], vit=weights["curate-tiny-vit"])
    model_id, info = mask_model_identity(text)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loaded = load_mask_model(text, device="cpu")
    assert isinstance(loaded, cam.CamProposer)
    assert (model_id, info) == (loaded.model_id, loaded.info)
    assert model_id == f"cam-{loaded.method}{'@' + loaded.layer if loaded.layer else ''}:{loaded.clip.model_id}"
    assert ":file-" in model_id and info["backend"] == "cam" and info["spec"] == text


# ----------------------------------------------------------------------------- proposals
def test_masks_are_bool_at_each_photos_size_and_scores_in_range(proposer, world) -> None:
    images, prompts, _ = world
    out = proposer.propose(images, prompts, threshold=0.5)
    assert len(out) == len(images)
    for image, proposal in zip(images, out):
        assert proposal.reason is None and proposal.mask is not None
        assert proposal.mask.dtype == bool and proposal.mask.shape == (image.height, image.width)
        assert proposal.mask.any() and not proposal.mask.all()
        assert 0.5 <= proposal.score <= 1.0


def test_determinism_and_batch_size_do_not_change_masks(proposer, world, weights) -> None:
    images, prompts, _ = world
    first = proposer.propose(images, prompts, 0.4)
    again = proposer.propose(images, prompts, 0.4)
    other = cam.load(f"cam:{weights['curate-tiny-rn']}", device="cpu", batch_size=3).propose(images, prompts, 0.4)
    for a, b, c in zip(first, again, other):
        assert np.array_equal(a.mask, b.mask) and a.score == b.score
        assert (a.mask == c.mask).mean() > 0.99 and abs(a.score - c.score) < 1e-4


def test_a_higher_threshold_gives_a_smaller_mask(proposer, world) -> None:
    images, prompts, _ = world
    low, high, top = (proposer.propose(images[:4], prompts[:4], t) for t in (0.2, 0.7, 1.0))
    for a, b, c in zip(low, high, top):
        assert (b.mask <= a.mask).all() and b.mask.sum() < a.mask.sum() and b.score >= a.score
        assert c.mask.sum() >= 1 and c.score == pytest.approx(1.0)  # the peak is always in the mask
    assert all(p.mask.all() for p in proposer.propose(images[:2], prompts[:2], 0.0))  # m >= 0 everywhere
    with pytest.raises(ValueError, match="threshold"):
        proposer.propose(images[:1], prompts[:1], 1.5)
    with pytest.raises(ValueError, match="one prompt per image"):
        proposer.propose(images[:2], prompts[:1], 0.5)
    assert proposer.propose([], [], 0.5) == []


def test_the_target_is_the_prompts_zero_shot_logit(proposer, world) -> None:
    """The maps are curate.saliency's LayerCAM of 100 * cos(f(x), g(prompt)), one prompt per image."""
    images, prompts, _ = world
    clip = proposer.clip
    maps, flat = proposer.maps(images[:3], prompts[:3])
    for j in range(3):
        explainer = Explainer(clip, "layercam", classifier=clip.encode_text([prompts[j]]))
        ref = explainer.explain(clip.preprocess_images([images[j]]), "true", [0])
        assert torch.allclose(maps[j], ref.maps[0, 0], atol=1e-5) and bool(flat[j]) == bool(ref.flat[0, 0])
    other, _ = proposer.maps(images[:1], ["a photo of a tarantula."])
    assert not torch.allclose(other[0], maps[0])  # another prompt, another map


def test_a_constant_map_gives_no_mask_with_its_reason(weights, world) -> None:
    """GradCAM at the last ViT block's output: it reaches the embedding only through the class
    token, so the gradient on the patch tokens is 0 and the map is constant."""
    images, prompts, _ = world
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        blind = cam.load(f"cam:{weights['curate-tiny-vit']}#gradcam@visual.transformer.resblocks.1", device="cpu")
        out = blind.propose(images[:3], prompts[:3], 0.5)
    assert all(p.mask is None and p.score is None and p.reason == cam.CONSTANT_REASON for p in out)


def test_a_non_finite_map_gives_no_mask(proposer, world, monkeypatch) -> None:
    images, prompts, _ = world

    def nan_maps(self, batch, texts):
        return torch.full((len(batch), 32, 32), float("nan")), torch.zeros(len(batch), dtype=torch.bool)

    monkeypatch.setattr(cam.CamProposer, "maps", nan_maps)
    assert [p.reason for p in proposer.propose(images[:2], prompts[:2], 0.5)] == [cam.NONFINITE_REASON] * 2


def test_a_classifier_is_refused(weights) -> None:
    with pytest.raises(MaskSpecError, match="not a CLIP"):
        cam.CamProposer(load_model("timm:test_resnet", seed=0))


# ----------------------------------------------------------------------------- geometry
@pytest.mark.parametrize("size", [(640, 480), (480, 640), (32, 32), (20, 20), (97, 31)])
def test_footprint_is_the_centred_crop_of_the_shortest_side_resize(proposer, size) -> None:
    """open_clip's eval transform: Resize(shortest side -> 32) then CenterCrop(32) (torchvision's
    rounding): the input shows the photo's centred crop, X = (u + left) * W / W_resized."""
    width, height = size
    new_w, new_h = (32, int(32 * height / width)) if width <= height else (int(32 * width / height), 32)
    left, top = int(round((new_w - 32) / 2.0)), int(round((new_h - 32) / 2.0))
    fp = proposer.footprint(size)
    assert fp.input_size == (32, 32)
    assert fp.scale == pytest.approx((width / new_w, height / new_h), rel=1e-3)
    assert fp.offset == pytest.approx((left * width / new_w, top * height / new_h), abs=0.02)


@pytest.mark.parametrize("size", [(90, 60), (60, 90)])
def test_footprint_of_open_clips_other_resize_modes(size) -> None:
    """``squash`` stretches the photo onto the input; ``longest`` letterboxes it (padding): the
    whole photo is on the input, so no photo pixel is outside it."""
    from open_clip.transform import PreprocessCfg, image_transform_v2

    width, height = size
    squash = cam.input_footprint(image_transform_v2(PreprocessCfg(size=(32, 32), resize_mode="squash"), False), size)
    assert squash.scale == pytest.approx((width / 32, height / 32), rel=1e-3)
    assert squash.offset == pytest.approx((0.0, 0.0), abs=0.02)
    longest = cam.input_footprint(image_transform_v2(PreprocessCfg(size=(32, 32), resize_mode="longest"), False), size)
    short = int(32 * min(width, height) / max(width, height))
    pad = (32 - short) // 2
    along = max(width, height) / 32
    across = min(width, height) / short
    expected = (along, across) if width > height else (across, along)
    assert longest.scale == pytest.approx(expected, rel=1e-3)
    assert min(longest.offset) == pytest.approx(-pad * across, abs=0.02) and max(longest.offset) == pytest.approx(0, abs=0.02)
    assert bool((cam.map_to_image(torch.ones(32, 32), longest, size) > 0.999).all())


@pytest.mark.parametrize("size", [(90, 60), (60, 90), (48, 48)])
def test_map_to_image_inverts_the_mask_transform(proposer, size) -> None:
    """A mask carried to the model input (curate.saliency.masks) and back lands where it was,
    inside the crop, and nothing lands outside it."""
    width, height = size
    rng = np.random.default_rng(0)
    mask = np.zeros((height, width), bool)
    y0, x0 = rng.integers(0, height // 3), rng.integers(width // 4, width // 2)
    mask[y0:y0 + height // 2, x0:x0 + width // 3] = True
    on_input = mask_transform_for(proposer.clip.preprocess)(mask.astype(np.uint8)).float()
    fp = proposer.footprint(size)
    back = cam.map_to_image(on_input, fp, size).numpy() >= 0.5
    xs = (np.arange(width) + 0.5 - fp.offset[0]) / fp.scale[0]
    ys = (np.arange(height) + 0.5 - fp.offset[1]) / fp.scale[1]
    crop = ((ys >= 0) & (ys <= 32))[:, None] & ((xs >= 0) & (xs <= 32))[None, :]
    assert not back[~crop].any()
    inside = mask & crop
    iou = (back & inside).sum() / (back | inside).sum()
    assert iou > 0.85, iou


# ----------------------------------------------------------------------------- the demo CLIPs
def _iou(a: np.ndarray, b: np.ndarray) -> float:
    union = (a | b).sum()
    return float((a & b).sum() / union) if union else 1.0


def _box(shape: tuple[int, int]) -> np.ndarray:
    """The centred box of half the width and half the height."""
    h, w = shape
    box = np.zeros(shape, bool)
    box[h // 4: h - h // 4, w // 4: w - w // 4] = True
    return box


@pytest.mark.slow
def test_cam_masks_of_the_demo_clips(demo_dir) -> None:
    """Mean IoU of the cam masks (threshold 0.5) of the two trained reference CLIPs against the
    evaluation world's exact masks (1200 photos, 48 px), next to two prompt-blind baselines.

    Measured (issue note): LayerCAM p=0.9 0.379, uncorrelated 0.416 (paired difference 0.037,
    t 9.7); GradCAM p=0.9 0.136 (33 constant maps); the whole photo 0.221; the centred
    half-width, half-height box 0.500. The box wins on this world because its objects are drawn
    near the centre at about a fifth of the photo, so it is logged, not asserted against: cam is
    a floor for the segmentation backends, above the whole photo, not a segmenter. The shortcut
    CLIP's masks are worse (it looks at the background too).
    """
    ds = Dataset.open(demo_dir / "world-eval")
    rows = ds.rows()
    images = [ds.load_image(r).convert("RGB") for r in rows]
    truth = [ds.load_mask(r) != 0 for r in rows]
    prompts = [f"a photo of a {r['class_name']}." for r in rows]
    aligned = np.array([bool(row_extra(r).get("aligned")) for r in rows])
    whole = float(np.mean([_iou(np.ones_like(t), t) for t in truth]))
    box = float(np.mean([_iou(_box(t.shape), t) for t in truth]))

    def ious(world: str, method: str) -> tuple[np.ndarray, int]:
        proposer = cam.load(f"cam:{demo_dir / 'models' / f'reference-{world}.pt'}#{method}", device="cpu",
                            batch_size=128)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = proposer.propose(images, prompts, threshold=0.5)
        values = np.array([_iou(p.mask, t) if p.mask is not None else 0.0 for p, t in zip(out, truth)])
        none = sum(p.mask is None for p in out)
        logger.warning("cam %s %s: mean IoU %.3f (aligned %.3f, conflicting %.3f), %d without a mask; whole photo "
                       "%.3f, centred box %.3f", world, method, values.mean(), values[aligned].mean(),
                       values[~aligned].mean(), none, whole, box)
        return values, none

    shortcut, none_shortcut = ious("p0.9", "layercam")
    plain, none_plain = ious("uncorrelated", "layercam")
    gradcam, _ = ious("p0.9", "gradcam")
    assert none_shortcut == none_plain == 0  # LayerCAM: no constant map
    assert shortcut.mean() > whole + 0.1 and plain.mean() > whole + 0.1
    assert shortcut.mean() > gradcam.mean() + 0.1  # why LayerCAM is the default
    diff = plain - shortcut
    t = diff.mean() / (diff.std(ddof=1) / np.sqrt(len(diff)))
    assert diff.mean() > 0.015 and t > 5.0, (diff.mean(), t)
