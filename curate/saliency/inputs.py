"""Inputs shared by the saliency pipelines (``curate explain``, ``curate fidelity``).

- :func:`open_masked_dataset`: open a dataset folder, tolerating problems that touch only masks;
- :func:`resolve_model`: a loaded model from a model, a name (+ pretrained) or a weights file;
- :func:`model_class_names` / :func:`prompt_set_for`: the class names and prompt templates a
  (curate-trained) CLIP knows;
- :class:`MaskedImages` + :func:`collate_masked`: decoded, preprocessed images with their masks
  carried onto the model's input grid (:mod:`curate.saliency.masks`), damaged files reported per
  sample in ``problem`` instead of raising;
- :class:`MaskedDecode`: the same for one batch of rows, picklable, so an engine runs it in its
  loader workers (``curate explain``: DataLoader processes or Ray CPU tasks), not in the process
  that runs the model;
- :data:`UNTRUSTED_MASK_REASONS`: how the pipelines name the samples whose mask they may not use
  (the rule is :func:`curate.masks.sources.is_trusted`; the error when every mask of a selection
  is an unverified model proposal is :func:`curate.masks.sources.untrusted_masks_message`).
"""
from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from curate.saliency.masks import check_mask, input_mask

if TYPE_CHECKING:  # pragma: no cover
    from curate.models.base import LoadedModel
    from curate.store import Dataset

logger = logging.getLogger(__name__)

#: The skip reason of a sample whose mask a mask-based number may not use, by the mask's source
#: (:func:`curate.masks.sources.mask_source`): an unverified model proposal (without
#: ``allow_model_masks``) or a mask reviewers marked bad.
UNTRUSTED_MASK_REASONS: dict[str, str] = {"model": "model_mask", "rejected": "rejected_mask"}


def open_masked_dataset(dataset: Dataset | str | Path) -> Dataset:
    """Open (validating) a dataset folder; problems that touch only masks are handled per sample.

    ``Dataset.open`` refuses a folder with a mask of the wrong size or a missing mask file. Such
    masks are exactly what explain handles sample by sample (resized, or skipped and counted in
    ``summary.json``), so a folder whose only errors are in ``mask_path`` is opened without row
    validation, with a warning; any other problem still refuses it.
    """
    from curate.store import Dataset, DatasetError

    if isinstance(dataset, Dataset):
        return dataset
    try:
        return Dataset.open(Path(dataset))
    except DatasetError as error:
        problems = [p for p in error.problems if getattr(p, "severity", "error") == "error"]
        if not problems or any(getattr(p, "column", None) != "mask_path" for p in problems):
            raise
        logger.warning("%s: %d mask problems (e.g. %s); those samples are resized or skipped and counted",
                       dataset, len(problems), problems[0])
        return Dataset.open(Path(dataset), validate=False)


def resolve_model(model: LoadedModel | str | Path, pretrained: Any, device: Any, precision: str) -> LoadedModel:
    from curate.models import load_model
    from curate.models.base import LoadedModel
    from curate.models.weights import looks_like_path

    if isinstance(model, LoadedModel):
        return model
    if isinstance(model, Path) or (isinstance(model, str) and pretrained is None and looks_like_path(model)):
        return load_model("auto", Path(model), device=device or "cpu", precision=precision)
    return load_model(str(model), pretrained, device=device or "cpu", precision=precision)


def model_class_names(model: LoadedModel) -> dict[int, str]:
    """Class names a curate-trained reference CLIP was trained with (index -> name), if recorded.

    ``curate train-reference`` records the world's classes in the weights file; their names
    (e.g. "ice bear") can differ from the label space's display names ("polar bear"), and the
    model only knows the ones it was trained with.
    """
    meta = (model.info or {}).get("metadata") or {}
    classes = ((meta.get("meta") or {}).get("world") or {}).get("classes") or []
    out: dict[int, str] = {}
    for entry in classes:
        if isinstance(entry, Mapping) and "index" in entry and "name" in entry:
            out[int(entry["index"])] = str(entry["name"])
    return out


def prompt_set_for(model: LoadedModel, prompts: Any):
    from curate.zeroshot import PromptSet, load_prompts

    if isinstance(prompts, PromptSet):
        return prompts
    if prompts is None:
        template = ((model.info or {}).get("metadata") or {}).get("caption_template")
        if isinstance(template, str) and template.count("{}") == 1:
            return PromptSet("model", (template,))
        return load_prompts("simple")
    return load_prompts(str(prompts))


