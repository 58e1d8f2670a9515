"""``cam:<clip spec>``: the dataset's own CLIP's saliency map, thresholded (docs/design.md#masks).

A baseline that needs no extra weights: the CLIP being benchmarked says where in the photo it
sees the prompt's object, through curate's own saliency engine (:mod:`curate.saliency`), and
the map above a threshold is the mask. It is a floor for the segmentation backends to beat,
not a segmenter: a CAM is coarse (one cell per 32 input pixels of a ViT-B/32) and shows what
the model *uses*, which for a shortcut model includes the background.

Spec
----
``cam:<clip>[#<method>[@<layer>]]``, where ``<clip>`` is what curate's model loader takes:

==============================================  ==============================================
``<clip>``                                      the CLIP
==============================================  ==============================================
``PATH``                                        a curate weights file (``curate
                                                train-reference`` writes one; its metadata
                                                names the architecture): ``cam:ref.pt``
``NAME@PRETRAINED``                             an open_clip architecture or zoo name with a
                                                pretrained tag or a weights file:
                                                ``cam:ViT-B-32-quickgelu@laion400m_e31``,
                                                ``cam:curate-tiny-clip-rn@/models/ref.pt``
``NAME``                                        a zoo name, with the zoo's weights:
                                                ``cam:CLIP-LAION400M-ViT-B/32``
==============================================  ==============================================

How ``<clip>`` is read, in order: an existing file is a ``PATH`` (so a path may hold ``@``);
text with ``@`` is ``NAME@PRETRAINED`` (split at the first ``@``); a zoo name is a ``NAME``;
text that looks like a path (a separator, a leading ``~`` or ``.``, a weights suffix) is a
``PATH`` (missing: :class:`~curate.models.WeightsNotFoundError`, nothing is downloaded).
An architecture without weights is refused: random weights have no saliency worth a mask.
ImageNet classifiers (``timm:``) are refused too: the target is a text prompt's logit.

``#<method>``: a saliency method of :mod:`curate.saliency.registry` whose map depends on the
target (default ``layercam``; ``eigencam`` and ``rollout`` ignore the prompt and are refused);
``@<layer>``: the layer a CAM reads (default :func:`curate.saliency.default_layer`). The spec is
split at its last ``#``, so ``<clip>`` itself must not contain one.
Examples: ``cam:ref.pt#gradcam``, ``cam:ViT-B-32-quickgelu@laion400m_e31#gradcam++@visual.transformer.resblocks.10.ln_1``.

Why LayerCAM by default: in the demo's fidelity table (docs/results.md, F-Fidelity, papers/002)
LayerCAM's maps are faithful on both tiny reference CLIPs (F-Fid+ 1.71 / 5.68 against a random
map's 0.70 / 2.53) and come out constant on no image, while GradCAM's are not above random on
the uncorrelated CLIP and are constant on a few images (docs/results.md, the demo's saliency table); a mask can
only be as good as the map it thresholds. Measured on the demo's evaluation world (1200 photos,
threshold 0.5, mean IoU with the exact masks; ``tests/test_masks_cam.py``): LayerCAM 0.379
(p = 0.9 CLIP) and 0.416 (uncorrelated), GradCAM 0.136 (p = 0.9; 33 constant maps), against
0.221 for the whole photo and 0.500 for a centred half-size box (the world draws its objects
near the centre): a floor for the segmentation backends, not a segmenter. The tiny CLIPs'
maps hardly depend on which class the prompt names (another class's prompt: 0.354 and 0.423).

Formula
-------
For an image ``x`` (original size ``W x H``) with prompt ``t`` (``prompts[i]``, verbatim):

1. target ``s(x) = 100 * cos(f(x), g(t))``: the CLIP's zero-shot logit of the prompt
   (``f``: image tower, ``g``: text tower; :class:`curate.saliency.targets.ScoreHead` with the
   prompt's embedding as a one-row classifier, the ``true`` target);
2. ``M``: the method's map of ``s`` on the model input ``h x w``, normalised as curate's
   saliency engine does it (ReLU, min-max, bilinear to the input, min-max; in [0, 1]);
3. back to the photo: the input covers an axis-aligned box of the photo (for open_clip's
   shortest-side resize and centre crop, the centred crop). :func:`input_footprint` finds the
   affine map ``X = a * u + b`` per axis from input coordinates ``u`` to photo coordinates
   ``X`` (pixel edges on integers) by pushing coordinate ramps through the geometric steps of
   the model's own preprocessing (those :func:`curate.saliency.mask_transform_for` keeps);
   each photo pixel centre samples ``M`` bilinearly at ``u = (X + 0.5 - b) / a``, and is 0
   where ``u`` falls outside ``[0, w]`` (outside the crop);
4. ``m = M_photo / max(M_photo)`` (so the peak is 1);
5. ``mask = m >= threshold``; ``score = mean(m[mask])``, in ``[threshold, 1]``: how much of the
   mask is near the map's peak (1: a flat top; near ``threshold``: a ramp cut mid-way). It is
   a shape statistic of the map, not a calibrated probability that the mask is right.

No mask (``Proposal(None, None, reason)``): ``"saliency map is constant"`` when the raw map was
constant (e.g. a layer the target does not reach; the engine's ``flat`` flag) or is zero on the
photo; ``"saliency map is not finite"`` when it holds NaN/inf. A mask is never empty: the
peak pixel is always in it.

Identity: ``model_id = "cam-<method>[@<layer>]:<the CLIP's model_id>"`` (e.g.
``cam-layercam:open_clip:curate-tiny-clip-rn:file-0123456789ab``); :func:`identity` computes
it from the spec without building the CLIP (a weights file is hashed and its metadata read).
"""
from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from curate.masks.backends.base import MaskModelSpec, MaskSpecError, Proposal, parse_mask_spec

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from PIL import Image

    from curate.models.base import LoadedModel

