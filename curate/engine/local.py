"""The in-process engine: decoding in a torch ``DataLoader`` (worker processes on a GPU
machine), the model in this process. What curate did before engines existed."""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from curate.engine.base import BatchOutput, EncodeJob, batches_of, encode_batch

__all__ = ["LocalEngine"]


class LocalEngine:
    """``map_batches`` in this process (see :mod:`curate.engine.base`)."""

    name = "local"

    def __init__(self, workers: int | None = None) -> None:
        self.workers = workers

    def map_batches(self, dataset: Any, sample_ids: Sequence[str], job: EncodeJob) -> Iterator[BatchOutput]:
        import torch

        from curate.features import _ImageFiles, default_workers

        if not sample_ids:
            return
        model = job.model
        batches = batches_of(sample_ids, job.batch_size)
        ids = [sid for batch in batches for sid in batch]
        files = _ImageFiles([dataset.image_path(sid) for sid in ids], model.preprocess, model.image_size)
        workers = default_workers(model.device) if self.workers is None else self.workers
        loader = torch.utils.data.DataLoader(files, batch_size=job.batch_size, shuffle=False, num_workers=workers,
                                             pin_memory=model.device.type == "cuda", persistent_workers=False)
        for indices, pixels, errors in loader:
            batch_ids = [ids[int(i)] for i in indices]
            yield encode_batch(model, job.kind, batch_ids, pixels, list(errors))
