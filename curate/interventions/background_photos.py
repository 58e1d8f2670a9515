"""Photos of a background alone: the donors of the fill control that needs no fill (issue 45).

A swap pastes a hard photo's object on an easy donor's *filled* background: what the swap shows of
the donor's filled hole may itself move a model's answer. A photo of the easy background with no
object in it has no hole and nothing filled, so the hard object pasted on it (the variant
``swap-bgonly``) is a swap with no fill at all (docs/design.md#interventions).

On disk such photos are an ordinary dataset folder ([dataset-folder](docs/design.md#dataset-folder)):
one sample per photo with **no class** (``class_index`` null: nothing of a class is in it), its
``background`` label from the source dataset's vocabulary, its licence and attribution, no mask;
rejected photos are not used. ``curate collect synthetic DIR --backgrounds-only N`` writes one for a
synthetic world (:func:`curate.collect.synthetic.collect_synthetic_backgrounds`).

:func:`load_background_photos` checks the folder whole before anything is written: a missing
folder, a photo with a class or without a background, a background outside the source's
vocabulary, a photo that does not decode or whose decoded size is not the one its row records,
and no usable photo of a background the swaps need are each a one-line ``ValueError``. Photos whose
licence forbids derivatives are left out (counted) unless ``allow_restricted``, as for the source
photos. :func:`choose` picks one photo of a background for one swap, deterministically for a seed.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image

from curate.interventions.plan import variant_rng
from curate.licenses import RESTRICTED, derivative_licence, normalize_license

__all__ = ["BACKGROUND_ALONE_VARIANT", "BackgroundPhoto", "BackgroundPhotos", "load_background_photos", "choose",
           "decode"]

#: The variant: a hard photo's object on a photo of its swap donor's background alone.
BACKGROUND_ALONE_VARIANT = "swap-bgonly"


@dataclass(frozen=True)
class BackgroundPhoto:
    """One usable photo of a background alone."""

    sample_id: str
    background: str
    license: str
    attribution: str
    path: str
    background_source: str | None = None


@dataclass(frozen=True)
class BackgroundPhotos:
    """The usable photos of a background-alone folder, by background label, and what was left out."""

    root: str
    name: str
    by_background: dict[str, tuple[BackgroundPhoto, ...]]
    skipped: dict[str, int] = field(default_factory=dict)

    def count(self) -> int:
        return sum(len(v) for v in self.by_background.values())


def decode(path: str | Path) -> np.ndarray:
    """The photo as RGB uint8 (raises OSError / ValueError when it does not decode)."""
    with Image.open(path) as opened:
        return np.asarray(opened.convert("RGB"))


def load_background_photos(folder: str | Path, backgrounds: Sequence[str], needed: Sequence[str], *,
                           allow_restricted: bool = False) -> BackgroundPhotos:
    """The usable photos of the background-alone dataset ``folder`` (module docstring).

    ``backgrounds``: the source dataset's vocabulary (every photo's label must be in it);
    ``needed``: the easy backgrounds the swaps' donors show (each needs at least one usable photo)."""
    from curate.store import Dataset, DatasetError

    root = Path(folder).expanduser()
    if not (root / "dataset.yaml").is_file():
        raise ValueError(f"--background-photos {root}: not a dataset folder (no dataset.yaml); give a folder of "
                         "photos of backgrounds alone, e.g. `curate collect synthetic DIR --backgrounds-only N`")
    try:
        ds = Dataset.open(root)
    except DatasetError as error:
        raise ValueError(f"--background-photos {root}: {error}") from None
    known = set(backgrounds)
    skipped: Counter = Counter()
    by_background: dict[str, list[BackgroundPhoto]] = {}
    for row in sorted(ds.rows(), key=lambda r: r["sample_id"]):
        sid = row["sample_id"]
        if row["status"] == "rejected":
            skipped["rejected"] += 1
            continue
        if row["class_index"] is not None:
            raise ValueError(f"--background-photos {root}: photo {sid} has a class ({row['class_name']}); a photo of a "
                             "background alone shows no object (leave its class empty)")
        label = row["background"]
        if not label:
            raise ValueError(f"--background-photos {root}: photo {sid} has no background label")
        if label not in known:
            raise ValueError(f"--background-photos {root}: photo {sid} shows background {label!r}, which is not one of "
                             f"the dataset's backgrounds ({', '.join(backgrounds)})")
        path = ds.image_path(row)
        try:
            image = decode(path)
        except (OSError, ValueError, Image.DecompressionBombError) as error:
            raise ValueError(f"--background-photos {root}: photo {sid} does not decode ({error})") from None
        recorded = (int(row["height"] or 0), int(row["width"] or 0))
        if image.shape[:2] != recorded:
            raise ValueError(f"--background-photos {root}: photo {sid} is {image.shape[1]} x {image.shape[0]} px, its "
                             f"row says {recorded[1]} x {recorded[0]} (a replaced or damaged file)")
        code = normalize_license(row["license"])  # no licence = all rights reserved, as for the source photos
        if code in RESTRICTED and not allow_restricted:
            skipped["license_restricted"] += 1
            continue
        by_background.setdefault(label, []).append(
            BackgroundPhoto(sid, label, code, str(row["attribution"] or "unknown"), str(path),
                            row["background_source"]))
    missing = sorted(set(needed) - set(by_background))
    if missing:
        left = f" ({dict(skipped)} left out)" if skipped else ""
        raise ValueError(f"--background-photos {root}: no usable photo of the easy background(s) {missing} the swaps "
                         f"need{left}; add photos of them alone")
    return BackgroundPhotos(str(root.resolve()), ds.name, {k: tuple(v) for k, v in sorted(by_background.items())},
                            dict(sorted(skipped.items())))


def choose(photos: BackgroundPhotos, background: str, photo_id: str, photo_license: str, k: int,
           seed: int) -> tuple[BackgroundPhoto, str] | None:
    """The background-alone photo for swap ``k`` of photo ``photo_id``, and the image's licence.

    Candidates: the photos of ``background`` whose licence combines with the object's
    (:func:`curate.licenses.derivative_licence`), in a seeded permutation drawn from
    ``default_rng([seed, id, code of swap-bgonly])`` (:func:`curate.interventions.plan.variant_rng`),
    so a photo's choice does not depend on the others; swap ``k`` takes the ``k mod n``-th, so a
    photo's swaps use distinct photos while there are enough. None: no candidate."""
    usable = [(p, lic) for p in photos.by_background.get(background, ())
              if (lic := derivative_licence([photo_license, p.license])) is not None]
    if not usable:
        return None
    order = variant_rng(seed, photo_id, BACKGROUND_ALONE_VARIANT).permutation(len(usable))
    return usable[int(order[k % len(usable)])]
