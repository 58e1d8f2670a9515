"""Worlds where the answer is known: check the decomposition before trusting it on photos.

Four synthetic worlds (:mod:`curate.collect.synthetic`), built by :func:`build_world`, each with
its groups set from the truth (easy = the class's common background, hard = any other):

- ``background``: hard photos differ from easy ones by background only. A model that leans on the
  background (trained with p = 0.9) loses accuracy on hard photos and gets it back when the hard
  objects are moved onto easy backgrounds: B is close to D, the rest close to 0.
- ``confound``: hard photos also show the object at ``scale`` (default 0.45) of its size. For a
  model that ignores backgrounds (trained without the correlation) the drop is all object scale:
  B is close to 0, the rest close to D.
- ``mixed``: hard photos show the object at ``scale`` (default 0.6), scored by a model that leans
  on the background: both act, and each part should match its share in the exact counterfactuals.
- ``ghost``: hard objects at 0.3 of the easy ones' size, scored by the shape-only model: a swap
  leaves about 90 % of the easy donor's hole uncovered, and what a fill leaves of the donor
  object's outline (the *ghost*, an object of the same class) is class evidence the model can
  read. Where the ghost control (``ghost_bias``) has to catch a fill that keeps the outline
  (OpenCV's inpainting) and where covered donors and the tiled fill must bring B to the truth.

All four draw the outline the same on every background (``outline="double"``), so the object's
pixels do not depend on the background and a pasted object is exactly what the generator would
draw on the donor's background; the only gaps left between an intervention and the truth are the
method's own (the donor's filled hole, the donor's texture, which donors were drawn). The
demo's p = 0.9 evaluation world uses the default contrast outline, whose colour does depend on the
background: there the paste control and the rest show what that costs (docs/science.md).

:func:`write_truth` renders the exact counterfactual of every swap an intervention made: the same
object (silhouette, pose, position, fill) re-drawn by the generator on the donor's background
label, with nothing pasted and nothing filled. It writes them as an intervention folder of its
own (``truth: true`` in its record), so ``curate evaluate`` and ``curate attribution`` give the
true B beside the estimated one, photo for photo.
"""
from __future__ import annotations

import hashlib
from dataclasses import replace
from pathlib import Path
from typing import Any

from curate.collect.synthetic import (
    DEFAULT_CLASSES,
    WorldSpec,
    assign_truth_groups,
    collect_synthetic,
    png_bytes,
    render_counterfactual,
    world_spec_of,
)

__all__ = ["WORLD_KINDS", "SCALES", "world_spec", "build_world", "write_truth", "source_index"]

WORLD_KINDS: tuple[str, ...] = ("background", "confound", "mixed", "ghost")
#: The object scale of hard photos per world (measured with the demo's models at 48 px, per_class
#: 60: the shape-only model loses 59 points on hard photos of the confound world; the p = 0.9 model
#: 82 on the mixed world, 64 of them from the background).
SCALES: dict[str, float] = {"background": 1.0, "confound": 0.45, "mixed": 0.6, "ghost": 0.3}


def world_spec(kind: str, *, per_class: int = 60, seed: int = 3000, num_classes: int = 6, image_size: int = 48,
               scale: float | None = None) -> WorldSpec:
    """The :class:`WorldSpec` of an intervention world (module docstring); p = 0.5 so easy and hard
    photos are about as many; ``scale`` overrides the world's object scale for hard photos."""
    if kind not in WORLD_KINDS:
        raise ValueError(f"unknown world {kind!r}; known: {', '.join(WORLD_KINDS)}")
    base = WorldSpec(classes=DEFAULT_CLASSES[:num_classes], per_class=per_class, image_size=image_size, seed=seed,
                     p=0.5, outline="double")
    return replace(base, uncommon_scale=SCALES[kind] if scale is None else float(scale))


def build_world(kind: str, root: str | Path, **spec_options: Any) -> Any:
    """Write the world ``kind`` into the dataset folder ``root`` with its truth groups; returns the
    :class:`curate.store.Dataset`. ``spec_options`` go to :func:`world_spec`."""
    ds = collect_synthetic(root, world_spec(kind, **spec_options), name=Path(root).name)
    assign_truth_groups(ds)
    return ds


