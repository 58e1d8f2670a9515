"""explain decodes images and masks in loader workers (issue 27): the same tensors with 0 and 2
worker processes, and a damaged image or mask is a counted skip, never fatal."""
from __future__ import annotations

import torch
from feed_helpers import make_photo_folder

from curate.engine.base import BatchJob
from curate.engine.local import LocalEngine
from curate.models import load_model
from curate.saliency.inputs import MaskedDecode
from curate.saliency.masks import mask_transform_for


class _Echo:
    """A BatchJob worker that returns each decoded batch as it came (with the pid that decoded it)."""

    def __call__(self, device: str):
        return lambda payload: payload


class _DecodeWithPid(MaskedDecode):
    def __call__(self, rows):
        import os

        batch = super().__call__(rows)
        batch["pid"] = os.getpid()
        return batch


def _batches(ds, model, rows, workers: int):
    decode = _DecodeWithPid(ds, model.preprocess, mask_transform_for(model.preprocess), tuple(model.image_size))
    job = BatchJob(items=rows, batch_size=4, decode=decode, worker=_Echo(), device="cpu")
    return list(LocalEngine(workers=workers).map_batches(ds, [r["sample_id"] for r in rows], job))


def test_workers_give_the_same_tensors_and_damage_is_reported(tmp_path) -> None:
    import os

    ds = make_photo_folder(tmp_path / "masked", n=10, masks=True)
    model = load_model("curate-tiny-vit", seed=0)
    rows = ds.rows()
    bad_image = ds.image_path(rows[2])
    bad_image.write_bytes(b"\xff\xd8\xff not a jpeg")
    bad_mask = ds.mask_path(rows[5])
    bad_mask.write_bytes(b"not a png")
    here = _batches(ds, model, rows, workers=0)
    there = _batches(ds, model, rows, workers=2)
    assert [b["pid"] for b in here] == [os.getpid()] * 3
    assert all(b["pid"] != os.getpid() for b in there)  # decoded in worker processes
    assert len(here) == len(there) == 3
    for a, b in zip(here, there):
        assert a["index"] == b["index"] and a["problem"] == b["problem"] and a["labels"] == b["labels"]
        assert torch.equal(a["image"], b["image"]) and torch.equal(a["mask"], b["mask"])
    problems = [p for b in here for p in b["problem"]]
    assert problems[2] == "image_unreadable" and problems[5] == "mask_unreadable"
    assert all(p in ("", "mask_resized") for i, p in enumerate(problems) if i not in (2, 5))
    assert here[0]["image"][0].abs().sum() > 0 and not here[0]["image"][2].any()
    assert here[0]["mask"][0].any()


def test_a_refused_path_is_one_rows_problem(tmp_path) -> None:
    """A row whose filepath escapes the folder: the batch's one-call path check refuses, the rows are then
    resolved one by one, so only that row is skipped."""
    ds = make_photo_folder(tmp_path / "masked", n=4, masks=True)
    model = load_model("curate-tiny-vit", seed=0)
    rows = ds.rows()
    rows[1] = {**rows[1], "filepath": "media/../../outside.jpg"}
    decode = MaskedDecode(ds, model.preprocess, mask_transform_for(model.preprocess), tuple(model.image_size))
    batch = decode(rows)
    assert batch["problem"][1] == "image_unreadable"
    assert [p for i, p in enumerate(batch["problem"]) if i != 1] == ["", "", ""]
