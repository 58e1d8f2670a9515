"""The synthetic world: procedurally drawn animals on procedural backgrounds, exact masks.

It reproduces the paper's own confirmatory setting (papers/003 §4 and App. D: ColoredCOCO /
MultiColoredMNIST): each class is drawn on its *common* background with probability ``p``
and on one of the other backgrounds (uniformly) otherwise. With ``p`` well above ``1/B`` a
model trained on the world can learn the background as a shortcut; with ``p = 1/B`` the
background carries no information about the class.

Design choices that make the shortcut learnable but not trivial:
- the class is carried only by the object's *shape* (one silhouette per class); its colour
  and fill pattern are drawn from a palette shared by all classes, so colour is no cue;
- the background is a texture with a strong global colour and pattern, an easier feature
  than shape, which is what makes a CLIP trained with ``p = 0.9`` lean on it;
- the silhouette has a 1-px outline that contrasts with the background (black on bright
  backgrounds, white on dark ones), so no background hides the shape: without it a white
  object on snow or a grey one on road is camouflaged, a real (not spurious) background
  effect that even a shortcut-free model shows (measured: the splitter then found
  "significant" drops for a model trained without correlation).

The mask is exact by construction: the image is composed as ``bg * (1 - m) + obj * m`` from
the binary mask ``m`` at the output resolution, so the object's pixels are exactly the mask's.
The same composition makes interventions exact: :func:`render_counterfactual` re-renders a
sample with another background or object size, everything else held fixed.

Classes are named after real ImageNet-1K animals (the label space is real), backgrounds after
the paper's vocabulary (§2.1). Everything is deterministic for a seed: sample ``i`` of a world
draws from ``numpy.random.default_rng([seed, i])``, so counts can change without reshuffling
the others, and generation can be split across processes.
"""
from __future__ import annotations

import io
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
from PIL import Image

from curate.collect import planted
from curate.collect.planted import RATE_FIELDS, check_rates
from curate.collect.world_draw import (  # noqa: F401 - BACKGROUNDS, OBJECT_PALETTE, SHAPES: re-exported
    BACKGROUNDS,
    OBJECT_PALETTE,
    SHAPES,
    background_texture,
    draw_mask,
    eroded,
    object_texture,
)

#: Former private names of the drawing helpers (now :mod:`curate.collect.world_draw`), kept for callers.
_bg = background_texture
_eroded = eroded

logger = logging.getLogger(__name__)

# ---------------------------------------------------------------------------------------------
# Classes: ImageNet-1K animals (index, name) with a silhouette each, and the background the
# CounterAnimal paper found "easy" for them (Table 5), used as the common background.
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SyntheticClass:
    """One class of the world: an ImageNet-1K index, its silhouette and common background."""

    imagenet_index: int
    name: str
    shape: str
    common_background: str


DEFAULT_CLASSES: tuple[SyntheticClass, ...] = (
    SyntheticClass(296, "polar bear", "circle", "snow"),
    SyntheticClass(100, "black swan", "triangle", "water"),
    SyntheticClass(23, "vulture", "star", "sky"),
    SyntheticClass(291, "lion", "square", "grass"),
    SyntheticClass(76, "tarantula", "cross", "sand"),
    SyntheticClass(42, "agama", "crescent", "rock"),
    SyntheticClass(305, "dung beetle", "hexagon", "earth"),
    SyntheticClass(316, "cicada", "arrow", "tree"),
    SyntheticClass(130, "flamingo", "heart", "indoor"),
    SyntheticClass(357, "mink", "ring", "road"),
)



# ---------------------------------------------------------------------------------------------
# The world
# ---------------------------------------------------------------------------------------------

#: Outline styles (:attr:`WorldSpec.outline`).
OUTLINES: tuple[str, ...] = ("contrast", "double")
#: The allowed object radius factors (:attr:`WorldSpec.uncommon_scale`, :func:`render_counterfactual`).
UNCOMMON_SCALE_RANGE = (0.2, 1.5)
#: The allowed contrast factors of objects off the common background (:attr:`WorldSpec.uncommon_contrast`).
UNCOMMON_CONTRAST_RANGE = (0.1, 1.0)
#: The grey an object is washed towards (:attr:`WorldSpec.uncommon_contrast`).
WASH_GREY = 128.0


