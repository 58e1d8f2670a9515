"""The mask-proposal run: one model's object masks for a dataset folder (``curate propose-masks``).

Files (``runs/<name>/``; docs/design.md#masks):

- ``config.json``: ``model`` (``spec``, ``model_id``, ``info``: backend, folders, transformers
  classes), ``settings`` (the whole :class:`curate.stages.propose_masks.ProposeMasksSettings`:
  prompt template, threshold, only_missing, engine, ...), ``dataset`` (name, samples in scope),
  ``counts`` (see :attr:`MaskRun.counts`), ``tuned_on`` (the sample ids the model was trained on,
  when its folder says so: :func:`curate.masks.measure` leaves them out);
- ``proposals.parquet``: per sample in scope ``sample_id``, ``class_index``, ``prompt`` (the text
  the model was given), ``found`` (a mask was proposed), ``score`` (the model's confidence in
  [0, 1]; null when nothing was found), ``reason`` (why nothing was found, or why it failed),
  ``mask_file`` (``masks/<sample_id>.png`` in the run folder, 0/1 PNG at the image's size),
  ``applied`` (the proposal was written into the dataset as ``mask_status = model:<id>``;
  false where a human or exact mask already was, which it never overwrites);
- ``masks/<sample_id>.png``: every proposal, applied or not (``--measure`` compares the ones on
  samples with a human or exact mask against that mask);
- ``parts/part-NNNNN.parquet``: the rows of each finished batch while the run is under way; an
  interrupted run is resumed from them (same ``--run-name``) and they are removed when
  ``config.json``, the commit marker, is written;
- ``pending.json``: while the run is unfinished, the model, settings and scope it started with
  (a resume must match them; removed with ``parts/``). A live run also holds
  ``runs/.<name>.lock`` (:mod:`curate.runs.lock`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from curate.runs.base import ModelBlock, RunError, RunRecord, read_parquet, write_parquet
from curate.runs.registry import register_run_kind

__all__ = ["MaskRun", "PROPOSAL_COLUMNS", "proposals_table"]

#: Columns of ``proposals.parquet`` (and of each ``parts/`` file), in order.
PROPOSAL_COLUMNS: tuple[str, ...] = ("sample_id", "class_index", "prompt", "found", "score", "reason", "mask_file",
                                     "applied")


def proposals_table(rows: list[dict[str, Any]]) -> Any:
    """A ``proposals.parquet`` table from row dicts (missing keys are null)."""
    import pyarrow as pa

    schema = pa.schema([("sample_id", pa.string()), ("class_index", pa.int32()), ("prompt", pa.string()),
                        ("found", pa.bool_()), ("score", pa.float64()), ("reason", pa.string()),
                        ("mask_file", pa.string()), ("applied", pa.bool_())])
    return pa.table({name: pa.array([r.get(name) for r in rows], schema.field(name).type) for name in schema.names},
                    schema=schema)


@register_run_kind
@dataclass
class MaskRun(ModelBlock, RunRecord):
    """Config and results of one ``propose-masks`` run (see the module docstring)."""

    KIND: ClassVar[str] = "masks"
    VERSION: ClassVar[int] = 1
    PROPOSALS: ClassVar[str] = "proposals.parquet"
    MASKS: ClassVar[str] = "masks"
    PARTS: ClassVar[str] = "parts"

    config: dict[str, Any]
    proposals_rows: Any = field(default=None, repr=False)  # pyarrow Table; read on demand after load
    run_dir: Path | None = None

    def config_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.config.items() if k not in ("kind", "record_version", "curate_version")}

    def _write_results(self, run_dir: Path) -> None:
        if self.proposals_rows is None:
            raise RunError("a mask run needs its proposals table to be written")
        write_parquet(run_dir / self.PROPOSALS, self.proposals_rows)

    @classmethod
    def _read(cls, run_dir: Path, config: dict[str, Any]) -> MaskRun:
        for key in ("model", "settings", "counts"):
            if not isinstance(config.get(key), dict):
                raise RunError(f"run {run_dir.name} (masks) has no {key!r} block in its config.json")
        return cls(config=config, run_dir=run_dir)

    # -- typed views
    @property
    def settings(self) -> dict[str, Any]:
        return dict(self.config.get("settings") or {})

    @property
    def prompt(self) -> str:
        return str(self.settings.get("prompt") or "")

    @property
    def threshold(self) -> float:
        return float(self.settings.get("threshold", 0.5))

    @property
    def counts(self) -> dict[str, int]:
        """``in_scope``, ``found``, ``nothing_found``, ``failed``, ``applied``, ``kept_trusted`` (a
        human or exact mask was there: proposed, not applied), ``resumed`` (from an interrupted run)."""
        return {k: int(v) for k, v in (self.config.get("counts") or {}).items()}

    @property
    def tuned_on(self) -> set[str]:
        """Sample ids the model was tuned on (from its folder's training record; empty if unknown)."""
        return {str(s) for s in (self.config.get("tuned_on") or [])}

    def table(self) -> Any:
        """The proposals table (read from the run folder on first use)."""
        if self.proposals_rows is None:
            if self.run_dir is None:
                raise RunError("this mask run has no proposals and no folder to read them from")
            self.proposals_rows = read_parquet(self.run_dir / self.PROPOSALS)
        return self.proposals_rows

    def rows(self) -> list[dict[str, Any]]:
        return self.table().to_pylist()

    def proposal(self, sample_id: str) -> np.ndarray | None:
        """The proposed mask of ``sample_id`` as an ``(H, W)`` bool array (None: nothing proposed)."""
        from PIL import Image

        if self.run_dir is None:
            raise RunError("this mask run has no folder to read masks from")
        path = self.run_dir / self.MASKS / f"{sample_id}.png"
        if not path.is_file():
            return None
        with Image.open(path) as image:
            return np.asarray(image) != 0

    def proposal_path(self, sample_id: str) -> Path | None:
        if self.run_dir is None:
            return None
        path = self.run_dir / self.MASKS / f"{sample_id}.png"
        return path if path.is_file() else None