def row_extra(row: Mapping[str, Any]) -> dict[str, Any]:
    try:
        value = json.loads(row.get("extra") or "{}")
    except (TypeError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


class MaskedImages(torch.utils.data.Dataset):
    """Decoded, preprocessed image and input-aligned mask of each row (DataLoader-friendly)."""

    def __init__(self, ds: Dataset, rows: list[dict[str, Any]], preprocess: Callable,
                 mask_fn: Callable, size: tuple[int, int], paths: list[Path] | None = None) -> None:
        self.ds = ds
        self.rows = rows
        self.preprocess = preprocess
        self.mask_fn = mask_fn
        self.size = size
        #: the rows' image paths, resolved and checked for all of them at once
        #: (``Dataset.image_paths``); None: each row's resolved when it is read
        self.paths = paths

    def _image(self, i: int):
        if self.paths is None:
            return self.ds.load_image(self.rows[i])
        from PIL import Image

        with Image.open(self.paths[i]) as img:  # what Dataset.load_image does with the same path
            return img.convert("RGB")

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, Any]:
        row = self.rows[i]
        blank = {"index": i, "image": torch.zeros(3, *self.size), "mask": torch.zeros(self.size, dtype=torch.bool),
                 "problem": "", "instance_ids": False}
        try:
            image = self._image(i)
        except Exception as error:  # noqa: BLE001 - a damaged file is a counted skip
            logger.warning("cannot read image of %s: %s", row["sample_id"], error)
            return {**blank, "problem": "image_unreadable"}
        try:
            raw = self.ds.load_mask(row)
        except Exception as error:  # noqa: BLE001
            logger.warning("cannot read mask of %s: %s", row["sample_id"], error)
            return {**blank, "problem": "mask_unreadable"}
        if raw is None:
            return {**blank, "problem": "no_mask"}
        binary, problem, instance_ids = check_mask(raw, image.size)
        if binary is None:
            return {**blank, "problem": problem or "mask_size_mismatch", "instance_ids": instance_ids}
        return {
            "index": i,
            "image": self.preprocess(image.convert("RGB")),
            "mask": input_mask(self.mask_fn, binary, self.size),
            "problem": problem or "",
            "instance_ids": instance_ids,
        }


class MaskedDecode:
    """A batch decode (``curate.engine.base.BatchJob.decode``): one batch of rows -> the collated
    images and input-aligned masks of :class:`MaskedImages` (``index``, ``image``, ``mask``,
    ``problem``, ``instance_ids``) plus each row's label (``labels``; -1: none).

    Picklable and self-contained, so it runs where the engine decodes: the local engine's
    DataLoader worker processes, or Ray CPU tasks. The batch's image paths are resolved and
    checked in one ``Dataset.image_paths`` call; when that refuses one of them (a path that
    escapes the folder), each row is resolved on its own, so only that row is reported
    (``image_unreadable``), never the batch. The tensors do not depend on where it ran
    (``tests/test_feed_explain_loader.py``: 0 and 2 workers give equal tensors)."""

    def __init__(self, ds: Dataset, preprocess: Callable, mask_fn: Callable, size: tuple[int, int]) -> None:
        self.ds, self.preprocess, self.mask_fn, self.size = ds, preprocess, mask_fn, size

    def __call__(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        paths = None
        many = getattr(self.ds, "image_paths", None)
        if callable(many):
            try:
                paths = list(many(rows))
            except Exception as error:  # noqa: BLE001 - one refused path: resolve row by row below
                logger.debug("batch path check refused (%s); resolving each row", error)
        items = MaskedImages(self.ds, rows, self.preprocess, self.mask_fn, self.size, paths)
        batch = collate_masked([items[i] for i in range(len(items))])
        batch["labels"] = [r["class_index"] if r.get("class_index") is not None else -1 for r in rows]
        return batch


def collate_masked(items: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "index": [it["index"] for it in items],
        "image": torch.stack([it["image"] for it in items]),
        "mask": torch.stack([it["mask"] for it in items]),
        "problem": [it["problem"] for it in items],
        "instance_ids": [it["instance_ids"] for it in items],
    }