__all__ = ["DEFAULT_METHOD", "FOOTPRINT_MEMO", "CONSTANT_REASON", "NONFINITE_REASON", "CamSpec", "CamProposer", "InputFootprint",
           "parse_cam_spec", "cam_model_id", "input_footprint", "map_to_image", "load", "identity"]

logger = logging.getLogger(__name__)

#: The default saliency method (module docstring: why).
DEFAULT_METHOD = "layercam"
#: ``Proposal.reason`` of a map that carries no localisation.
CONSTANT_REASON = "saliency map is constant"
#: ``Proposal.reason`` of a map with NaN or inf values.
NONFINITE_REASON = "saliency map is not finite"
#: What the target is, in words (recorded in ``info``).
TARGET = "100 * cos(image embedding, prompt text embedding): the CLIP's zero-shot logit of prompts[i]"
#: The score, in words (recorded in ``info``).
SCORE = "mean of the max-normalised map inside the mask, in [threshold, 1]"
#: Photo sizes whose :class:`InputFootprint` a proposer keeps.
FOOTPRINT_MEMO = 4096
_AUTO = ("", "auto")


# ----------------------------------------------------------------------------- the spec
@dataclass(frozen=True)
class CamSpec:
    """A parsed ``cam:`` spec (module docstring): the CLIP to load, the method and the layer.

    Attributes:
        name: the model name for :func:`curate.models.load_model` (``"auto"``: a weights file
            whose metadata names the architecture).
        pretrained: a pretrained tag or a weights file; None for a zoo name (its own tag).
        method: the canonical saliency method name.
        layer: the CAM layer as given, or None for the method's default.
        text: the spec it was read from.
    """

    name: str
    pretrained: str | None
    method: str = DEFAULT_METHOD
    layer: str | None = None
    text: str = ""

    def clip_dict(self) -> dict[str, str | None]:
        """``{"name", "pretrained"}``, JSON-ready (what ``info["clip"]`` records)."""
        return {"name": self.name, "pretrained": self.pretrained}


def _method(text: str, spec_text: str) -> tuple[str, str | None]:
    """``<method>[@<layer>]`` -> (canonical method, layer or None), refusing prompt-blind methods."""
    from curate.saliency.registry import canonical_method, method_info, method_names

    method, _, layer = text.partition("@")
    name = canonical_method(method)
    if name is None:
        raise MaskSpecError(f"mask model {spec_text!r}: unknown saliency method {method!r}; methods: "
                            f"{', '.join(m for m in method_names() if method_info(m).target_dependent)}")
    info = method_info(name)
    if not info.target_dependent:
        raise MaskSpecError(f"mask model {spec_text!r}: {name} ignores the target, so its map would not depend on "
                            f"the prompt; use a target-dependent method (default {DEFAULT_METHOD})")
    layer = layer.strip() or None
    if layer is not None and not info.uses_layer:
        raise MaskSpecError(f"mask model {spec_text!r}: {name} reads no single layer ({info.default_layer}); "
                            "drop '@<layer>'")
    return name, layer