def source_index(row: dict[str, Any]) -> int:
    """The world index of a synthetic sample (its ``source_id`` is ``<seed>:<index>``)."""
    if row.get("source") != "synthetic" or ":" not in str(row.get("source_id") or ""):
        raise ValueError(f"sample {row.get('sample_id')} is not from a synthetic world")
    return int(str(row["source_id"]).rsplit(":", 1)[1])


def write_truth(world: Any, intervention_folder: str | Path, out: str | Path, *, run_name: str = "intervene",
                same_donors: bool = False) -> Any:
    """The exact counterfactuals of an intervention's swaps, as an intervention folder ``out``.

    ``world``: the synthetic world (folder or Dataset) the intervention was made from;
    ``intervention_folder``: its ``curate intervene`` output. For every ``swap`` image there, the
    same object is re-rendered by the generator on the donor's background label; originals are
    copied. With ``same_donors`` the object is re-drawn on each swap's own donor photo's background
    (its texture draw, no hole, nothing filled: :func:`curate.collect.synthetic.render_counterfactual`'s
    ``background_of``), so a swap and its truth differ only by the donor's filled hole (issue 45: the
    fill control's validating world); otherwise on a fresh texture of the donor's background kind.
    Returns the :class:`curate.runs.InterventionRun` written into ``out``.
    """
    from curate.runs.base import prepare_run_dir
    from curate.runs.interventions import InterventionRun, variants_table
    from curate.store import Dataset, NewSample
    from curate.store.schema import sample_id_for

    ds = world if isinstance(world, Dataset) else Dataset.open(Path(world))
    spec = world_spec_of(ds)
    made = InterventionRun.of_folder(Path(intervention_folder))
    rows = {r["sample_id"]: r for r in ds.rows()}
    out = Path(out)
    target = Dataset.open(out) if (out / "dataset.yaml").exists() else Dataset.create(
        out, name=out.name, label_space=ds.label_space, backgrounds=list(ds.backgrounds), recipe="intervention-truth")
    table_rows: list[dict[str, Any]] = []
    samples = []
    for row in made.rows():
        if row["variant"] not in ("original", "swap"):
            continue
        source = rows.get(row["source_sample_id"])
        if source is None:
            raise ValueError(f"{row['source_sample_id']} is not in {ds.root}: give the world the intervention was made from")
        if row["variant"] == "original":
            data = Path(ds.image_path(source)).read_bytes()
            background = source["background"]
        else:
            donor = rows.get(row.get("donor_sample_id")) if same_donors else None
            if same_donors and donor is None:
                raise ValueError(f"the donor of {row['sample_id']} is not in {ds.root}: give the world the intervention "
                                 "was made from")
            sample = (render_counterfactual(spec, source_index(source), background_of=source_index(donor))
                      if donor is not None else
                      render_counterfactual(spec, source_index(source), background=row["background"]))
            data, background = png_bytes(sample.image), sample.background
        sid = sample_id_for(hashlib.sha256(data).hexdigest())
        samples.append(NewSample(image=data, class_index=int(source["class_index"]), source="intervention",
                                 source_id=f"truth:{source['sample_id']}:{row['variant']}:{row['k']}",
                                 license=source["license"], attribution=source["attribution"], status="accepted",
                                 background=background, background_source="synthetic",
                                 group=row["group"] if row["variant"] == "original" else None,
                                 extra={"intervention": {"variant": row["variant"], "truth": True,
                                                         "source_sample_id": source["sample_id"]}},
                                 added_at=source["added_at"]))
        table_rows.append({**row, "sample_id": sid, "filled_fraction": 0.0, "fill": None})
    target.add_samples(samples, actor="intervene.truth")
    record = InterventionRun(config={
        "source": {**made.source, "intervention": str(Path(intervention_folder).resolve())},
        "settings": made.settings, "counts": {"sources": made.counts.get("sources"),
                                              "images": len({r["sample_id"] for r in table_rows})},
        "masks": made.masks, "adversarial_set": [], "truth": True}, variants_rows=variants_table(table_rows))
    record.write(prepare_run_dir(target.root, run_name, overwrite=True))
    return record