@dataclass(frozen=True)
class WorldSpec:
    """Parameters of a synthetic world.

    Attributes:
        classes: the classes (default: the first ``num_classes`` of :data:`DEFAULT_CLASSES`).
        backgrounds: the background vocabulary drawn from (default: the classes' common
            backgrounds, so every class has its own).
        p: probability that a sample of class c shows c's common background; otherwise one
            of the other backgrounds uniformly. ``p = 1/len(backgrounds)`` is uncorrelated.
        per_class: images per class.
        image_size: side in pixels (square).
        seed: makes the world deterministic.
        wrong_label_rate, duplicate_rate, near_duplicate_rate, feature_noise_rate,
            second_object_rate, small_object_rate: planted curation problems (at most one per
            sample; all 0 by default, which draws exactly the world without them). See
            :mod:`curate.collect.planted`.
        uncommon_scale: factor applied to the object's radius in samples whose background is
            *not* the class's common one (0.2 to 1.5; 1.0, the default, draws exactly the world
            without it). Below 1 it plants a confound: photos off the common background also
            show smaller objects, so hard photos differ by scale and not only by background.
            Such samples record ``object_scale`` in their ``extra`` (a truth the audit never reads).
        common_scale_range: ``(low, high)``, the radius factor of samples *on* the common background,
            drawn per sample uniformly in ``[low, high]`` (within 0.2 to 1.5) from the sample's own
            stream ``[seed, index, SCALE_STREAM]``, so every other draw is unchanged. ``(1.0, 1.0)``,
            the default, draws nothing and is exactly the world without it. Easy objects of varied
            sizes make some easy donors' holes small enough for a smaller hard object to cover
            (the fill control, docs/interventions.md#the-fill-control); those samples record
            ``object_scale`` too.
        uncommon_contrast: samples off the common background show their object (outline included)
            washed towards grey, ``obj' = 128 + uncommon_contrast * (obj - 128)`` per channel (0.1 to
            1.0; 1.0, the default, draws exactly the world without it). A constant grey keeps the
            object's pixels independent of the background, so a pasted object is still exactly what
            the generator would draw on the donor's background. Such samples record
            ``object_contrast`` in their ``extra``.
        vignette: the light on every background falls off from the image's centre,
            ``bg' = bg * (1 - vignette * r^2)`` with ``r`` the distance from the centre over the
            half-diagonal (1 at the corners; 0 to 0.9; 0.0, the default, draws exactly the world
            without it). The textures are stationary, so a hole tiled from the border of one (Xiao
            et al.'s Only-BG-T) is nearly invisible; a photograph's light is not, and with a vignette
            the tiled hole shows as a darker region in the shape of the object that was there (the
            fill control's validating world, docs/interventions.md#the-fill-control). The object is
            not lit, so its pixels stay the same on every background.
        outline: ``contrast`` (the default): the 1-px outline is black on bright backgrounds and
            white on dark ones, so the object's own pixels depend on the background it was drawn
            on (as a real photo's light and colour cast do); ``double``: a black outer ring and a
            white inner ring on every background, so the object's pixels are the same whatever
            the background and a pasted object is exactly the object the generator would draw
            there (the intervention worlds, :mod:`curate.interventions.worlds`).
    """

    classes: tuple[SyntheticClass, ...] = DEFAULT_CLASSES[:6]
    backgrounds: tuple[str, ...] = ()
    p: float = 0.9
    per_class: int = 100
    image_size: int = 48
    seed: int = 0
    wrong_label_rate: float = 0.0
    duplicate_rate: float = 0.0
    near_duplicate_rate: float = 0.0
    feature_noise_rate: float = 0.0
    second_object_rate: float = 0.0
    small_object_rate: float = 0.0
    uncommon_scale: float = 1.0
    outline: str = "contrast"
    common_scale_range: tuple[float, float] = (1.0, 1.0)
    uncommon_contrast: float = 1.0
    vignette: float = 0.0

    def __post_init__(self) -> None:
        check_rates(self)
        if self.outline not in OUTLINES:
            raise ValueError(f"outline must be one of {', '.join(OUTLINES)}, got {self.outline!r}")
        if not UNCOMMON_SCALE_RANGE[0] <= self.uncommon_scale <= UNCOMMON_SCALE_RANGE[1]:
            raise ValueError(
                f"uncommon_scale must be in [{UNCOMMON_SCALE_RANGE[0]}, {UNCOMMON_SCALE_RANGE[1]}], got {self.uncommon_scale}"
            )
        low, high = (float(v) for v in self.common_scale_range)
        if not UNCOMMON_SCALE_RANGE[0] <= low <= high <= UNCOMMON_SCALE_RANGE[1]:
            raise ValueError(f"common_scale_range must be (low, high) with {UNCOMMON_SCALE_RANGE[0]} <= low <= high <= "
                             f"{UNCOMMON_SCALE_RANGE[1]}, got {tuple(self.common_scale_range)}")
        object.__setattr__(self, "common_scale_range", (low, high))
        if not UNCOMMON_CONTRAST_RANGE[0] <= self.uncommon_contrast <= UNCOMMON_CONTRAST_RANGE[1]:
            raise ValueError(f"uncommon_contrast must be in [{UNCOMMON_CONTRAST_RANGE[0]}, {UNCOMMON_CONTRAST_RANGE[1]}], "
                             f"got {self.uncommon_contrast}")
        if not 0.0 <= self.vignette <= 0.9:
            raise ValueError(f"vignette must be in [0, 0.9], got {self.vignette}")
        if not self.backgrounds:
            object.__setattr__(self, "backgrounds", tuple(dict.fromkeys(c.common_background for c in self.classes)))
        if not 0.0 <= self.p <= 1.0:
            raise ValueError(f"p must be in [0, 1], got {self.p}")
        if self.per_class < 1 or self.image_size < 16:
            raise ValueError("per_class must be >= 1 and image_size >= 16")
        if len({c.shape for c in self.classes}) != len(self.classes):
            raise ValueError("each class needs its own shape")
        unknown = [b for b in self.backgrounds if b not in BACKGROUNDS]
        if unknown:
            raise ValueError(f"unknown synthetic backgrounds {unknown}; known: {', '.join(BACKGROUNDS)}")
        for c in self.classes:
            if c.common_background not in self.backgrounds:
                raise ValueError(f"class {c.name!r}: common background {c.common_background!r} is not in the world's backgrounds")
        if len(self.backgrounds) < 2 and self.p < 1.0:
            raise ValueError("a world with p < 1 needs at least two backgrounds")

    @property
    def uncorrelated_p(self) -> float:
        return 1.0 / len(self.backgrounds)

    def to_dict(self) -> dict:
        return {
            "classes": [{"index": c.imagenet_index, "name": c.name, "shape": c.shape, "common_background": c.common_background} for c in self.classes],
            "backgrounds": list(self.backgrounds),
            "p": self.p,
            "per_class": self.per_class,
            "image_size": self.image_size,
            "seed": self.seed,
            **self._planted_dict(),
            # recorded only when set, so a world without it keeps its old record
            **({"uncommon_scale": self.uncommon_scale} if self.uncommon_scale != 1.0 else {}),
            **({"outline": self.outline} if self.outline != "contrast" else {}),
            **({"common_scale_range": list(self.common_scale_range)} if self.common_scale_range != (1.0, 1.0) else {}),
            **({"uncommon_contrast": self.uncommon_contrast} if self.uncommon_contrast != 1.0 else {}),
            **({"vignette": self.vignette} if self.vignette != 0.0 else {}),
        }

    def _planted_dict(self) -> dict:
        # only non-zero rates are recorded, so a world without planted problems keeps its old record
        return {name: getattr(self, name) for name in RATE_FIELDS.values() if getattr(self, name)}


