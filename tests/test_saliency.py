"""curate.saliency: maps equal pytorch-grad-cam's, targets, layers, token layouts, masks, bad input.

Fast and offline: a timm CNN (``test_resnet``, 160 px) and tiny CLIPs (ViT and ModifiedResNet)
with random seeded weights, CPU only.
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

import curate.saliency.base as saliency_base
from curate.models import load_model
from curate.saliency import (
    Explainer,
    Predicted,
    SaliencyError,
    TargetIgnoredWarning,
    TopK,
    TrueClass,
    UnknownLayerError,
    default_layer,
    explain_with_backoff,
    mask_transform_for,
    parse_target,
    saliency_maps,
)
from curate.saliency.layers import detect_layout, token_geometry
from curate.saliency.masks import check_mask

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"), pytest.mark.usefixtures("one_thread")]


@pytest.fixture(scope="module")
def cnn():
    return load_model("timm:test_resnet", seed=0)


@pytest.fixture(scope="module")
def vit():
    return load_model("curate-tiny-vit", seed=0)


@pytest.fixture(scope="module")
def clip_rn():
    return load_model("curate-tiny-rn", seed=0)


def _classifier(model, n: int = 5, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, model.embed_dim, generator=g)


def _images(model, n: int = 3, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, *model.image_size, generator=g)


class _ZeroShot(torch.nn.Module):
    """A CLIP as a module returning 100 * cos(f, w_c), for pytorch-grad-cam."""

    def __init__(self, clip, weights):
        super().__init__()
        self.clip = clip
        self.weights = F.normalize(weights, dim=-1)

    def forward(self, x):
        return 100 * F.normalize(self.clip.encode_image(x), dim=-1) @ self.weights.t()


def _minmax(maps) -> np.ndarray:
    a = np.asarray(maps, dtype=np.float64)
    flat = a.reshape(a.shape[0], -1)
    flat = flat - flat.min(axis=1, keepdims=True)
    return (flat / (flat.max(axis=1, keepdims=True) + 1e-12)).reshape(a.shape)


def _reference(model, explainer, x, labels, cam_class, weights=None, **kwargs) -> np.ndarray:
    from pytorch_grad_cam.utils.model_targets import ClassifierOutputTarget

    net = _ZeroShot(model.module, weights) if model.kind == "clip" else model.module
    reshape = None
    if explainer.layer_name and explainer.layer_name.endswith(("ln_1", "norm1")):
        prefix, grid = token_geometry(explainer.tower)

        def reshape(t):
            return t[:, prefix:, :].reshape(t.size(0), grid[0], grid[1], t.size(2)).permute(0, 3, 1, 2)

    layers = [explainer.layer] if explainer.layer is not None else []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cam = cam_class(model=net, target_layers=layers, reshape_transform=reshape, **kwargs)
        out = cam(input_tensor=x, targets=[ClassifierOutputTarget(int(c)) for c in labels])
        cam.activations_and_grads.release()
    return out


# ----------------------------------------------------------------------------- equivalence
REQUIRED = ["gradcam", "gradcam++", "layercam"]


@pytest.mark.parametrize("method", REQUIRED + ["xgradcam"])
@pytest.mark.parametrize("which", ["cnn", "vit"])
def test_gradient_cams_equal_pytorch_grad_cam(method, which, cnn, vit) -> None:
    from pytorch_grad_cam import GradCAM, GradCAMPlusPlus, LayerCAM, XGradCAM

    cls = {"gradcam": GradCAM, "gradcam++": GradCAMPlusPlus, "layercam": LayerCAM, "xgradcam": XGradCAM}[method]
    model = cnn if which == "cnn" else vit
    weights = _classifier(model) if model.kind == "clip" else None
    x = _images(model)
    labels = [1, 3, 4]
    explainer = Explainer(model, method, classifier=weights)
    ours = explainer.explain(x, "true", labels).maps[:, 0].numpy()
    ref = _reference(model, explainer, x, labels, cls, weights)
    assert ours.shape == ref.shape == (3, *model.image_size)
    assert np.ptp(ref) > 0.5  # a real map, not an all-zero one
    np.testing.assert_allclose(_minmax(ours), _minmax(ref), atol=1e-4)


@pytest.mark.parametrize("method", ["eigencam", "scorecam", "ablationcam", "fullgrad", "eigengradcam"])
def test_other_cams_equal_pytorch_grad_cam_on_the_vit(method, vit) -> None:
    from pytorch_grad_cam import AblationCAM, EigenCAM, FullGrad, ScoreCAM
    from pytorch_grad_cam.ablation_layer import AblationLayerVit
    from pytorch_grad_cam.utils.image import scale_cam_image
    from pytorch_grad_cam.utils.svd_on_activations import (
        get_2d_projection_with_sign_correction,
    )

    weights = _classifier(vit)
    x = _images(vit, 2, seed=1)
    labels = [0, 2]
    explainer = Explainer(vit, method, classifier=weights)
    ours = explainer.explain(x, "true", labels).maps[:, 0].numpy()
    if method in ("eigencam", "eigengradcam"):
        # curate uses the sign-corrected projection (documented); compare with pytorch-grad-cam's helper
        from pytorch_grad_cam import GradCAM

        cam_cls = EigenCAM if method == "eigencam" else GradCAM
        from pytorch_grad_cam.utils.model_targets import ClassifierOutputTarget

        net = _ZeroShot(vit.module, weights)
        prefix, grid = token_geometry(explainer.tower)
        cam = cam_cls(model=net, target_layers=[explainer.layer], reshape_transform=lambda t: t[:, prefix:, :].reshape(
            t.size(0), grid[0], grid[1], t.size(2)).permute(0, 3, 1, 2))
        cam(input_tensor=x, targets=[ClassifierOutputTarget(c) for c in labels])
        acts = cam.activations_and_grads.activations[0].numpy()
        product = acts if method == "eigencam" else acts * cam.activations_and_grads.gradients[0].numpy()
        cam.activations_and_grads.release()
        projection = np.maximum(get_2d_projection_with_sign_correction(product), 0)
        ref = scale_cam_image(scale_cam_image(projection, tuple(vit.image_size[::-1])))
    else:
        cls = {"scorecam": ScoreCAM, "ablationcam": AblationCAM, "fullgrad": FullGrad}[method]
        kwargs = {"ablation_layer": AblationLayerVit()} if method == "ablationcam" else {}
        ref = _reference(vit, explainer, x, labels, cls, weights, **kwargs)
    assert np.ptp(ref) > 0.5
    np.testing.assert_allclose(_minmax(ours), _minmax(ref), atol=1e-4)


@pytest.mark.parametrize("method", ["fullgrad", "ablationcam"])
def test_other_cams_equal_pytorch_grad_cam_on_the_cnn(method, clip_rn) -> None:
    from pytorch_grad_cam import AblationCAM, FullGrad

    g = torch.Generator().manual_seed(1)  # random weights whose ablation maps are not flat
    weights = torch.randn(5, clip_rn.embed_dim, generator=g)
    x = torch.randn(2, 3, *clip_rn.image_size, generator=g)
    explainer = Explainer(clip_rn, method, classifier=weights)
    result = explainer.explain(x, "predicted")
    ours = result.maps[:, 0].numpy()
    labels = result.targets[:, 0].tolist()
    ref = _reference(clip_rn, explainer, x, labels, {"fullgrad": FullGrad, "ablationcam": AblationCAM}[method],
                     weights)
    assert np.ptp(ref) > 0.5
    np.testing.assert_allclose(_minmax(ours), _minmax(ref), atol=1e-4)


# ----------------------------------------------------------------------------- targets
def test_clip_target_is_the_zero_shot_logit(vit) -> None:
    weights = _classifier(vit, 7)
    x = _images(vit, 4)
    result = Explainer(vit, "gradcam", classifier=weights).explain(x, "topk:2")
    with torch.no_grad():
        logits = 100 * F.normalize(vit.module.encode_image(x), dim=-1) @ F.normalize(weights, dim=-1).t()
    np.testing.assert_allclose(result.logits.numpy(), logits.numpy(), atol=1e-4)
    np.testing.assert_allclose(result.target_scores.numpy(), logits.topk(2, dim=1).values.numpy(), atol=1e-4)
    assert result.maps.shape == (4, 2, *vit.image_size)


def test_topk_maps_equal_one_target_at_a_time(cnn) -> None:
    x = _images(cnn, 2, seed=5)
    explainer = Explainer(cnn, "gradcam++")
    several = explainer.explain(x, "topk:3")
    assert several.maps.shape == (2, 3, *cnn.image_size)
    for k in range(3):
        single = explainer.explain(x, "true", several.target_classes[:, k])
        torch.testing.assert_close(single.maps[:, 0], several.maps[:, k], atol=1e-5, rtol=0)
    predicted = explainer.explain(x, "predicted")
    torch.testing.assert_close(predicted.maps[:, 0], several.maps[:, 0], atol=1e-5, rtol=0)
    assert predicted.predicted_classes.tolist() == several.target_classes[:, 0].tolist()


def test_columns_restrict_a_classifier_to_a_label_subset(cnn) -> None:
    x = _images(cnn, 2)
    columns = [7, 100, 296]
    result = Explainer(cnn, "gradcam", columns=columns).explain(x, "predicted")
    assert result.logits.shape == (2, 3)
    assert set(result.predicted_classes.tolist()) <= set(columns)
    with pytest.raises(SaliencyError, match="not among the scored classes"):
        Explainer(cnn, "gradcam", columns=columns).explain(x, "true", [7, 5])


def test_targets_are_small_objects_parsed_once() -> None:
    assert parse_target("topk:5") == TopK(5) and parse_target("true") == TrueClass()
    assert parse_target(" Predicted ") == Predicted() and parse_target(TopK(2)) == TopK(2)
    assert [str(t) for t in (TrueClass(), Predicted(), TopK(3))] == ["true", "predicted", "topk:3"]
    assert [t.kind for t in (TrueClass(), Predicted(), TopK(3))] == ["true", "predicted", "topk"]
    assert [t.k for t in (TrueClass(), Predicted(), TopK(3))] == [1, 1, 3]
    assert TrueClass().needs_labels and not Predicted().needs_labels and not TopK(2).needs_labels
    for bad in ("topk:0", "top", "best", "topk:x"):
        with pytest.raises(SaliencyError, match="true"):
            parse_target(bad)
    with pytest.raises(SaliencyError, match="K >= 1"):
        TopK(0)
    logits = torch.tensor([[0.1, 3.0, 2.0], [5.0, 1.0, 4.0]])
    assert TrueClass().select(logits, torch.tensor([2, 0])).tolist() == [[2], [0]]
    assert Predicted().select(logits, None).tolist() == [[1], [0]]
    assert TopK(2).select(logits, None).tolist() == [[1, 2], [0, 2]]
    with pytest.raises(SaliencyError, match="labels"):
        TrueClass().select(logits, None)


def test_target_objects_and_strings_give_the_same_maps(cnn) -> None:
    x = _images(cnn, 2)
    explainer = Explainer(cnn, "gradcam")
    torch.testing.assert_close(explainer.explain(x, TopK(2)).maps, explainer.explain(x, "topk:2").maps)


def test_method_registry_is_torch_free_and_the_one_list() -> None:
    import subprocess
    import sys

    code = ("import sys; from curate.saliency.registry import method_names, method_info; "
            "assert method_info('Grad-CAM').name == 'gradcam'; print(len(method_names())); "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["11", "False"]
    from curate.saliency import METHODS, method_names
    from curate.saliency.methods import method_info  # the path curate fidelity imports
    from curate.saliency.registry import FAMILIES, LAYER_RULES

    assert method_names() == tuple(METHODS) and method_info("gar").name == "grad-rollout"
    for info in METHODS.values():
        assert info.family in FAMILIES and info.default_layer_rule in LAYER_RULES and info.paper
        assert info.uses_layer == (info.default_layer_rule == "cam")
    from curate.cli.explain import explain_cmd

    choices = next(p for p in explain_cmd.params if p.name == "method").type.choices
    assert tuple(choices) == method_names()


def test_clip_needs_a_text_classifier(vit) -> None:
    with pytest.raises(SaliencyError, match="zero-shot"):
        Explainer(vit, "gradcam")


# ----------------------------------------------------------------------------- layers and layouts
def test_default_layers_are_documented_choices(cnn, vit, clip_rn) -> None:
    assert default_layer(vit) == "visual.transformer.resblocks.1.ln_1"
    assert default_layer(cnn) == "layer4"  # 5 x 5 at 160 px
    assert default_layer(clip_rn) == "visual.layer2"  # layer4 is 1 x 1, layer3 2 x 2 at 32 px
    timm_vit = load_model("timm:test_vit", seed=0)
    assert default_layer(timm_vit).endswith(".norm1") and default_layer(timm_vit).startswith("blocks.")


def test_layer_names_relative_negative_and_unknown(clip_rn, vit) -> None:
    w = _classifier(clip_rn)
    assert Explainer(clip_rn, "gradcam", layer="layer3", classifier=w).layer_name == "visual.layer3"
    assert Explainer(vit, "gradcam", layer="transformer.resblocks.-1.ln_1",
                     classifier=_classifier(vit)).layer_name == "visual.transformer.resblocks.1.ln_1"
    with pytest.raises(UnknownLayerError) as info:
        Explainer(clip_rn, "gradcam", layer="visual.layer9", classifier=w)
    message = str(info.value)
    assert "layer9" in message and "visual.layer4" in message and info.value.candidates
    with pytest.raises(SaliencyError, match="drop layer"):
        Explainer(clip_rn, "fullgrad", layer="layer3", classifier=w)


def test_token_layout_is_detected_not_assumed(vit) -> None:
    """The same CLIP run sequence-first (older open_clip) gives the same maps."""
    import copy

    weights = _classifier(vit)
    x = _images(vit, 3)
    first = Explainer(vit, "gradcam", classifier=weights).explain(x, "true", [0, 1, 2]).maps
    seq_first = copy.deepcopy(vit)
    transformer = seq_first.module.visual.transformer
    transformer.batch_first = False
    for block in transformer.resblocks:
        block.attn.batch_first = False
    explainer = Explainer(seq_first, "gradcam", classifier=weights)
    captured = {}

    def record(module, inputs, output) -> None:
        captured.setdefault("shape", tuple(output.shape))

    handle = explainer.layer.register_forward_hook(record)
    second = explainer.explain(x, "true", [0, 1, 2]).maps
    handle.remove()
    assert captured["shape"] == (17, 3, 64)  # (L, N, D): really sequence first
    torch.testing.assert_close(first, second, atol=1e-5, rtol=0)
    # the layout reader itself, including the N == L ambiguity resolved by the model's attribute
    layout = detect_layout(seq_first, explainer.layer_name, torch.zeros(17, 17, 64), 17)
    assert layout.kind == "tokens_lnd"
    layout = detect_layout(vit, explainer.layer_name, torch.zeros(17, 17, 64), 17)
    assert layout.kind == "tokens_nld"


def test_unused_layer_warns_and_gives_nan_reason(vit) -> None:
    # the last block's output reaches the embedding only through the class token
    saliency_base._warned.clear()
    explainer = Explainer(vit, "gradcam", layer="visual.transformer.resblocks.1", classifier=_classifier(vit))
    result = explainer.explain(_images(vit, 2), "true", [0, 1])
    assert bool(result.flat.all())  # constant maps: no localisation


# ----------------------------------------------------------------------------- rollout
@pytest.mark.parametrize("name", ["curate-tiny-vit", "timm:test_vit"])
@pytest.mark.parametrize("method", ["rollout", "grad-rollout"])
def test_rollouts_on_open_clip_and_timm_vits(name, method) -> None:
    from curate.saliency.attention import record_attention

    model = load_model(name, seed=0)
    weights = _classifier(model) if model.kind == "clip" else None
    x = _images(model, 2)
    tower = model.module.visual if model.kind == "clip" else model.module
    with torch.no_grad():
        plain = model.encode_image(x)
        with record_attention(tower) as probs:
            recorded = model.encode_image(x)
    torch.testing.assert_close(plain, recorded, atol=1e-5, rtol=1e-4)  # explicit attention = the module's
    assert len(probs) == len(tower.transformer.resblocks if model.kind == "clip" else tower.blocks)
    assert torch.allclose(probs[0].sum(-1), torch.ones(1), atol=1e-5)
    saliency_base._warned.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = Explainer(model, method, classifier=weights).explain(x, "topk:2")
    ignored = [w for w in caught if issubclass(w.category, TargetIgnoredWarning)]
    assert bool(ignored) == (method == "rollout")
    assert result.maps.shape == (2, 2, *model.image_size) and result.layer is None
    assert float(result.maps.max()) == pytest.approx(1.0, abs=1e-5)
    if method == "rollout":
        torch.testing.assert_close(result.maps[:, 0], result.maps[:, 1])


def test_rollout_needs_a_vit(clip_rn) -> None:
    with pytest.raises(SaliencyError, match="ViT"):
        Explainer(clip_rn, "rollout", classifier=_classifier(clip_rn))


def test_rollout_of_identity_attention_is_uniform() -> None:
    from curate.saliency.attention import rollout

    probs = [torch.eye(5).expand(1, 2, 5, 5)] * 3
    out = rollout(probs, prefix=1, grid=(2, 2))
    assert out.shape == (1, 2, 2) and torch.all(out == 0)  # the class token attends only to itself


# ----------------------------------------------------------------------------- bad input
def test_eigencam_warns_once_that_it_ignores_the_target(cnn) -> None:
    saliency_base._warned.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = Explainer(cnn, "eigencam")
        Explainer(cnn, "eigencam")
    assert sum(issubclass(w.category, TargetIgnoredWarning) for w in caught) == 1
    result = first.explain(_images(cnn, 2), "topk:3")
    torch.testing.assert_close(result.maps[:, 0], result.maps[:, 2])


def test_unknown_method_lists_the_methods(cnn) -> None:
    with pytest.raises(SaliencyError, match="gradcam, gradcam\\+\\+"):
        Explainer(cnn, "saliencymagic")
    assert Explainer(cnn, "Grad-CAM").method == "gradcam"


def test_nan_and_inf_maps_are_reported_not_hidden(cnn) -> None:
    from curate.metrics.spuriousity import spuriousity_scores

    x = _images(cnn, 2)
    x[0, :, :4, :4] = float("nan")
    result = Explainer(cnn, "gradcam").explain(x, "true", [1, 2])
    mask = torch.zeros(2, *cnn.image_size, dtype=torch.bool)
    mask[:, 40:80, 40:80] = True
    scores = spuriousity_scores(result.maps[:, 0], mask)
    assert scores.reason_names()[0] == "nonfinite_map" and scores.reason_names()[1] is None


def test_out_of_memory_halves_the_batch_and_continues(cnn, monkeypatch, caplog) -> None:
    explainer = Explainer(cnn, "gradcam")
    real = Explainer.explain
    sizes = []

    def flaky(self, images, target="true", labels=None):
        sizes.append(images.shape[0])
        if images.shape[0] > 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(self, images, target, labels)

    monkeypatch.setattr(Explainer, "explain", flaky)
    x = _images(cnn, 5)
    with caplog.at_level("WARNING"):
        result, size = explain_with_backoff(explainer, x, "true", [0, 1, 2, 3, 4], batch_size=8)
    assert result.maps.shape[0] == 5 and size == 2
    assert sizes == [5, 2, 2, 1] and "out of memory" in caplog.text
    monkeypatch.setattr(Explainer, "explain", lambda self, *a, **k: (_ for _ in ()).throw(
        RuntimeError("CUDA error: out of memory")))
    with pytest.raises(RuntimeError, match="out of memory"):
        explain_with_backoff(explainer, x[:1], "true", [0], batch_size=1)
    monkeypatch.setattr(Explainer, "explain", lambda self, *a, **k: (_ for _ in ()).throw(ValueError("other")))
    with pytest.raises(ValueError, match="other"):  # other errors are not swallowed
        explain_with_backoff(explainer, x, "true", [0] * 5, batch_size=8)


def test_parameters_are_left_as_they_were(vit) -> None:
    for p in vit.module.parameters():
        p.grad = None  # pytorch-grad-cam (the reference above) leaves parameter gradients behind
    flags = [p.requires_grad for p in vit.module.parameters()]
    Explainer(vit, "gradcam", classifier=_classifier(vit)).explain(_images(vit, 1), "true", [0])
    assert [p.requires_grad for p in vit.module.parameters()] == flags
    assert all(p.grad is None for p in vit.module.parameters())


def test_saliency_maps_takes_pil_images(vit) -> None:
    images = [Image.new("RGB", (40, 30), (200, 10, 10)), Image.new("RGB", (30, 40), (10, 200, 10))]
    result = saliency_maps(vit, images, method="layercam", classifier=_classifier(vit), target="predicted")
    assert result.maps.shape == (2, 1, *vit.image_size)


# ----------------------------------------------------------------------------- masks
@pytest.mark.parametrize("name", ["curate-tiny-vit", "timm:test_resnet"])
@pytest.mark.parametrize("size", [(90, 60), (60, 90), (32, 32)])
def test_masks_go_through_the_image_geometry(name, size) -> None:
    """A mask drawn as the image itself stays pixel-aligned after the model's resize and crop."""
    model = load_model(name, seed=0)
    w, h = size
    rng = np.random.default_rng(0)
    mask = np.zeros((h, w), np.uint8)
    mask[h // 4: h // 2, w // 5: w // 2 + 7] = 1
    mask[rng.integers(0, h, 10), rng.integers(0, w, 10)] = 1
    image = Image.fromarray(np.repeat((mask * 255)[..., None], 3, axis=2))
    x = model.preprocess(image)
    # undo the normalisation: the image's own pixels, thresholded at half
    mean = torch.as_tensor(model.preprocess.transforms[-1].mean).view(3, 1, 1)
    std = torch.as_tensor(model.preprocess.transforms[-1].std).view(3, 1, 1)
    from_image = ((x * std + mean)[0] >= 0.5)
    carried = mask_transform_for(model.preprocess)(mask)
    assert carried.shape == from_image.shape == tuple(model.image_size)
    assert carried.dtype == torch.bool
    assert torch.equal(carried, from_image)


def test_mask_checks() -> None:
    ids = np.zeros((20, 30), np.uint8)
    ids[2:5, 3:9] = 4
    binary, problem, instance = check_mask(ids, (30, 20))
    assert problem is None and instance and binary.sum() == 18
    small = np.zeros((10, 15), np.uint8)
    small[1:3, 1:4] = 1
    binary, problem, _ = check_mask(small, (30, 20))
    assert problem == "mask_resized" and binary.shape == (20, 30) and binary.sum() == 4 * 6
    _, problem, _ = check_mask(np.zeros((20, 20)), (30, 20))
    assert problem == "mask_size_mismatch"
    _, problem, _ = check_mask(np.zeros((2, 20, 30)), (30, 20))
    assert problem == "mask_not_2d"


def test_unknown_transform_is_refused() -> None:
    class Warp:
        def __call__(self, img):
            return img

    from torchvision import transforms

    with pytest.raises(SaliencyError, match="Warp"):
        mask_transform_for(transforms.Compose([Warp(), transforms.ToTensor()]))
