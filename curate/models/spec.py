"""What a user names when they name a model: :class:`ModelSpec`.

Every stage takes a model as a :class:`ModelSpec` (or an already loaded model); the CLI builds
specs once, at its edge, from ``--model`` / ``--pretrained``. Loading is
:func:`curate.models.load_model`'s job.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ModelSpec", "FAMILIES", "PREPROCESS_KEYS", "family_of_kind", "parse_pretrained", "specs_from_cli",
           "split_preprocess", "with_preprocess"]

#: Model families; effective robustness is fitted within one family (papers/003 Fig. 2).
FAMILIES = ("clip", "classifier", "lvlm")
_WEIGHT_SUFFIXES = (".pt", ".pth", ".bin", ".safetensors")


def family_of_kind(kind: str) -> str:
    """The family of a loaded model's ``kind`` (``clip``, ``classifier``, ``lvlm``)."""
    if kind not in FAMILIES:
        raise ValueError(f"unknown model kind {kind!r}; families are {', '.join(FAMILIES)}")
    return kind


def parse_pretrained(text: str | None) -> str | None:
    """``--pretrained`` text: ``None`` for empty or ``none`` (random weights), else the tag or file."""
    return None if (text or "").strip().lower() in ("", "none") else text


#: The eval preprocessing a timm classifier's name may override (:func:`with_preprocess`).
PREPROCESS_KEYS = ("mean", "std", "size", "interpolation")
INTERPOLATIONS = ("bicubic", "bilinear", "nearest", "lanczos", "box", "hamming")


def _numbers(text: str, count: tuple[int, ...], what: str, name: str) -> tuple[float, ...]:
    parts = [p for p in str(text).replace(",", "/").replace("x", "/").split("/") if p.strip()]
    try:
        values = tuple(float(p) for p in parts)
    except ValueError:
        values = ()
    if len(values) not in count:
        raise ValueError(f"model {name!r}: {what} needs {' or '.join(map(str, count))} numbers, got {text!r}")
    return values


def split_preprocess(name: str) -> tuple[str, dict[str, object]]:
    """``"timm:NAME#mean=R/G/B,std=R/G/B,size=N|HxW,interpolation=MODE"`` -> ``("timm:NAME", overrides)``.

    ``overrides`` holds ``mean`` and ``std`` (3 floats, of pixels in [0, 1]; std > 0), ``size``
    (``(H, W)``: the model's input, after the resize and centre crop) and ``interpolation`` (one of
    :data:`INTERPOLATIONS`) as given; a name without ``#``, or not ``timm:``, has none.

    Raises:
        ValueError: an unknown key or a malformed value.
    """
    base, sep, options = name.partition("#")
    if not sep or base.partition(":")[0] != "timm":  # other names keep their '#' (endpoint:URL#NAME)
        return name, {}
    overrides: dict[str, object] = {}
    for item in (i.strip() for i in options.split(",") if i.strip()):
        key, eq, value = (part.strip() for part in item.partition("="))
        if key not in PREPROCESS_KEYS or not eq:
            raise ValueError(f"model {name!r}: unknown preprocessing option {item!r}; options: "
                             f"{', '.join(k + '=' for k in PREPROCESS_KEYS)}")
        if key in ("mean", "std"):
            values = _numbers(value, (3,), key, name)
            if key == "std" and min(values) <= 0:
                raise ValueError(f"model {name!r}: std must be > 0, got {value!r}")
            overrides[key] = values
        elif key == "size":
            hw = _numbers(value, (1, 2), "size (N or HxW)", name)
            if min(hw) < 1 or any(v != int(v) for v in hw):
                raise ValueError(f"model {name!r}: size needs whole pixels, got {value!r}")
            overrides[key] = (int(hw[0]), int(hw[-1]))
        elif value.lower() not in INTERPOLATIONS:
            raise ValueError(f"model {name!r}: interpolation {value!r} is not one of {', '.join(INTERPOLATIONS)}")
        else:
            overrides[key] = value.lower()
    return base, overrides


