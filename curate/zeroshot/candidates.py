"""Candidate label spaces for 1-vs-N scoring (papers/003 App. C.2).

Scores are always computed over the whole base label space (ImageNet-1K, or the dataset's
own list); a candidate space then restricts, per sample, which labels may be predicted.
Restricting afterwards is exact: a zero-shot logit of label l depends only on the image and
l's text embedding, and a classifier's 1000-way logits are restricted the same way (App. C.2
defines the candidates per class; App. F reports ImageNet models in 1 vs. 20 but not how).

- ``imagenet1k`` (1 vs 1000): every label.
- ``top20`` (1 vs 20): per class c, the 20 labels with the highest average cosine similarity
  between c's images (easy and hard together) and the label's text embedding under a
  reference model; the average of cosines equals the cosine-weighted dot product with the mean
  embedding, ``mean_i <f_i, w_l> = <mean_i f_i, w_l>``. If the true label is not among them it
  replaces the 20th (the true label must be a candidate). Saved once in the dataset folder
  and reused unchanged for every model.
- a file: one label per line (an index or a name of the base space); every sample's class
  must be in it.
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from curate.jsonio import write_json
from curate.labels import LabelSpace, UnknownClassError

LABELSPACES_DIR = "labelspaces"
TOP20_FILE = "top20.json"


@dataclass
class CandidateSpace:
    """Which labels of the base space each class's samples are scored against.

    ``shared``: one candidate array for all classes (None = all labels); ``per_class``: class
    index -> candidate array (1-vs-20). ``info`` goes into run configs.
    """

    name: str
    n_labels: int
    shared: np.ndarray | None = None
    per_class: dict[int, np.ndarray] | None = None
    info: dict = field(default_factory=dict)

    def candidates_for(self, class_index: int) -> np.ndarray:
        if self.per_class is not None:
            if int(class_index) not in self.per_class:
                raise KeyError(f"label space {self.name!r} has no candidate list for class {class_index}; rebuild it "
                               "(a class was added after it was made)")
            return self.per_class[int(class_index)]
        return self.shared if self.shared is not None else np.arange(self.n_labels)

    @property
    def size(self) -> int | None:
        """Candidates per sample when constant, else None."""
        if self.per_class is not None:
            sizes = {len(v) for v in self.per_class.values()}
            return sizes.pop() if len(sizes) == 1 else None
        return self.n_labels if self.shared is None else len(self.shared)

    def needed_labels(self) -> np.ndarray | None:
        """Every label any sample may be predicted as (None = the whole space)."""
        if self.per_class is not None:
            return np.unique(np.concatenate(list(self.per_class.values())))
        return None if self.shared is None else self.shared

    def restrict(self, scores: np.ndarray, classes: np.ndarray) -> np.ndarray:
        """Scores with every non-candidate label set to -inf (per row, by the row's class)."""
        if self.shared is None and self.per_class is None:
            return scores
        out = np.full_like(scores, -np.inf)
        if self.per_class is None:
            out[:, self.shared] = scores[:, self.shared]
            return out
        for c in np.unique(classes):
            rows = np.flatnonzero(classes == c)
            cand = self.candidates_for(int(c))
            out[np.ix_(rows, cand)] = scores[np.ix_(rows, cand)]
        return out

    def check_covers(self, classes: Sequence[int], label_space: LabelSpace) -> None:
        """Every evaluated class must be one of its own candidates."""
        missing = sorted({int(c) for c in classes if int(c) not in set(self.candidates_for(int(c)).tolist())})
        if missing:
            names = ", ".join(f"{c} ({label_space.name_of(c)})" for c in missing[:10])
            raise ValueError(f"label space {self.name!r} does not contain the true class of samples of: {names}")


def full_space(label_space: LabelSpace) -> CandidateSpace:
    name = "imagenet1k" if label_space.is_builtin else f"dataset:{label_space.name}"
    return CandidateSpace(name, len(label_space), info={"kind": "full", "labels": len(label_space)})


def file_space(path: Path, label_space: LabelSpace) -> CandidateSpace:
    """A subset from a file: one ImageNet-1K index or label name per line (``#`` comments)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"label-space file {path} does not exist")
    indices: list[int] = []
    problems = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        try:
            indices.append(label_space.resolve(text))
        except UnknownClassError as error:
            problems.append(f"{path}:{number}: {error}")
    if problems:
        raise ValueError("unknown labels in the label-space file:\n" + "\n".join(problems))
    if not indices:
        raise ValueError(f"label-space file {path} lists no labels")
    shared = np.array(sorted(set(indices)), dtype=np.int64)
    return CandidateSpace(f"file:{path.name}", len(label_space), shared=shared,
                          info={"kind": "file", "file": str(path), "labels": shared.tolist()})


def build_top20(
    class_embeddings: dict[int, np.ndarray], text_classifier: np.ndarray, *, k: int = 20,
) -> dict[int, np.ndarray]:
    """Per class, the ``k`` labels of highest mean cosine similarity (App. C.2).

    Args:
        class_embeddings: class index -> (n_c, D) L2-normalised image embeddings of that
            class's images (easy and hard together).
        text_classifier: (L, D) L2-normalised label embeddings of the reference model.
    Returns:
        class index -> (k,) label indices, most confusing first, the true label included.
    """
    out = {}
    for c, emb in class_embeddings.items():
        if len(emb) == 0:
            raise ValueError(f"class {c} has no images to build its 1-vs-{k} label space from")
        mean_cos = emb.astype(np.float64) @ text_classifier.astype(np.float64).T  # (n_c, L)
        mean_cos = mean_cos.mean(axis=0)
        order = np.argsort(-mean_cos, kind="stable")[:k]
        if c not in order:
            order[-1] = c
        out[int(c)] = order.astype(np.int64)
    return out


def save_top20(dataset_root: Path, per_class: dict[int, np.ndarray], info: dict) -> Path:
    path = Path(dataset_root) / LABELSPACES_DIR / TOP20_FILE
    write_json(path, {**info, "k": len(next(iter(per_class.values()))),
                      "classes": {str(c): v.tolist() for c, v in sorted(per_class.items())}})
    return path


def load_top20(dataset_root: Path, n_labels: int) -> CandidateSpace | None:
    """The saved 1-vs-20 space, or None when the dataset has none yet."""
    path = Path(dataset_root) / LABELSPACES_DIR / TOP20_FILE
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
        per_class = {int(c): np.array(v, dtype=np.int64) for c, v in data["classes"].items()}
    except (ValueError, KeyError, TypeError) as error:
        raise ValueError(f"{path} is malformed ({error}); delete it and rebuild with --rebuild-top20") from error
    for c, v in per_class.items():
        if v.min(initial=0) < 0 or v.max(initial=0) >= n_labels:
            raise ValueError(f"{path}: class {c} lists labels outside 0..{n_labels - 1}")
    info = {k: v for k, v in data.items() if k != "classes"}
    return CandidateSpace("top20", n_labels, per_class=per_class, info={"kind": "top20", "file": str(path), **info})
