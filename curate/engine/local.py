"""The in-process engine: decoding in a torch ``DataLoader`` (worker processes on a GPU
machine), the model in this process. What curate did before engines existed."""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from curate.engine.base import BatchJob, BatchOutput, EncodeJob, batches_of, encode_batch

__all__ = ["LocalEngine", "image_paths"]


class _DecodedBatches:
    """A map-style dataset of whole batches: item ``b`` is ``decode(items of batch b)``
    (a ``DataLoader`` with ``batch_size=None`` then decodes batches in its worker processes)."""

    def __init__(self, batches: list[list[Any]], decode: Any) -> None:
        self.batches = batches
        self.decode = decode

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, b: int) -> Any:
        return self.decode(self.batches[b])


class LocalEngine:
    """``map_batches`` in this process (see :mod:`curate.engine.base`)."""

    name = "local"

    def __init__(self, workers: int | None = None) -> None:
        self.workers = workers

    def map_batches(self, dataset: Any, sample_ids: Sequence[str], job: EncodeJob | BatchJob) -> Iterator[Any]:
        if isinstance(job, BatchJob):
            yield from self._run_job(job)
            return
        yield from self._encode(dataset, sample_ids, job)

    def _run_job(self, job: BatchJob) -> Iterator[Any]:
        """A :class:`BatchJob`: batches decoded by ``workers`` DataLoader processes (0: here;
        None: :func:`curate.engine.images.default_workers` of ``job.device``, so every core but
        one on a GPU machine), pinned for a CUDA device; one worker (``job.worker("auto")``:
        the driver's model) runs them in order."""
        import torch

        from curate.engine.images import default_workers

        if not job.items:
            return
        run = job.worker("auto")
        device = str(job.device or "cpu")
        workers = default_workers(device) if self.workers is None else self.workers
        batches = _DecodedBatches(batches_of(job.items, job.batch_size), job.decode)
        loader = torch.utils.data.DataLoader(batches, batch_size=None, shuffle=False, num_workers=workers,
                                             pin_memory=device.startswith("cuda"), persistent_workers=False)
        for payload in loader:
            yield run(payload)

    def _encode(self, dataset: Any, sample_ids: Sequence[str], job: EncodeJob) -> Iterator[BatchOutput]:
        """Batches of ``job.batch_size`` consecutive ids, decoded by ``workers`` loader processes
        along ``job.input_path`` (:mod:`curate.engine.images`), encoded here. Paths are resolved
        and checked once for all ids (:func:`image_paths`), not per image."""
        import torch

        from curate.engine.images import (
            DeviceBatches,
            ImageFiles,
            RawImageFiles,
            collate_raw,
            default_workers,
            device_transform_of,
        )

        if not sample_ids:
            return
        model = job.model
        batches = batches_of(sample_ids, job.batch_size)
        ids = [sid for batch in batches for sid in batch]
        paths = image_paths(dataset, ids)
        workers = default_workers(model.device) if self.workers is None else self.workers
        cuda = model.device.type == "cuda"
        if job.input_path == "gpu":
            transform = device_transform_of(model.preprocess)
            if transform is None:
                raise ValueError(f"the gpu input path cannot reproduce {model.model_id}'s transform; use cpu-exact")
            raw = RawImageFiles(paths, device_decode=cuda)
            loader = torch.utils.data.DataLoader(raw, batch_size=job.batch_size, shuffle=False, num_workers=workers,
                                                 pin_memory=cuda, persistent_workers=False, collate_fn=collate_raw)
            to_device = DeviceBatches(transform, model.device, model.image_size)
            for batch in loader:
                indices, pixels, errors = to_device(batch)
                yield encode_batch(model, job.kind, [ids[i] for i in indices], pixels, errors, job.output)
            return
        files = ImageFiles(paths, model.preprocess, model.image_size)
        loader = torch.utils.data.DataLoader(files, batch_size=job.batch_size, shuffle=False, num_workers=workers,
                                             pin_memory=cuda, persistent_workers=False)
        for indices, pixels, errors in loader:
            batch_ids = [ids[i] for i in indices.tolist()]
            yield encode_batch(model, job.kind, batch_ids, pixels, list(errors), job.output)


def image_paths(dataset: Any, sample_ids: Sequence[Any]) -> list[Any]:
    """The image paths of ``sample_ids`` (ids or rows) in one call: ``dataset.image_paths``
    (resolved and checked for the whole list at once) where the dataset has it, else
    ``image_path`` per id (a stand-in dataset)."""
    many = getattr(dataset, "image_paths", None)
    if callable(many):
        return list(many(sample_ids))
    return [dataset.image_path(sid) for sid in sample_ids]