def with_preprocess(name: str, *, mean: str | Sequence[float] | None = None, std: str | Sequence[float] | None = None,
                    size: str | int | Sequence[int] | None = None, interpolation: str | None = None) -> str:
    """``name`` with eval-preprocessing overrides for a classifier trained with other preprocessing
    than its timm architecture's default (``--mean``, ``--std``, ``--input-size``, ``--interpolation``):
    ``timm:NAME#mean=0.5/0.5/0.5,...`` (:func:`split_preprocess` reads and checks it). Options
    already in ``name`` are kept unless given again."""
    def text(value: object) -> str:
        if isinstance(value, str):
            return value.strip().replace(",", "/")
        if isinstance(value, int):
            return str(value)
        return "/".join(f"{v:g}" if isinstance(v, float) else str(v) for v in value)  # type: ignore[union-attr]

    base, current = split_preprocess(name)
    given = {"mean": mean, "std": std, "size": size, "interpolation": interpolation}
    if all(v is None for v in given.values()):
        return name
    if base.partition(":")[0] != "timm":
        raise ValueError(f"model {name!r}: --mean, --std, --input-size and --interpolation are for timm: classifiers "
                         "(e.g. --model timm:tf_efficientnet_lite0 --pretrained FILE --mean 0.5,0.5,0.5)")
    items = {k: text(v) for k, v in given.items() if v is not None}
    old = name.partition("#")[2] if current else ""
    kept = [i for i in old.split(",") if i.strip() and i.partition("=")[0].strip() not in items]
    result = f"{base}#{','.join(kept + [f'{k}={v}' for k, v in items.items()])}"
    split_preprocess(result)
    return result


@dataclass(frozen=True)
class ModelSpec:
    """A model to load: a name (open_clip arch, zoo name, ``timm:<name>``, ``auto``) and weights.

    A ``timm:`` name may carry eval-preprocessing overrides (``timm:NAME#mean=...,std=...,size=...,
    interpolation=...``; :func:`with_preprocess` writes them, :attr:`preprocess` reads them): they
    travel with the name to every worker that loads the model and into every run's record.
    """

    name: str
    pretrained: str | None = None

    @property
    def preprocess(self) -> dict[str, object]:
        """The name's eval-preprocessing overrides (:func:`split_preprocess`; ``{}`` when none)."""
        return split_preprocess(self.name)[1]

    def with_preprocess(self, **overrides: object) -> ModelSpec:
        """This spec with preprocessing overrides (:func:`with_preprocess`'s keywords)."""
        return ModelSpec(with_preprocess(self.name, **overrides), self.pretrained)  # type: ignore[arg-type]

    @property
    def label(self) -> str:
        """``name:tag`` (a weights file shows as its file name; ``auto`` shows only the file)."""
        if not self.pretrained:
            return self.name
        looks_like_file = "/" in self.pretrained or self.pretrained.endswith(_WEIGHT_SUFFIXES)
        weights = Path(self.pretrained).name if looks_like_file else self.pretrained
        return weights if self.name in ("auto", "") else f"{self.name}:{weights}"

    def to_dict(self) -> dict[str, str | None]:
        return {"name": self.name, "pretrained": self.pretrained}

    @classmethod
    def from_dict(cls, data: dict) -> ModelSpec:
        return cls(str(data["name"]), data.get("pretrained"))


def specs_from_cli(models: Sequence[str], pretrained: Sequence[str], *, option: str = "--pretrained") -> list[ModelSpec]:
    """One spec per ``--model``; ``pretrained`` is empty or has one entry per model."""
    if pretrained and len(pretrained) != len(models):
        raise ValueError(f"give one {option} per --model ({len(models)} models, {len(pretrained)} weights)")
    tags = [parse_pretrained(p) for p in pretrained] if pretrained else [None] * len(models)
    return [ModelSpec(m, t) for m, t in zip(models, tags)]
