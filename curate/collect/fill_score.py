"""Score fill candidates by their background embedding (``curate collect inat --fill RUN --model SPEC``,
docs/design.md#collection-plan).

Each candidate's photo is downloaded through the collector's client (its rate, byte and host
limits; the listing already kept only accepted licences), never into the dataset: its body is
staged in the fill job's journal (:meth:`~curate.collect.journal.Journal.stage`), where the
collector's engine takes the top ones from when it adds them, so each candidate is downloaded once
(issue 42; a killed fill resumes from the staged bodies too), encoded by the CLIP, and its
background embedding ``b`` made as ``curate discover`` makes it for photos without a trusted mask:
the whole-image embedding with the class's text direction projected out
(:func:`curate.discover.embed.project_out`). A just-listed candidate has no mask, so removal is not
possible for it, and the group photos are embedded the same way (one geometry on both sides). The
score of a candidate for group G (the other group O) is

    score = cos(b, mean_G) - cos(b, mean_O)

with ``mean_G`` / ``mean_O`` the means of the background embeddings of the class's photos in G / O
(:func:`background_score`). Higher: its background looks more like G's than O's.
"""
from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from curate.collect.engine import Candidate
from curate.collect.http import HttpError, PoliteClient
from curate.collect.journal import Journal
from curate.metrics.projection import project_out

#: How the score is made, recorded in each proposal's ``extra.proposed_for.scored_by``.
FORMULA = "cos(b, mean_group) - cos(b, mean_other); b = CLIP image embedding, class text direction projected out"


def background_score(candidates: np.ndarray, group: np.ndarray, other: np.ndarray) -> np.ndarray:
    """``cos(b, mean(group)) - cos(b, mean(other))`` for each row ``b`` of ``candidates`` (module docstring).
    An empty ``other`` counts as 0 (the score is then the cosine to the group's mean)."""
    b = np.asarray(candidates, dtype=np.float64)
    b = b / np.maximum(np.linalg.norm(b, axis=1, keepdims=True), 1e-12)

    def cos_to_mean(x: np.ndarray) -> np.ndarray:
        if len(x) == 0:
            return np.zeros(len(b))
        mean = np.asarray(x, dtype=np.float64).mean(axis=0)
        return b @ (mean / max(float(np.linalg.norm(mean)), 1e-12))

    return cos_to_mean(group) - cos_to_mean(other)


@dataclass
class EmbeddingScorer:
    """A CLIP that scores one class's candidates against its groups (module docstring)."""

    model: Any  # a loaded CLIP
    batch_size: int = 32

    @property
    def model_id(self) -> str:
        return str(self.model.model_id)

    def direction(self, class_name: str) -> np.ndarray:
        """The class's zero-shot text direction ("A photo of {class}.")."""
        from curate.zeroshot.classifier import build_text_classifier
        from curate.zeroshot.prompts import load_prompts

        return build_text_classifier(self.model, [class_name], load_prompts("simple")).numpy()[0]

    def group_backgrounds(self, ds: Any, rows: Sequence[Mapping[str, Any]], direction: np.ndarray) -> np.ndarray:
        """Background embeddings of dataset rows (the shared feature cache, then the projection)."""
        from curate.features import compute_features

        if not rows:
            return np.zeros((0, 1), np.float32)
        feats = compute_features(ds, self.model, [str(r["sample_id"]) for r in rows], batch_size=self.batch_size)
        if len(feats.sample_ids) == 0:
            return np.zeros((0, 1), np.float32)
        return project_out(np.asarray(feats.values), direction)

    def candidate_backgrounds(self, client: PoliteClient, candidates: Sequence[Candidate], direction: np.ndarray,
                              journal: Journal | None = None) -> tuple[np.ndarray, list[bool]]:
        """Background embeddings of the candidates' photos: ``(values, ok)``; a photo that cannot be
        downloaded or read gets a zero row and ``ok`` False. With ``journal``, each body is taken from its
        staging when there, else downloaded and staged under the candidate's key (module docstring)."""
        import torch
        from PIL import Image

        images: list[Any] = []
        ok: list[bool] = []
        for cand in candidates:
            try:
                data = _body(client, cand, journal)
                with Image.open(io.BytesIO(data)) as opened:
                    images.append(opened.convert("RGB"))
                ok.append(True)
            except (HttpError, OSError, ValueError):
                images.append(None)
                ok.append(False)
        width = 0
        out: list[np.ndarray | None] = [None] * len(images)
        good = [k for k, img in enumerate(images) if img is not None]
        for start in range(0, len(good), self.batch_size):
            chunk = good[start:start + self.batch_size]
            with torch.no_grad():
                batch = torch.stack([self.model.preprocess(images[k]) for k in chunk])
                values = self.model.encode_image(batch, normalize=True).float().cpu().numpy()
            width = values.shape[1]
            for k, value in zip(chunk, values):
                out[k] = value
        if not width:
            return np.zeros((len(images), 1), np.float32), ok
        stacked = np.stack([v if v is not None else np.zeros(width, np.float32) for v in out])
        projected = project_out(stacked, direction)
        projected[[not flag for flag in ok]] = 0.0
        return projected, ok


def _body(client: PoliteClient, cand: Candidate, journal: Journal | None) -> bytes:
    """The candidate's photo: staged, else downloaded (and staged for the engine), else read from disk."""
    if not cand.url:
        return Path(str(cand.path)).read_bytes()
    staged = journal.read_staged(cand.key) if journal is not None else None
    if staged is not None:
        return staged
    data = client.download(str(cand.url))
    if journal is not None:
        journal.stage(cand.key, data)
    return data
