"""The in-process engine: decoding in a torch ``DataLoader`` (worker processes on a GPU
machine), the model in this process. What curate did before engines existed."""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from curate.engine.base import BatchJob, BatchOutput, EncodeJob, batches_of, encode_batch

__all__ = ["LocalEngine"]


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
        """A :class:`BatchJob`: batches decoded by ``workers`` DataLoader processes (0: here), one
        worker (``job.worker("auto")``: the driver's model) runs them in order."""
        import torch

        if not job.items:
            return
        run = job.worker("auto")
        batches = _DecodedBatches(batches_of(job.items, job.batch_size), job.decode)
        loader = torch.utils.data.DataLoader(batches, batch_size=None, shuffle=False, num_workers=self.workers or 0,
                                             persistent_workers=False)
        for payload in loader:
            yield run(payload)

    def _encode(self, dataset: Any, sample_ids: Sequence[str], job: EncodeJob) -> Iterator[BatchOutput]:
        import torch

        from curate.engine.images import ImageFiles, default_workers

        if not sample_ids:
            return
        model = job.model
        batches = batches_of(sample_ids, job.batch_size)
        ids = [sid for batch in batches for sid in batch]
        files = ImageFiles([dataset.image_path(sid) for sid in ids], model.preprocess, model.image_size)
        workers = default_workers(model.device) if self.workers is None else self.workers
        loader = torch.utils.data.DataLoader(files, batch_size=job.batch_size, shuffle=False, num_workers=workers,
                                             pin_memory=model.device.type == "cuda", persistent_workers=False)
        for indices, pixels, errors in loader:
            batch_ids = [ids[int(i)] for i in indices]
            yield encode_batch(model, job.kind, batch_ids, pixels, list(errors), job.output)
