"""The intervention run: which image of a derived folder is which variant of which photo (``curate intervene``).

``curate intervene DIR --out OUT`` writes counterfactual variants of DIR's masked photos into the
dataset folder OUT (docs/design.md#interventions) and this record into ``OUT/runs/<name>/``. It is
the one place that says what each image of OUT is; :mod:`curate.stages.attribution` reads it
through this class, never through OUT's ``extra`` column.

Files (``runs/<name>/``):

- ``config.json``: ``source`` (the source folder's path, name and split), ``settings`` (the whole
  :class:`curate.stages.intervene.InterveneSettings`), ``counts`` (sources used, images per
  variant, skipped sources and donors by reason), ``masks`` (the sources' masks by source,
  :meth:`curate.masks.sources.MaskCounts.as_dict`), ``adversarial_set`` (the donor photos whose
  backgrounds every object is tried on), ``truth`` (true for a folder of exact counterfactuals
  rendered by the synthetic world's generator, :mod:`curate.interventions.worlds`);
- ``variants.parquet`` (:data:`VARIANT_COLUMNS`): one row per (source photo, variant, k):
  ``sample_id`` (the image in OUT; several rows may share one image when two variants come out
  pixel-identical, e.g. a paste control on a flat background), ``variant``,
  ``source_sample_id``, ``class_index``, ``group`` (the source's easy / hard), ``k`` (the donor's
  rank for variants with several donors), ``donor_sample_id``, ``donor_class_index``,
  ``donor_group``, ``background`` (the background label the image shows, when known),
  ``filled_fraction`` (share of the image's pixels that were filled in, not photographed),
  ``fill`` (how the hole was filled), ``license`` (the image's licence: the stricter of the
  source's and the donor's), ``uncovered`` (donor variants: the share of the donor's hole that
  the pasted object leaves showing, ``|hole_d & ~mask| / |hole_d|``; null for the others).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from curate.runs.base import RunError, RunRecord, read_parquet, write_parquet
from curate.runs.registry import register_run_kind

__all__ = ["InterventionRun", "VARIANT_COLUMNS", "variants_table"]

#: ``variants.parquet`` columns and their arrow types, in order.
VARIANT_COLUMNS: tuple[tuple[str, str], ...] = (
    ("sample_id", "string"), ("variant", "string"), ("source_sample_id", "string"), ("class_index", "int32"),
    ("group", "string"), ("k", "int32"), ("donor_sample_id", "string"), ("donor_class_index", "int32"),
    ("donor_group", "string"), ("background", "string"), ("filled_fraction", "float64"), ("fill", "string"),
    ("license", "string"), ("uncovered", "float64"),
)


def variants_table(rows: list[dict[str, Any]]) -> Any:
    """A ``variants.parquet`` table from row dicts (missing keys are null), sorted by
    (source, variant, k) so the same intervention writes the same bytes."""
    import pyarrow as pa

    types = {"string": pa.string(), "int32": pa.int32(), "float64": pa.float64()}
    schema = pa.schema([(name, types[kind]) for name, kind in VARIANT_COLUMNS])
    ordered = sorted(rows, key=lambda r: (str(r["source_sample_id"]), str(r["variant"]), int(r.get("k") or 0)))
    return pa.table({name: pa.array([r.get(name) for r in ordered], schema.field(name).type)
                     for name in schema.names}, schema=schema)


@register_run_kind
@dataclass
class InterventionRun(RunRecord):
    """Config and variant table of one ``curate intervene`` (see the module docstring)."""

    KIND: ClassVar[str] = "intervene"
    VERSION: ClassVar[int] = 1
    VARIANTS: ClassVar[str] = "variants.parquet"

    config: dict[str, Any]
    variants_rows: Any = field(default=None, repr=False)  # pyarrow Table; read on demand after load
    run_dir: Path | None = None

    def config_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.config.items() if k not in ("kind", "record_version", "curate_version")}

    def _write_results(self, run_dir: Path) -> None:
        if self.variants_rows is None:
            raise RunError("an intervention run needs its variants table to be written")
        write_parquet(run_dir / self.VARIANTS, self.variants_rows)

    @classmethod
    def _read(cls, run_dir: Path, config: dict[str, Any]) -> InterventionRun:
        for key in ("source", "settings", "counts"):
            if not isinstance(config.get(key), dict):
                raise RunError(f"run {run_dir.name} (intervene) has no {key!r} block in its config.json")
        return cls(config=config, run_dir=run_dir)

    @classmethod
    def of_folder(cls, root: Path | str, name: str | None = None) -> InterventionRun:
        """The intervention record of the folder ``root``: the run ``name``, else the latest one."""
        from curate.runs.base import list_runs
        from curate.runs.lookup import named_run

        if name is not None:
            return named_run(root, name, cls)  # a missing run is said so, with the runs there
        found = list_runs(Path(root), cls.KIND)
        if not found:
            raise RunError(f"{root} has no finished intervention record (runs/*/ of kind 'intervene'): make the "
                           "folder with `curate intervene DIR --out OUT`; an interrupted one is finished by running "
                           "it again")
        return cls.load(found[-1])

    # -- typed views
    @property
    def settings(self) -> dict[str, Any]:
        return dict(self.config.get("settings") or {})

    @property
    def source(self) -> dict[str, Any]:
        """``root``, ``name`` and ``split`` (the split run the groups came from, or None) of the source folder."""
        return dict(self.config.get("source") or {})

    @property
    def counts(self) -> dict[str, Any]:
        return dict(self.config.get("counts") or {})

    @property
    def masks(self) -> dict[str, Any]:
        return dict(self.config.get("masks") or {})

    @property
    def is_truth(self) -> bool:
        """A folder of exact counterfactuals from the synthetic world's generator (no paste, no fill)."""
        return bool(self.config.get("truth"))

    @property
    def sigma(self) -> float:
        return float(self.settings.get("sigma", float("nan")))

    def table(self) -> Any:
        """The variants table (read from the run folder on first use)."""
        if self.variants_rows is None:
            if self.run_dir is None:
                raise RunError("this intervention run has no variants and no folder to read them from")
            self.variants_rows = read_parquet(self.run_dir / self.VARIANTS)
        return self.variants_rows

    def rows(self) -> list[dict[str, Any]]:
        return self.table().to_pylist()

    def variant_counts(self) -> dict[str, int]:
        """Images per variant (rows of the table)."""
        return dict(sorted(Counter(self.table().column("variant").to_pylist()).items()))