def parse_cam_spec(spec: str | MaskModelSpec) -> CamSpec:
    """Read ``cam:<clip>[#<method>[@<layer>]]`` (or a parsed :class:`MaskModelSpec` of backend
    ``cam``) into a :class:`CamSpec`, without loading anything.

    Raises :class:`MaskSpecError` for an unknown or prompt-blind method, a classifier, or an
    architecture named without weights.
    """
    from curate.models.base import ModelNotFoundError
    from curate.models.loader import parse_model_name
    from curate.models.spec import parse_pretrained
    from curate.models.weights import looks_like_path
    from curate.models.zoo import find_zoo_entry

    parsed = parse_mask_spec(spec)
    if parsed.backend != "cam":
        raise MaskSpecError(f"mask model {parsed.text!r} is not a cam: spec")
    text = parsed.text or f"cam:{parsed.parts.get('clip', '')}"
    clip = parsed.parts.get("clip", "").strip()
    method, layer = DEFAULT_METHOD, None
    if "#" in clip:
        clip, _, method_text = clip.rpartition("#")
        clip = clip.strip()
        method, layer = _method(method_text.strip(), text)
    if not clip:
        raise MaskSpecError(f"mask model {text!r} names no CLIP; expected cam:PATH, cam:NAME@PRETRAINED or cam:NAME")

    if Path(clip).expanduser().is_file():
        name, pretrained = "auto", clip
    elif "@" in clip:
        name, _, tag = clip.partition("@")
        name, pretrained = name.strip() or "auto", parse_pretrained(tag.strip())
        if pretrained is None:
            raise MaskSpecError(f"mask model {text!r}: {name!r} has no weights after '@' (random weights have no "
                                "saliency worth a mask)")
    elif find_zoo_entry(clip) is not None:
        name, pretrained = clip, None
    elif looks_like_path(clip):
        name, pretrained = "auto", clip
    else:
        raise MaskSpecError(
            f"mask model {text!r}: {clip!r} is neither a weights file nor a zoo name; name the weights as "
            f"cam:{clip}@<tag or file> (random weights have no saliency worth a mask)")
    if name.lower() in _AUTO:
        name = "auto"
        if not looks_like_path(pretrained or "") and not Path(pretrained or "").expanduser().is_file():
            raise MaskSpecError(f"mask model {text!r}: 'auto' takes the architecture from a weights file; "
                                f"{pretrained!r} is not one")
    else:
        try:
            backend = parse_model_name(name)[0]
        except ModelNotFoundError as error:
            raise MaskSpecError(f"mask model {text!r}: {error}") from error
        if backend != "open_clip":
            raise MaskSpecError(f"mask model {text!r}: {name!r} is not a CLIP; cam's target is a text prompt's "
                                "zero-shot logit, which needs a text tower")
    return CamSpec(name, pretrained, method, layer, text)


def cam_model_id(clip_model_id: str, method: str = DEFAULT_METHOD, layer: str | None = None) -> str:
    """``cam-<method>[@<layer>]:<clip model id>``: the proposer's ``model_id``."""
    return f"cam-{method}{'@' + layer if layer else ''}:{clip_model_id}"


def _clip_model_id(cam: CamSpec) -> str:
    """The CLIP's ``model_id`` as :func:`curate.models.load_model` would give it, without building
    the model: ``open_clip:<arch>:<weights key>`` (a weights file is hashed and, for ``auto``,
    its metadata read for the architecture)."""
    from curate.models.base import ModelNotFoundError
    from curate.models.clip import weights_key
    from curate.models.loader import as_pretrained, parse_model_name
    from curate.models.weights import Checkpoint, checkpoint_arch

    weights = as_pretrained(cam.pretrained)  # a missing file raises WeightsNotFoundError here
    name = cam.name
    if name == "auto":
        if not isinstance(weights, Checkpoint):
            raise MaskSpecError(f"mask model {cam.text!r}: 'auto' needs a weights file")
        name = checkpoint_arch(weights) or ""
        if not name:
            raise ModelNotFoundError(f"{weights.path} carries no curate metadata naming its architecture; name it "
                                     f"as cam:<arch>@{cam.pretrained}")
    backend, arch, _, zoo_tag = parse_model_name(name)
    if backend != "open_clip":
        raise MaskSpecError(f"mask model {cam.text!r}: {name!r} is not a CLIP")
    if weights is None:
        weights = zoo_tag
    return f"open_clip:{arch.replace('/', '-')}:{weights_key(weights, None)}"


