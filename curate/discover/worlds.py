"""Worlds where the hidden backgrounds are known: check discovery before trusting it on photos.

- :func:`planted_world`: a synthetic world (:mod:`curate.collect.synthetic`) whose classes show
  their common background most of the time and the other backgrounds otherwise, one of which,
  ``hidden`` (default ``road``), is **not in the folder's vocabulary**: its photos carry no
  background label at all (the truth stays in ``extra.true_background``, which discovery never
  reads). Discovery should find, in every class, the group of ``hidden`` photos and name it.
- :func:`null_world`: every photo of a class shows the class's own background (p = 1): nothing
  within a class differs but noise, so discovery should propose no significant group.
- :func:`train_naming_clip`: the tiny CLIP that embeds and names. A web CLIP has read captions
  about roads and snow; a tiny one trained only on class captions has not, and could name
  nothing. So it is trained (:func:`curate.train_reference.train_reference_clip`, from random
  weights) on a p = 0.9 world holding every background, each image twice: once with its class
  caption and once with its background's caption ("a photo of a road."). The class captions
  make it a reference that leans on the background (p = 0.9), the background captions give its
  text tower the words. The phrase bank is never shown to it, except that the background words
  it learned appear in the bank too (as any scene word a web CLIP knows would).
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from curate.collect.synthetic import DEFAULT_CLASSES, WorldSpec, collect_synthetic, generate_world

__all__ = ["HIDDEN", "planted_spec", "planted_world", "null_world", "naming_spec", "naming_arrays", "train_naming_clip",
           "truth_of", "measure_recovery"]

#: The planted background nobody listed (a synthetic texture; ``datasets/phrases.txt`` says it "a road").
HIDDEN = "road"
#: The phrase of each synthetic background, as the naming CLIP's captions say it (its first
#: template "a photo of a {}." makes "a photo of a road.", the bank's "a road" in its template).
CAPTION_WORDS = {"snow": "snow", "water": "water", "sky": "sky", "grass": "grass", "sand": "sand", "rock": "rock",
                 "earth": "earth", "tree": "tree", "indoor": "room", "road": "road"}
TRUE_BACKGROUND = "true_background"


def planted_spec(*, per_class: int = 80, seed: int = 4100, num_classes: int = 3, image_size: int = 48,
                 p: float = 0.5, hidden: str = HIDDEN) -> WorldSpec:
    """Classes with their common backgrounds plus ``hidden``; p = 0.5 (module docstring)."""
    classes = DEFAULT_CLASSES[:num_classes]
    backgrounds = tuple(dict.fromkeys([c.common_background for c in classes] + [hidden]))
    return WorldSpec(classes=classes, backgrounds=backgrounds, p=p, per_class=per_class, image_size=image_size,
                     seed=seed, outline="double")


def _hide(ds: Any, hidden: str) -> int:
    """Move ``hidden`` labels into ``extra.true_background`` and clear them; returns how many."""
    import json

    per_sample = {}
    for row in ds.rows():
        extra = json.loads(row["extra"] or "{}")
        extra[TRUE_BACKGROUND] = row["background"]
        fields: dict[str, Any] = {"extra": extra}
        if row["background"] == hidden:
            fields.update(background=None, background_source=None, background_score=None)
        per_sample[row["sample_id"]] = fields
    ds.update(list(per_sample), per_sample=per_sample, actor="discover.worlds", reason="planted hidden background")
    return sum(1 for f in per_sample.values() if "background" in f)


def planted_world(root: str | Path, *, hidden: str = HIDDEN, **spec_options: Any) -> Any:
    """Write the planted world into ``root`` with ``hidden`` out of the vocabulary and its labels
    cleared; returns the :class:`curate.store.Dataset`."""
    from curate.store import Dataset

    spec = planted_spec(hidden=hidden, **spec_options)
    root = Path(root)
    listed = [b for b in spec.backgrounds if b != hidden]
    Dataset.create(root, name=root.name, backgrounds=listed + [hidden], recipe="synthetic")
    ds = collect_synthetic(root, spec)
    _hide(ds, hidden)
    # the vocabulary as a collector would have listed it: without the hidden background
    import yaml

    config_path = root / "dataset.yaml"
    config = yaml.safe_load(config_path.read_text(encoding="utf-8"))
    config["backgrounds"] = listed
    from curate.store.atomic import atomic_write_bytes

    atomic_write_bytes(root, config_path, yaml.safe_dump(config, sort_keys=False).encode())
    return Dataset.open(root)


def null_world(root: str | Path, **spec_options: Any) -> Any:
    """Every class on its own background only (p = 1): no background differs within a class."""
    spec = replace(planted_spec(**spec_options), p=1.0)
    return collect_synthetic(Path(root), spec, name=Path(root).name)


def truth_of(ds: Any) -> dict[str, str]:
    """sample id -> the background it was drawn on (``extra.true_background``)."""
    import json

    return {r["sample_id"]: json.loads(r["extra"] or "{}").get(TRUE_BACKGROUND) for r in ds.rows()}


def naming_spec(*, seed: int = 0, per_class: int = 120, num_classes: int = 3, image_size: int = 48,
                hidden: str = HIDDEN) -> WorldSpec:
    """The p = 0.9 world the naming CLIP is trained on (every background, the hidden one included)."""
    return replace(planted_spec(num_classes=num_classes, image_size=image_size, hidden=hidden), p=0.9,
                   per_class=per_class, seed=seed + 9000)


def naming_arrays(spec: WorldSpec) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """(images, labels, caption names) for the naming CLIP: each image twice, once labelled with its
    class and once with its background's word (module docstring)."""
    samples = list(generate_world(spec))
    images = np.stack([s.image for s in samples])
    class_names = [c.name for c in spec.classes]
    labels_class = np.array([spec.classes.index(s.cls) for s in samples])
    labels_background = np.array([len(class_names) + spec.backgrounds.index(s.background) for s in samples])
    return (np.concatenate([images, images]), np.concatenate([labels_class, labels_background]),
            class_names + [CAPTION_WORDS[b] for b in spec.backgrounds])


