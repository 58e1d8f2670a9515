"""A hand-built shape reader for the fill-control world (tests/test_fill_control_world.py, issue 45).

It reads shapes only: the class is the silhouette whose outline best stands out on the image's edge
map. Per pixel the edge strength is ``e = sum_c |x[y+1, x, c] - x[y, x, c]| + |x[y, x+1, c] - x[y, x, c]|``
(forward differences over the three channels; 0 past the last row and column). A template is a class's
silhouette (:func:`curate.collect.world_draw.draw_mask`) at one radius and rotation; its kernel is the mean
of ``e`` on the silhouette's outline minus the mean of ``e`` on a band around it (``GAP`` pixels away,
``WIDTH`` wide, inside and outside), so a uniformly textured region scores 0 and an outline that stands out
from its surroundings scores high. A class's score is the best of its templates over every position where
the template fits inside the image; the prediction is the class with the highest score.

It has no weights and no randomness: the same image gives the same answer on every machine (a trained
model's answer moves with the CPU's floats, issue 48). It knows nothing of backgrounds, fills or the
interventions, so what a filled hole does to it is what the hole's pixels show.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
from PIL import Image

from curate.collect.world_draw import draw_mask, eroded
from curate.runs.evaluation import EvaluationRun
from curate.store import Dataset

#: Template radii (pixels at 48 px: the world's objects span about 4 to 18) and rotations (radians).
RADII: tuple[float, ...] = tuple(np.arange(4.0, 18.5, 1.5))
ANGLES: tuple[float, ...] = (-0.2, 0.0, 0.2)
GAP, WIDTH = 2, 2


class _Pose:
    """Stands in for draw_mask's generator: its angle and radius draws return the given values, the
    centre offset 0 (draw_mask draws angle, radius, centre, in that order)."""

    def __init__(self, angle: float, radius_share: float) -> None:
        self.values = [angle, radius_share]

    def uniform(self, low: float, high: float, size: int | None = None) -> float | np.ndarray:
        return np.zeros(size) if size is not None else self.values.pop(0)


def _grown(mask: np.ndarray, steps: int) -> np.ndarray:
    for _ in range(steps):
        mask = ~eroded(~mask)
    return mask


def _shrunk(mask: np.ndarray, steps: int) -> np.ndarray:
    for _ in range(steps):
        mask = eroded(mask)
    return mask


def template(shape: str, radius: float, angle: float, size: int = 48) -> np.ndarray:
    """The kernel of one template: 1/|outline| on the outline, -1/|band| on the band, 0 elsewhere."""
    drawn = draw_mask(shape, size, _Pose(angle, radius / size)).astype(bool)
    ys, xs = np.nonzero(drawn)
    pad = GAP + WIDTH + 1
    m = np.pad(drawn[ys.min():ys.max() + 1, xs.min():xs.max() + 1], pad)
    outline = m & ~eroded(m)
    band = (_grown(m, GAP + WIDTH) & ~_grown(m, GAP)) | (_shrunk(m, GAP) & ~_shrunk(m, GAP + WIDTH))
    return outline / outline.sum() - band / max(int(band.sum()), 1)


def edge_map(image: np.ndarray) -> np.ndarray:
    """The edge strength ``e`` of the module docstring (float32, H x W)."""
    x = image.astype(np.float32)
    dy = np.abs(np.diff(x, axis=0, append=x[-1:]))
    dx = np.abs(np.diff(x, axis=1, append=x[:, -1:]))
    return (dy + dx).sum(axis=-1)


class ShapeReader:
    """Scores images of ``size`` px against the silhouettes ``shapes`` (one per class, in order)."""

    def __init__(self, shapes: Sequence[str], size: int = 48) -> None:
        self.size = size
        kernels, owners = [], []
        for index, shape in enumerate(shapes):
            for radius in RADII:
                for angle in ANGLES:
                    kernels.append(template(shape, radius, angle, size)[::-1, ::-1])
                    owners.append(index)
        self.owners = np.array(owners)
        self.n_classes = len(shapes)
        padded = np.zeros((len(kernels), size, size), np.float32)
        valid = np.zeros((len(kernels), size, size), bool)
        for i, kernel in enumerate(kernels):
            kh, kw = kernel.shape
            if kh > size or kw > size:
                raise ValueError(f"a template of {kh} x {kw} does not fit a {size}-px image")
            padded[i, :kh, :kw] = kernel
            valid[i, kh - 1:, kw - 1:] = True  # where the template lies inside the image (circular = linear there)
        self.spectra = np.fft.rfft2(padded).astype(np.complex64)
        self.valid = valid

    def scores(self, images: np.ndarray) -> np.ndarray:
        """(n, classes) scores of a stack of uint8 images (n, H, W, 3)."""
        edges = np.stack([edge_map(image) for image in images])
        responses = np.fft.irfft2(np.fft.rfft2(edges)[:, None] * self.spectra[None], s=(self.size, self.size))
        best = np.where(self.valid[None], responses, -np.inf).reshape(len(images), len(self.owners), -1).max(axis=2)
        out = np.full((len(images), self.n_classes), -np.inf)
        for c in range(self.n_classes):
            out[:, c] = best[:, self.owners == c].max(axis=1)
        return out

    def predict(self, images: np.ndarray, chunk: int = 16) -> np.ndarray:
        """The predicted class position (0..classes-1) of each image."""
        return np.concatenate([self.scores(images[i:i + chunk]).argmax(axis=1) for i in range(0, len(images), chunk)])


def write_evaluation(folder: Path, reader: ShapeReader, class_indices: Sequence[int], sample_ids: Sequence[str],
                     name: str = "reader") -> None:
    """Score ``sample_ids`` of the dataset folder with ``reader`` and write the result as an evaluation run
    ``folder/runs/<name>`` (what ``curate attribution`` reads: top-1 correctness per image)."""
    ds = Dataset.open(folder)
    rows = {r["sample_id"]: r for r in ds.rows()}
    chosen = [rows[s] for s in sample_ids]
    images = np.stack([np.asarray(Image.open(ds.image_path(r)).convert("RGB")) for r in chosen])
    labels = [int(class_indices[p]) for p in reader.predict(images)]
    correct = [label == int(r["class_index"]) for label, r in zip(labels, chosen)]
    table = pa.table({
        "sample_id": [r["sample_id"] for r in chosen], "class_index": [r["class_index"] for r in chosen],
        "group": [r["group"] for r in chosen], "background": [r["background"] for r in chosen],
        "topk_labels": [[label] for label in labels], "topk_scores": [[1.0] for _ in chosen],
        "correct1": correct, "correct5": correct,
    })
    EvaluationRun(model={"name": name, "pretrained": None, "model_id": f"hand-built:{name}", "family": "clip"},
                  label_space={"name": "imagenet1k"}, prompts={"name": "none", "templates": []},
                  settings={}, dataset={}, predictions_table=table,
                  metrics={"overall": {}, "label_space": "imagenet1k", "candidates_per_sample": len(class_indices)},
                  ).write(folder / "runs" / name)
