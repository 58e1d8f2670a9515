"""Small dataset folders for evaluation tests (imported by tests/test_stage_evaluate.py and tests/test_cli_evaluate.py),
and a tiny model saved to a weights file (the Ray suites: actors load it from the file)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from curate.models import ModelSpec, load_model
from curate.store import Dataset, NewSample

# ImageNet-1K classes, including the two "missile" labels (657, 744) to test duplicate names.
CLASSES = (9, 296, 100, 657, 744)


def make_folder(root: Path, *, per_class: int = 6, size: int = 24, seed: int = 0, with_groups: bool = True,
                classes: tuple[int, ...] = CLASSES) -> Dataset:
    """Random-noise images per class; half easy (grass), half hard (water) when ``with_groups``."""
    rng = np.random.default_rng(seed)
    ds = Dataset.create(root, name="evaltest")
    items = []
    for c in classes:
        for i in range(per_class):
            pixels = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
            group = ("easy" if i % 2 == 0 else "hard") if with_groups else None
            items.append(NewSample(image=Image.fromarray(pixels), class_index=c, status="accepted",
                                   background="grass" if i % 2 == 0 else "water", background_source="human", group=group))
    report = ds.add_samples(items)
    assert not report.quarantined
    return ds


def saved_tiny_vit(root: Path) -> ModelSpec:
    """A random-weight ``curate-tiny-vit`` (seed 0) saved to ``root/tiny-vit.pt``, as a spec that
    loads it from that file."""
    import torch

    model = load_model("curate-tiny-vit", None, seed=0)
    weights = root / "tiny-vit.pt"
    torch.save({"state_dict": model.module.state_dict(), "curate": {"arch": "curate-tiny-vit"}}, weights)
    return ModelSpec("curate-tiny-vit", str(weights))
