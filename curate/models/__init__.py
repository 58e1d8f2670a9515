"""Loading CLIPs and ImageNet classifiers by name, offline (DESIGN.md, "Models").

>>> from curate.models import load_model
>>> m = load_model("CLIP-LAION400M-ViT-B/32")          # zoo name -> ViT-B-32-quickgelu:laion400m_e31
>>> m = load_model("curate-tiny-clip", "ref.pt")        # a local weights file
>>> m = load_model("timm:resnet50", "a1_in1k")          # an ImageNet-1K classifier

Modules: ``base`` (the :class:`LoadedModel` interface, errors), ``zoo`` (paper names),
``weights`` (finding weights on disk, reading weight files), ``clip`` (open_clip),
``classifier`` (timm), ``registry`` (backends by name prefix), ``loader`` (:func:`load_model`),
``tiny`` (tiny configs for tests and the offline reference CLIP).

Importing this package is cheap: torch, open_clip and timm load on the first ``load_model``.
"""

from __future__ import annotations

from curate.models.base import (
    PRECISIONS,
    LoadedModel,
    ModelError,
    ModelNotFoundError,
    QuickGELUWarning,
    WeightsNotFoundError,
)
from curate.models.loader import load_model, parse_model_name
from curate.models.registry import ModelRequest, backends, register_backend
from curate.models.spec import FAMILIES, ModelSpec, family_of_kind, parse_pretrained, specs_from_cli
from curate.models.tiny import TINY_CONFIGS, register_tiny_configs
from curate.models.zoo import ZooEntry, load_zoo, paper_name, resolve_zoo_name, zoo_names

__all__ = [
    "FAMILIES",
    "PRECISIONS",
    "ModelSpec",
    "family_of_kind",
    "parse_pretrained",
    "specs_from_cli",
    "LoadedModel",
    "ModelError",
    "ModelNotFoundError",
    "ModelRequest",
    "QuickGELUWarning",
    "TINY_CONFIGS",
    "WeightsNotFoundError",
    "ZooEntry",
    "backends",
    "load_model",
    "load_zoo",
    "paper_name",
    "parse_model_name",
    "register_backend",
    "register_tiny_configs",
    "resolve_zoo_name",
    "zoo_names",
]