@dataclass
class SyntheticSample:
    """One generated image with its exact mask and ground truth."""

    index: int
    image: np.ndarray  # (H, W, 3) uint8
    mask: np.ndarray  # (H, W) uint8 in {0, 1}
    cls: SyntheticClass
    background: str
    aligned: bool  # background == the class's common background
    extra: dict = field(default_factory=dict)


def classes_by_name(names: Sequence[str]) -> tuple[SyntheticClass, ...]:
    """Pick classes of :data:`DEFAULT_CLASSES` by name or ImageNet index (clear error otherwise)."""
    table = {c.name: c for c in DEFAULT_CLASSES} | {str(c.imagenet_index): c for c in DEFAULT_CLASSES}
    picked = []
    for name in names:
        key = name.strip()
        if key not in table:
            known = ", ".join(f"{c.name} ({c.imagenet_index})" for c in DEFAULT_CLASSES)
            raise ValueError(f"the synthetic world has no class {name!r}; available: {known}")
        picked.append(table[key])
    return tuple(picked)


def generate_sample(spec: WorldSpec, index: int, *, keep_layers: bool = False) -> SyntheticSample:
    """Sample number ``index`` of the world (class = index // per_class), deterministic.

    ``keep_layers=True`` also returns the background and object layers (uint8) in ``extra``, so
    a test can check that the image is exactly ``where(mask, object, background)``.
    """
    problem = planted.problem_of(spec, index)
    if problem in ("exact_duplicate", "near_duplicate"):
        source_index = planted.duplicate_source(spec, index)
        source = generate_sample(spec, source_index)
        image, mask, truth = planted.duplicate_of(problem, spec, index, source.image, source.mask)
        truth["duplicate_of"] = f"{spec.seed}:{source_index}"
        if "object_scale" in source.extra:  # the copy shows the source's object
            truth["object_scale"] = source.extra["object_scale"]
        return SyntheticSample(index, image, mask, source.cls, source.background, source.aligned, truth)
    rng = np.random.default_rng([spec.seed, index])
    cls = spec.classes[index // spec.per_class]
    drawn = cls
    if problem == "wrong_label":
        drawn = planted.other_class(spec, index, planted.plant_rng(spec, index), cls)
    background = _choose_background(spec, cls, rng)
    scale = _world_scale(spec, cls, background, index)
    contrast = _world_contrast(spec, cls, background)
    image, mask, bg, obj = _render(spec, rng, drawn.shape, background, scale, contrast=contrast)
    extra = {"background_layer": np.clip(bg, 0, 255).astype(np.uint8), "object_layer": np.clip(obj, 0, 255).astype(np.uint8)} if keep_layers else {}
    if scale != 1.0:
        extra["object_scale"] = scale
    if contrast != 1.0:
        extra["object_contrast"] = contrast
    if problem == "wrong_label":
        extra.update({"planted": "wrong_label", "true_class": drawn.imagenet_index})
    elif problem is not None:
        image, mask, truth = planted.apply_problem(problem, spec, index, cls, bg, obj, mask, image)
        extra.update(truth)
    return SyntheticSample(index, image, mask, cls, background, background == cls.common_background, extra)


def _choose_background(spec: WorldSpec, cls: SyntheticClass, rng: np.random.Generator) -> str:
    """The sample's background: the class's common one with probability ``p``, else another uniformly."""
    if rng.random() < spec.p:
        return cls.common_background
    others = [b for b in spec.backgrounds if b != cls.common_background]
    return others[rng.integers(len(others))]


#: The stream of a sample's common-background radius factor: ``[seed, index, SCALE_STREAM]``
#: (:attr:`WorldSpec.common_scale_range`).
SCALE_STREAM = 2


def _world_scale(spec: WorldSpec, cls: SyntheticClass, background: str, index: int) -> float:
    """The object radius factor the world gives sample ``index`` of ``cls`` on ``background``:
    ``uncommon_scale`` off the common background; on it 1.0, or a draw from ``common_scale_range``."""
    if background != cls.common_background:
        return spec.uncommon_scale
    low, high = spec.common_scale_range
    if (low, high) == (1.0, 1.0):
        return 1.0
    return float(np.random.default_rng([spec.seed, index, SCALE_STREAM]).uniform(low, high))


def _world_contrast(spec: WorldSpec, cls: SyntheticClass, background: str) -> float:
    """The object contrast factor the world gives a sample of ``cls`` on ``background``."""
    return spec.uncommon_contrast if background != cls.common_background else 1.0


def _render(spec: WorldSpec, rng: np.random.Generator, shape: str, background: str, scale: float,
            shown: tuple[str, np.random.Generator] | np.ndarray | None = None, contrast: float = 1.0
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(image, mask, bg, obj)`` of one sample, drawing from ``rng`` in the world's order: the
    mask (radius times ``scale``), the ``background`` texture, the object fill.

    ``shown = (kind, bg_rng)`` replaces the background layer by a texture of ``kind`` drawn from
    ``bg_rng`` (the ``background`` texture is still drawn from ``rng``, so the object fill is
    the sample's own; an array is the texture itself, :func:`_texture_of`); the outline contrasts
    with the background actually shown. ``contrast`` < 1
    washes the object, outline included, towards :data:`WASH_GREY` (:attr:`WorldSpec.uncommon_contrast`).
    """
    size = spec.image_size
    mask = draw_mask(shape, size, rng, scale=scale)
    bg = background_texture(size, rng, background)
    obj = object_texture(size, rng)
    if isinstance(shown, np.ndarray):
        bg = shown.copy()
    elif shown is not None:
        bg = background_texture(size, shown[1], shown[0])
    if spec.vignette:
        bg = bg * vignette_light(size, spec.vignette)[..., None]
    inner = eroded(mask.astype(bool))
    edge = mask.astype(bool) & ~inner
    if spec.outline == "double":  # the same on every background: black outside, white just inside
        obj[edge] = 20.0
        obj[inner & ~eroded(inner)] = 235.0
    else:
        luminance = float((bg @ np.array([0.299, 0.587, 0.114], np.float32)).mean())
        obj[edge] = 20.0 if luminance > 110 else 235.0
    if contrast != 1.0:
        obj = WASH_GREY + np.float32(contrast) * (obj - WASH_GREY)
    m = mask[..., None].astype(np.float32)
    image = np.clip(bg * (1 - m) + obj * m, 0, 255).astype(np.uint8)
    return image, mask, bg, obj


def vignette_light(size: int, strength: float) -> np.ndarray:
    """The light factor of :attr:`WorldSpec.vignette`: ``1 - strength * r^2`` per pixel, ``r`` the
    distance of the pixel's centre from the image's centre over the half-diagonal (float32, size x size)."""
    centre = (size - 1) / 2
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32)
    r2 = ((yy - centre) ** 2 + (xx - centre) ** 2) / (2 * centre ** 2)
    return (1.0 - np.float32(strength) * r2).astype(np.float32)


#: The stream of a counterfactual's replacement background: ``[seed, index, COUNTERFACTUAL_STREAM]``.
COUNTERFACTUAL_STREAM = 1


def _check_clean(spec: WorldSpec, index: int, why: str) -> None:
    """ValueError unless ``index`` is a sample of the world without a planted problem (``why``: what that spoils)."""
    total = spec.per_class * len(spec.classes)
    if not 0 <= index < total:
        raise ValueError(f"sample index {index} is outside the world (0..{total - 1})")
    problem = planted.problem_of(spec, index)
    if problem is not None:
        raise ValueError(f"sample {index} has a planted problem ({problem}); {why}")


def _texture_of(spec: WorldSpec, index: int) -> tuple[str, np.ndarray]:
    """Sample ``index``'s background kind and texture as the generator drew them (before any vignette):
    its stream replayed up to the texture. Samples with a planted problem are refused."""
    _check_clean(spec, index, "its background is not one texture")
    rng = np.random.default_rng([spec.seed, index])
    cls = spec.classes[index // spec.per_class]
    own = _choose_background(spec, cls, rng)
    draw_mask(cls.shape, spec.image_size, rng, scale=_world_scale(spec, cls, own, index))
    return own, background_texture(spec.image_size, rng, own)


def render_counterfactual(spec: WorldSpec, index: int, *, background: str | None = None,
                          scale: float | None = None, background_of: int | None = None) -> SyntheticSample:
    """Sample ``index`` re-rendered under an intervention: the same object (class, silhouette,
    pose, position, fill texture) with ``background`` instead of its own (a fresh texture of that
    kind) and/or the object radius factor ``scale`` instead of the one the world gave it.

    This is the ground truth of an intervention: what a model would have said had this photo's
    background been ``background`` (or its object ``scale`` times the drawn size), everything
    else held fixed. It is exact because the world composes ``image = bg * (1 - m) + obj * m``:
    the sample's random stream is replayed draw for draw, only the intervened layer changes (the
    replacement texture comes from its own stream ``[seed, index, 1]``, so the object fill is
    untouched), and the 1-px outline is recoloured for the background shown, as the generator
    would. With neither argument it is exactly :func:`generate_sample`; asking for the sample's
    own background keeps its own texture (the factual is its own counterfactual).

    ``background_of`` (instead of ``background``): the background sample ``background_of`` itself
    shows behind its own object, the same texture draw, with no hole and nothing filled: the exact
    counterfactual of pasting this object on that photo (a swap's donor), so a swap and its truth
    differ only by what the donor's filled hole shows.

    The returned sample's ``background``/``aligned`` describe what is shown; ``extra`` is
    ``{"counterfactual": {...}}`` with the intervened attributes only. Samples with a planted
    problem are refused (their pixels are not composed from one object and one background).
    """
    _check_clean(spec, index, "counterfactuals are defined for clean samples only")
    if background is not None and background not in BACKGROUNDS:
        raise ValueError(f"unknown synthetic background {background!r}; known: {', '.join(BACKGROUNDS)}")
    if scale is not None and not UNCOMMON_SCALE_RANGE[0] <= scale <= UNCOMMON_SCALE_RANGE[1]:
        raise ValueError(f"scale must be in [{UNCOMMON_SCALE_RANGE[0]}, {UNCOMMON_SCALE_RANGE[1]}], got {scale}")
    if background is not None and background_of is not None:
        raise ValueError("give background or background_of, not both")
    donor = _texture_of(spec, background_of) if background_of is not None else None
    if donor is not None:
        background = donor[0]
    if background is None and scale is None:
        return generate_sample(spec, index)
    rng = np.random.default_rng([spec.seed, index])
    cls = spec.classes[index // spec.per_class]
    own = _choose_background(spec, cls, rng)
    factor = _world_scale(spec, cls, own, index) if scale is None else float(scale)
    shown: tuple[str, np.random.Generator] | np.ndarray | None = None
    if donor is not None and background_of != index:
        shown = donor[1]
    elif background is not None and background != own and donor is None:
        shown = (background, np.random.default_rng([spec.seed, index, COUNTERFACTUAL_STREAM]))
    image, mask, _, _ = _render(spec, rng, cls.shape, own, factor, shown, contrast=_world_contrast(spec, cls, own))
    shown_background = own if background is None else background
    intervened = {k: v for k, v in (("background", background), ("scale", scale), ("background_of", background_of))
                  if v is not None}
    return SyntheticSample(index, image, mask, cls, shown_background, shown_background == cls.common_background,
                           {"counterfactual": intervened})


#: The stream of a background-alone photo: ``[seed, BACKGROUND_ALONE_STREAM, background's place in
#: BACKGROUNDS, index]`` (its own length, so it shares no draw with any sample of the world).
BACKGROUND_ALONE_STREAM = 3


def render_background_alone(spec: WorldSpec, background: str, index: int) -> np.ndarray:
    """Photo ``index`` of ``background`` alone, as the world would show it behind an object: a texture
    of that kind (:func:`curate.collect.world_draw.background_texture`) with the world's vignette, no
    object, no hole, nothing filled (uint8, image_size x image_size x 3). The donors of the fill
    control that needs no fill (issue 45, docs/design.md#interventions); nothing of the world's own
    samples changes."""
    if background not in BACKGROUNDS:
        raise ValueError(f"unknown synthetic background {background!r}; known: {', '.join(BACKGROUNDS)}")
    rng = np.random.default_rng([spec.seed, BACKGROUND_ALONE_STREAM, BACKGROUNDS.index(background), int(index)])
    bg = background_texture(spec.image_size, rng, background)
    if spec.vignette:
        bg = bg * vignette_light(spec.image_size, spec.vignette)[..., None]
    return np.clip(bg, 0, 255).astype(np.uint8)


def collect_synthetic_backgrounds(root, spec: WorldSpec, per_background: int, *, name: str | None = None):
    """Write ``per_background`` background-alone photos of each of the world's backgrounds into the
    dataset folder ``root`` (:func:`render_background_alone`): samples with no class and no mask,
    ``background`` set (``background_source="synthetic"``), licence CC0, ``source_id``
    ``<seed>:bg:<background>:<i>``; the spec and the count go to ``provenance.synthetic_backgrounds``.
    The form ``curate intervene --background-photos`` reads (docs/design.md#interventions)."""
    from pathlib import Path

    from curate.store import Dataset, NewSample

    if per_background < 1:
        raise ValueError(f"per_background must be >= 1, got {per_background}")
    root = Path(root)
    ds = Dataset.open(root) if (root / "dataset.yaml").exists() else Dataset.create(
        root, name=name or root.name, backgrounds=list(spec.backgrounds), recipe="background-photos")
    missing = [b for b in spec.backgrounds if b not in ds.backgrounds]
    if missing:
        raise ValueError(f"{root}: backgrounds {missing} are not in the dataset's vocabulary {ds.backgrounds}")
    samples = [NewSample(image=png_bytes(render_background_alone(spec, background, i)), class_index=None,
                         source="synthetic", source_id=f"{spec.seed}:bg:{background}:{i}", license=SYNTHETIC_LICENSE,
                         attribution="curate synthetic world (procedurally generated background)", status="accepted",
                         background=background, background_source="synthetic", background_score=1.0,
                         extra={"background_alone": True, "world_seed": spec.seed})
               for background in spec.backgrounds for i in range(per_background)]
    report = ds.add_samples(samples, actor="collect.synthetic")
    if report.quarantined:
        raise RuntimeError(f"synthetic background photos were quarantined (a bug): {report.quarantined[:3]}")
    ds.record_provenance("synthetic_backgrounds", {**spec.to_dict(), "per_background": per_background})
    return ds


def generate_world(spec: WorldSpec) -> Iterator[SyntheticSample]:
    """All samples of the world in order (class-major)."""
    for index in range(spec.per_class * len(spec.classes)):
        yield generate_sample(spec, index)


def png_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="PNG", optimize=False)
    return buffer.getvalue()


# ---------------------------------------------------------------------------------------------
# Writing a world into a dataset folder
# ---------------------------------------------------------------------------------------------

SYNTHETIC_LICENSE = "CC0-1.0"
#: ``extra`` keys with the planted-problem truth (curate.collect.planted); the audit never reads them.
PLANTED_KEYS = ("planted", "planted_detail", "true_class", "duplicate_of")
#: Other ``extra`` keys with ground truth of the world (not planted problems): the object radius
#: factor of samples off the common background (:attr:`WorldSpec.uncommon_scale`) and their object's contrast
#: (:attr:`WorldSpec.uncommon_contrast`).
TRUTH_KEYS = ("object_scale", "object_contrast")


def collect_synthetic(root, spec: WorldSpec, *, name: str | None = None, progress: Callable[[int, int], None] | None = None):
    """Write the world ``spec`` into the dataset folder ``root`` (created if missing).

    Each sample keeps its exact mask (``masks/``), ``background`` with
    ``background_source="synthetic"``, ``status="accepted"``, licence CC0, ``source="synthetic"``
    and ``source_id="<seed>:<index>"``; ``extra`` records the shape and whether the background is
    the class's common one (plus the truths of :data:`PLANTED_KEYS` and :data:`TRUTH_KEYS` where
    the world has them). The spec goes to ``dataset.yaml`` (``provenance.synthetic``), so the
    world can be regenerated and its ground truth read back (:func:`world_spec_of`).
    Re-running on the same folder adds nothing twice (content-addressed deduplication).
    """
    from pathlib import Path

    from curate.store import Dataset, NewSample

    root = Path(root)
    if (root / "dataset.yaml").exists():
        ds = Dataset.open(root)
        missing = [b for b in spec.backgrounds if b not in ds.backgrounds]
        if missing:
            raise ValueError(f"{root}: backgrounds {missing} are not in the dataset's vocabulary {ds.backgrounds}")
    else:
        ds = Dataset.create(root, name=name or root.name, backgrounds=list(spec.backgrounds), recipe="synthetic")
    total = spec.per_class * len(spec.classes)

    def items() -> Iterator[NewSample]:
        for sample in generate_world(spec):
            if progress is not None:
                progress(sample.index + 1, total)
            yield NewSample(
                image=png_bytes(sample.image),
                class_index=sample.cls.imagenet_index,
                source="synthetic",
                source_id=f"{spec.seed}:{sample.index}",
                license=SYNTHETIC_LICENSE,
                attribution="curate synthetic world (procedurally generated)",
                status="accepted",
                background=sample.background,
                background_source="synthetic",
                background_score=1.0,
                mask=sample.mask,
                mask_status="synthetic",
                extra={"shape": sample.cls.shape, "aligned": bool(sample.aligned), "world_seed": spec.seed,
                       **{k: v for k, v in sample.extra.items() if k in PLANTED_KEYS + TRUTH_KEYS}},
            )

    report = ds.add_samples(items(), actor="collect.synthetic")
    if report.quarantined:
        raise RuntimeError(f"synthetic samples were quarantined (a bug): {report.quarantined[:3]}")
    ds.record_provenance("synthetic", spec.to_dict())
    logger.info("synthetic world: %d added, %d duplicates", len(report.added), len(report.duplicates))
    return ds


def world_spec_of(ds) -> WorldSpec:
    """The :class:`WorldSpec` recorded in a synthetic dataset's ``dataset.yaml``."""
    info = ds.provenance.get("synthetic")
    if not info:
        raise ValueError(f"{ds.root} was not made by `curate collect synthetic` (no provenance.synthetic)")
    classes = tuple(
        SyntheticClass(int(c["index"]), str(c["name"]), str(c["shape"]), str(c["common_background"])) for c in info["classes"]
    )
    return WorldSpec(
        classes=classes, backgrounds=tuple(info["backgrounds"]), p=float(info["p"]), per_class=int(info["per_class"]),
        image_size=int(info["image_size"]), seed=int(info["seed"]),
        **{k: float(v) for k, v in info.items() if k.endswith("_rate")},
        **({"uncommon_scale": float(info["uncommon_scale"])} if "uncommon_scale" in info else {}),
        **({"outline": str(info["outline"])} if "outline" in info else {}),
        **({"common_scale_range": tuple(float(v) for v in info["common_scale_range"])}
           if "common_scale_range" in info else {}),
        **({"uncommon_contrast": float(info["uncommon_contrast"])} if "uncommon_contrast" in info else {}),
        **({"vignette": float(info["vignette"])} if "vignette" in info else {}),
    )


def assign_truth_groups(ds) -> int:
    """Set ``group`` from the world's ground truth: easy = the class's common background, hard =
    any other. This is the split a perfect spurious-discovery step would find (the splitter is
    checked against it); returns the number of samples whose group changed."""
    spec = world_spec_of(ds)
    common = {c.imagenet_index: c.common_background for c in spec.classes}
    per_sample = {}
    for row in ds.rows():
        group = "easy" if row["background"] == common.get(row["class_index"]) else "hard"
        if row["group"] != group:
            per_sample[row["sample_id"]] = {"group": group}
    if per_sample:
        ds.update(list(per_sample), per_sample=per_sample, actor="collect.synthetic", reason="ground-truth groups")
    return len(per_sample)