def _info(cam: CamSpec | None, clip_model_id: str, method: str, layer: str | None, precision: str) -> dict[str, Any]:
    """The proposer's ``info`` (JSON-ready; the same from :func:`identity` and :func:`load`)."""
    return {"backend": "cam", "spec": cam.text if cam else None, "clip": cam.clip_dict() if cam else None,
            "clip_model_id": clip_model_id, "method": method, "layer": layer, "target": TARGET, "score": SCORE,
            "normalisation": "curate.saliency (ReLU, min-max, bilinear to the input, min-max), carried back to the "
                             "photo (0 outside the model input's crop), divided by its max",
            "precision": precision}


# ----------------------------------------------------------------------------- geometry
@dataclass(frozen=True)
class InputFootprint:
    """Where the model input lies on a photo: ``X = scale * u + offset`` per axis.

    ``u`` is a coordinate on the model input, ``X`` on the photo, both continuous with pixel
    edges on integers (pixel ``i`` spans ``[i, i + 1]``). Tuples are ``(x, y)``;
    ``input_size`` is the model input's ``(h, w)``.
    """

    scale: tuple[float, float]
    offset: tuple[float, float]
    input_size: tuple[int, int]


def _as_array(image: Any) -> np.ndarray:
    """A PIL image or a ``(1, h, w)`` / ``(h, w)`` tensor as a float64 ``(h, w)`` array."""
    if hasattr(image, "detach"):
        return image.detach().squeeze().cpu().numpy().astype(np.float64)
    return np.asarray(image, dtype=np.float64)


def _fit_axis(values: np.ndarray, valid: np.ndarray) -> tuple[float, float]:
    """Fit ``X = a * u + b`` to one line of a pushed ramp: ``values[j]`` at ``u = j + 0.5``,
    over the middle half of its valid (not padded) pixels, where resampling kernels do not
    reach the borders (exact for a linear ramp)."""
    index = np.flatnonzero(valid)
    if index.size < 2:
        raise ValueError("the model input shows less than two pixels of the photo along an axis")
    lo, hi = index[0], index[-1]
    quarter = (hi - lo) // 4
    keep = index[(index >= lo + quarter) & (index <= hi - quarter)]
    if keep.size < 2:
        keep = index
    u = keep + 0.5
    a, b = np.polyfit(u, values[keep], 1)
    residual = float(np.abs(a * u + b - values[keep]).max())
    if a <= 0 or residual > 0.05 * max(1.0, abs(a)):
        raise ValueError(f"the preprocessing is not an axis-aligned resize/crop/pad (fit residual {residual:.3g})")
    return float(a), float(b)