def train_naming_clip(out_path: str | Path, *, steps: int = 150, seed: int = 0, **spec_options: Any) -> Path:
    """Train the tiny naming CLIP (module docstring) and save it to ``out_path``."""
    from curate.train_reference import TrainConfig, train_reference_clip

    spec = naming_spec(seed=seed, **spec_options)
    images, labels, names = naming_arrays(spec)
    train_reference_clip(images, labels, names, Path(out_path), TrainConfig(steps=steps, seed=seed),
                         meta={"world": spec.to_dict(), "captions": "class and background"})
    return Path(out_path)


def measure_recovery(ds: Any, run: Any, *, hidden: str = HIDDEN, phrase: str = "a road") -> list[dict[str, Any]]:
    """Per class of a planted world: how well ``run`` (a :class:`curate.runs.DiscoveryRun`) found ``hidden``.

    ``ari``: adjusted Rand index of the class's discovered groups (held-out assignments; a photo in
    no group counts as its own "none" group) against the backgrounds the photos were drawn on;
    ``group``: the group with the highest Jaccard overlap with the class's ``hidden`` photos, its
    ``jaccard``, ``phrase_rank`` (1-based rank of ``phrase`` among its names, None when absent),
    ``significant``, ``gap`` and ``q``.
    """
    from curate.discover.groups import adjusted_rand_index

    truth = truth_of(ds)
    members = run.members()
    out = []
    for c in sorted({r["class_index"] for r in members}):
        rows = [r for r in members if r["class_index"] == c]
        planted = {r["sample_id"] for r in rows if truth.get(r["sample_id"]) == hidden}
        best: tuple[float, Any] = (0.0, None)
        for g in (g for g in run.groups if g.class_index == c):
            ids = set(run.member_ids(g.group_id))
            jaccard = len(ids & planted) / len(ids | planted) if ids | planted else 0.0
            if jaccard > best[0]:
                best = (jaccard, g)
        group = best[1]
        phrases = [p for p, _ in group.names] if group is not None else []
        out.append({"class_name": ds.label_space.name_of(c), "planted_photos": len(planted),
                    "ari": adjusted_rand_index([truth.get(r["sample_id"]) for r in rows],
                                               [r["group_id"] or "none" for r in rows]),
                    "group": group.group_id if group else None, "jaccard": best[0],
                    "phrase_rank": phrases.index(phrase) + 1 if phrase in phrases else None,
                    "names": phrases[:3], "significant": bool(group.significant) if group else False,
                    "gap": group.gap if group else float("nan"), "gap_ci": [group.gap_low, group.gap_high] if group
                    else [float("nan")] * 2, "q": group.q_value if group else float("nan")})
    return out
