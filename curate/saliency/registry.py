"""The saliency methods curate knows, declared once and importable without torch.

Every method is one :class:`MethodInfo` entry of :data:`METHODS`: its name, its family (which
:class:`curate.saliency.Explainer` runner computes it), whether it needs gradients, which
layer(s) it reads by default (:data:`LAYER_RULES`), the paper it comes from and one line on
what the map is. The engine dispatches on the entry, the CLI offers :func:`method_names` as
``--method`` choices, and ``curate fidelity`` checks its method list with :func:`method_info`;
nothing else keeps a list of names. The formulas themselves are in :mod:`.methods`.
"""
from __future__ import annotations

from dataclasses import dataclass

from curate.saliency.base import SaliencyError

__all__ = [
    "ALIASES",
    "FAMILIES",
    "LAYER_RULES",
    "METHODS",
    "MethodInfo",
    "canonical_method",
    "method_info",
    "method_names",
]

#: Families, one runner each in :class:`curate.saliency.engine.Explainer`.
FAMILIES: tuple[str, ...] = ("gradient", "eigen", "score", "ablation", "fullgrad", "rollout")

#: Which layer(s) a method reads when none is named (:mod:`curate.saliency.layers` documents them).
LAYER_RULES: dict[str, str] = {
    "cam": "one layer: the last block's ln_1 / norm1 of a ViT; for a CNN the last stage whose map has at least "
           "4 cells per side (layer4 of a ResNet at 224 px); any other can be named with layer=",
    "bias-layers": "every Conv2d / BatchNorm2d with a bias in the image tower, plus the input",
    "attention-blocks": "every attention block of a ViT",
}


@dataclass(frozen=True)
class MethodInfo:
    """What a saliency method is, needs and does.

    Attributes:
        name: the canonical name (``--method``).
        family: the runner that computes it (one of :data:`FAMILIES`).
        needs_gradients: whether it backpropagates (False: forward passes only).
        default_layer_rule: a key of :data:`LAYER_RULES`.
        paper: where the method is defined.
        description: what the map is, in one line.
        target_dependent: False where every target of an image gets the same map.
        vit_only: whether it needs a ViT image tower.
    """

    name: str
    family: str
    needs_gradients: bool
    default_layer_rule: str
    paper: str
    description: str
    target_dependent: bool = True
    vit_only: bool = False

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(f"{self.name}: unknown family {self.family!r}")
        if self.default_layer_rule not in LAYER_RULES:
            raise ValueError(f"{self.name}: unknown layer rule {self.default_layer_rule!r}")

    @property
    def uses_layer(self) -> bool:
        """Whether the method reads one (nameable) layer."""
        return self.default_layer_rule == "cam"

    @property
    def default_layer(self) -> str:
        """The default layer rule, in words."""
        return LAYER_RULES[self.default_layer_rule]


METHODS: dict[str, MethodInfo] = {
    m.name: m
    for m in (
        MethodInfo("gradcam", "gradient", True, "cam", "Selvaraju et al. 2017 (Grad-CAM)",
                   "channel weights = spatial mean of the gradient"),
        MethodInfo("gradcam++", "gradient", True, "cam", "Chattopadhay et al. 2018 (Grad-CAM++, eq. 19)",
                   "higher-order positive-gradient weights"),
        MethodInfo("xgradcam", "gradient", True, "cam", "Fu et al. 2020 (XGrad-CAM)",
                   "activation-normalised gradient weights"),
        MethodInfo("layercam", "gradient", True, "cam", "Jiang et al. 2021 (LayerCAM)",
                   "element-wise positive-gradient weights"),
        MethodInfo("eigengradcam", "gradient", True, "cam", "pytorch-grad-cam (EigenGradCAM)",
                   "first principal component of G*A"),
        MethodInfo("eigencam", "eigen", False, "cam", "Muhammad & Yeasin 2020 (Eigen-CAM)",
                   "first principal component of A (target ignored)", target_dependent=False),
        MethodInfo("scorecam", "score", False, "cam", "Wang et al. 2020 (Score-CAM)",
                   "softmax of the target score of the input masked by each channel"),
        MethodInfo("ablationcam", "ablation", False, "cam", "Desai & Ramaswamy 2020 (Ablation-CAM)",
                   "relative drop of the target score when each channel is ablated"),
        MethodInfo("fullgrad", "fullgrad", True, "bias-layers", "Srinivas & Fleuret 2019 (FullGrad)",
                   "input-gradient plus bias-gradients of all conv/BN layers"),
        MethodInfo("rollout", "rollout", False, "attention-blocks", "Abnar & Zuidema 2020 (attention rollout)",
                   "attention rollout from the class token (target ignored)", target_dependent=False,
                   vit_only=True),
        MethodInfo("grad-rollout", "rollout", True, "attention-blocks", "Gildenblat (vit-explain)",
                   "gradient-weighted attention rollout", vit_only=True),
    )
}

#: Accepted spellings -> canonical names.
ALIASES: dict[str, str] = {
    "grad-cam": "gradcam", "gradcampp": "gradcam++", "gradcamplusplus": "gradcam++", "grad-cam++": "gradcam++",
    "x-gradcam": "xgradcam", "layer-cam": "layercam", "eigen-cam": "eigencam", "eigen-gradcam": "eigengradcam",
    "score-cam": "scorecam", "ablation-cam": "ablationcam", "full-grad": "fullgrad", "attention-rollout": "rollout",
    "gradrollout": "grad-rollout", "gar": "grad-rollout", "grad_rollout": "grad-rollout",
}


def method_names() -> tuple[str, ...]:
    """The canonical method names, in the table's order."""
    return tuple(METHODS)


def canonical_method(name: str) -> str | None:
    """The canonical name of ``name`` (aliases and case accepted), or None when unknown."""
    key = str(name).strip().lower()
    key = ALIASES.get(key, key)
    return key if key in METHODS else None


def method_info(name: str) -> MethodInfo:
    """The :class:`MethodInfo` of ``name`` (aliases accepted), or a :class:`SaliencyError` listing the methods."""
    key = canonical_method(name)
    if key is None:
        raise SaliencyError(f"unknown saliency method {name!r}; methods: {', '.join(METHODS)}")
    return METHODS[key]