def input_footprint(preprocess: Any, image_size: tuple[int, int]) -> InputFootprint:
    """The :class:`InputFootprint` of a photo of ``image_size = (W, H)`` under ``preprocess``.

    Two float images whose values are their own pixel-centre coordinates (``X + 0.5``, so at
    least 0.5 on the photo) go through the geometric steps of ``preprocess`` (the resize, crop
    and pad steps that :func:`curate.saliency.mask_transform_for` keeps, padding filled with 0,
    each step with the image's own interpolation); a line is fitted to the centre row of the x
    ramp and the centre column of the y ramp where they are above 0.25 (not padding). Cost:
    two resizes of a photo-sized float image (10 ms at 640 x 480, 0.25 s at 4000 x 3000);
    :class:`CamProposer` memoises it per photo size.

    Raises :class:`ValueError` when the steps are not an axis-aligned resize/crop/pad.
    """
    from PIL import Image

    from curate.saliency import mask_transform_for

    width, height = int(image_size[0]), int(image_size[1])
    xs = np.broadcast_to(np.arange(width, dtype=np.float32) + 0.5, (height, width))
    ys = np.broadcast_to((np.arange(height, dtype=np.float32) + 0.5)[:, None], (height, width))
    ramps = [Image.fromarray(np.ascontiguousarray(a), mode="F") for a in (xs, ys)]
    for step in mask_transform_for(preprocess).steps:
        ramps = [step(r) for r in ramps]
    x_out, y_out = (_as_array(r) for r in ramps)
    h, w = x_out.shape
    ax, bx = _fit_axis(x_out[h // 2], x_out[h // 2] > 0.25)
    ay, by = _fit_axis(y_out[:, w // 2], y_out[:, w // 2] > 0.25)
    return InputFootprint(scale=(ax, ay), offset=(bx, by), input_size=(h, w))


def map_to_image(saliency: torch.Tensor, footprint: InputFootprint, image_size: tuple[int, int]) -> torch.Tensor:
    """An ``(h, w)`` map on the model input -> ``(H, W)`` on the photo (``image_size = (W, H)``).

    Photo pixel centre ``X + 0.5`` reads the map bilinearly at ``u = (X + 0.5 - offset) /
    scale`` (per axis); pixels whose ``u`` falls outside ``[0, w]`` / ``[0, h]`` get 0. Same
    device and float32.
    """
    import torch
    import torch.nn.functional as F

    h, w = footprint.input_size
    if tuple(saliency.shape[-2:]) != (h, w):
        raise ValueError(f"map {tuple(saliency.shape[-2:])} is not the model input {(h, w)}")
    width, height = int(image_size[0]), int(image_size[1])
    device = saliency.device
    (ax, ay), (bx, by) = footprint.scale, footprint.offset
    u = ((torch.arange(width, device=device, dtype=torch.float64) + 0.5) - bx) / ax
    v = ((torch.arange(height, device=device, dtype=torch.float64) + 0.5) - by) / ay
    inside = ((v >= 0) & (v <= h))[:, None] & ((u >= 0) & (u <= w))[None, :]
    gx = (2.0 * u / w - 1.0).float()
    gy = (2.0 * v / h - 1.0).float()
    grid = torch.stack(torch.meshgrid(gy, gx, indexing="ij")[::-1], dim=-1).unsqueeze(0)  # (1, H, W, 2) as (x, y)
    out = F.grid_sample(saliency.float().reshape(1, 1, h, w), grid, mode="bilinear", padding_mode="border",
                        align_corners=False)[0, 0]
    return torch.where(inside, out, torch.zeros((), device=device))


# ----------------------------------------------------------------------------- the proposer
class CamProposer:
    """A CLIP's saliency maps of each photo's prompt, thresholded (the ``cam`` backend).

    Args:
        clip: a loaded CLIP (:func:`curate.models.load_model`).
        method: a target-dependent saliency method (default ``layercam``).
        layer: the CAM layer (default: :func:`curate.saliency.default_layer`, resolved once).
        batch_size: images per forward/backward pass (halved on out-of-memory, as in
            ``curate explain``).
        spec: the :class:`CamSpec` the CLIP was loaded from (recorded in ``info``).

    ``model_id``: :func:`cam_model_id`; ``info``: JSON-ready (backend, spec, clip, method,
    layer as given, target, score, normalisation, precision); ``layer_name``: the resolved layer.
    """

    def __init__(self, clip: LoadedModel, method: str = DEFAULT_METHOD, *, layer: str | None = None,
                 batch_size: int = 8, spec: CamSpec | None = None) -> None:
        from curate.saliency import default_layer, method_info, resolve_layer

        if clip.kind != "clip":
            raise MaskSpecError(f"{clip.model_id} is not a CLIP: cam's target is a text prompt's zero-shot logit")
        if int(batch_size) < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.method, layer = _method(method if layer is None else f"{method}@{layer}",
                                     spec.text if spec else f"cam#{method}")
        self.clip = clip
        self.layer = layer
        self.batch_size = int(batch_size)
        self._chunk = self.batch_size
        self.layer_name: str | None = None
        if method_info(self.method).uses_layer:
            self.layer_name = resolve_layer(clip, layer if layer is not None else default_layer(clip))[0]
        self.model_id = cam_model_id(clip.model_id, self.method, layer)
        self.info: dict[str, Any] = _info(spec, clip.model_id, self.method, layer, clip.precision)
        self._text: dict[str, torch.Tensor] = {}
        self._footprints: dict[tuple[int, int], InputFootprint] = {}

    def footprint(self, image_size: tuple[int, int]) -> InputFootprint:
        """:func:`input_footprint` of a photo size ``(W, H)`` for this CLIP (memoised per size)."""
        key = (int(image_size[0]), int(image_size[1]))
        if key not in self._footprints:
            if len(self._footprints) >= FOOTPRINT_MEMO:
                self._footprints.pop(next(iter(self._footprints)))  # the oldest size goes
            self._footprints[key] = input_footprint(self.clip.preprocess, key)
        return self._footprints[key]

    def _classifier(self, prompts: list[str]) -> torch.Tensor:
        """``(P, D)`` text embeddings of distinct prompts (memoised per prompt)."""
        import torch

        new = [p for p in prompts if p not in self._text]
        if new:
            for p, e in zip(new, self.clip.encode_text(new, normalize=True)):
                self._text[p] = e
        return torch.stack([self._text[p] for p in prompts])

    def maps(self, images: Sequence[Image.Image], prompts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``(N, h, w)`` maps on the model input (in [0, 1]) and ``(N,)`` constant flags of
        one batch, on the CLIP's device (steps 1-2 of the module docstring)."""
        from curate.saliency import Explainer, TrueClass, explain_with_backoff

        distinct = list(dict.fromkeys(prompts))
        labels = [distinct.index(p) for p in prompts]
        x = self.clip.preprocess_images(list(images))
        explainer = Explainer(self.clip, self.method, layer=self.layer_name, classifier=self._classifier(distinct),
                              inner_batch_size=128 if self.clip.device.type == "cuda" else 16)
        result, self._chunk = explain_with_backoff(explainer, x, TrueClass(), labels, batch_size=self._chunk)
        return result.maps[:, 0], result.flat[:, 0]

    def propose(self, images: Sequence[Image.Image], prompts: Sequence[str], threshold: float) -> list[Proposal]:
        """One :class:`Proposal` per image, in order (module docstring, steps 1-5).

        ``threshold`` in [0, 1] applies to the max-normalised map on the photo.
        """
        if len(images) != len(prompts):
            raise ValueError(f"{len(images)} images but {len(prompts)} prompts: give one prompt per image")
        threshold = float(threshold)
        if not 0.0 <= threshold <= 1.0:
            raise ValueError(f"threshold must be in [0, 1] (a fraction of the map's peak), got {threshold}")
        out: list[Proposal] = []
        for start in range(0, len(images), self.batch_size):
            batch = list(images[start:start + self.batch_size])
            maps, flat = self.maps(batch, [str(p) for p in prompts[start:start + self.batch_size]])
            for j, image in enumerate(batch):
                out.append(self._proposal(maps[j], bool(flat[j]), image.size, threshold))
        return out

    def _proposal(self, saliency: torch.Tensor, flat: bool, image_size: tuple[int, int], threshold: float) -> Proposal:
        """Steps 3-5 for one image: carry back, normalise by the max, threshold, score."""
        import torch

        if not bool(torch.isfinite(saliency).all()):
            return Proposal(None, None, NONFINITE_REASON)
        if flat:
            return Proposal(None, None, CONSTANT_REASON)
        photo = map_to_image(saliency, self.footprint(image_size), image_size)
        peak = float(photo.max())
        if not peak > 0.0:
            return Proposal(None, None, CONSTANT_REASON)
        normalised = photo / peak
        mask = normalised >= threshold
        score = float(normalised[mask].mean())
        return Proposal(mask.cpu().numpy().astype(bool), min(1.0, max(0.0, score)), None)


# ----------------------------------------------------------------------------- the backend entries
def _clip_error(cam: CamSpec, error: Exception) -> Exception:
    """A loading error with the mask spec in front (same type, same fields)."""
    from curate.models.base import WeightsNotFoundError

    if isinstance(error, WeightsNotFoundError):
        return WeightsNotFoundError(f"mask model {cam.text!r}: {error}", error.missing, error.searched)
    return error


def load(spec: str | MaskModelSpec, *, device: str = "auto", precision: str = "fp32", batch_size: int = 8) -> CamProposer:
    """Load the CLIP a ``cam:`` spec names (offline) and return its :class:`CamProposer`."""
    from curate.models import load_model
    from curate.models.base import WeightsNotFoundError

    cam = parse_cam_spec(spec)
    try:
        clip = load_model(cam.name, cam.pretrained, device=device, precision=precision)
    except WeightsNotFoundError as error:
        raise _clip_error(cam, error) from error
    return CamProposer(clip, cam.method, layer=cam.layer, batch_size=batch_size, spec=cam)


def identity(spec: str | MaskModelSpec, *, precision: str = "fp32") -> tuple[str, dict[str, Any]]:
    """``(model_id, info)`` of a ``cam:`` spec without building the CLIP (equal to :func:`load`'s)."""
    from curate.models.base import WeightsNotFoundError

    cam = parse_cam_spec(spec)
    try:
        clip_id = _clip_model_id(cam)
    except WeightsNotFoundError as error:
        raise _clip_error(cam, error) from error
    return cam_model_id(clip_id, cam.method, cam.layer), _info(cam, clip_id, cam.method, cam.layer, precision)
