"""Collectors: bring images into a dataset folder (DESIGN.md, the ``collect`` stage).

- :mod:`~curate.collect.inat`: iNaturalist photos of ImageNet-1K classes (taxon resolution,
  id paging, licence policy, full provenance), :func:`collect_inat`;
- :mod:`~curate.collect.coco`: COCO images of chosen categories with union and per-instance
  masks, :func:`collect_coco`;
- :mod:`~curate.collect.folder`: ImageFolder and the released CounterAnimal layout,
  :func:`import_folder`;
- :mod:`~curate.collect.hub`: a Hugging Face dataset (repo, Hub folder, ``datasets`` save),
  a folder curate published row for row, :func:`collect_hub`;
- :mod:`~curate.collect.fiftyone_import`: a FiftyOne dataset or saved view (class, object
  masks, tags, named fields), :func:`collect_fiftyone`;
- :mod:`~curate.collect.composite`: masked objects on colours or background images with a
  planted correlation, :func:`compose`;
- :mod:`~curate.collect.synthetic`: the synthetic world.

All of them run on :mod:`~curate.collect.engine` (ordered, concurrent, verified, batched,
resumable through a journal in ``<dataset>/.collect/``, see :mod:`~curate.collect.journal`) and
fetch over HTTP with :class:`~curate.collect.http.PoliteClient` (rate limits, retries, size
limits, safe URLs). Names are imported lazily so ``import curate.collect`` stays light.
"""
from __future__ import annotations

from curate.lazy import lazy_exports

_EXPORTS = {
    "collect_inat": "curate.collect.inat",
    "INatClass": "curate.collect.inat",
    "load_recipe": "curate.collect.inat",
    "classes_from_text": "curate.collect.inat",
    "collect_coco": "curate.collect.coco",
    "instance_masks": "curate.collect.coco",
    "import_folder": "curate.collect.folder",
    "collect_hub": "curate.collect.hub",
    "collect_fiftyone": "curate.collect.fiftyone_import",
    "FiftyOneImportError": "curate.collect.fiftyone_import",
    "compose": "curate.collect.composite",
    "CompositeSpec": "curate.collect.composite",
    "collect_synthetic": "curate.collect.synthetic",
    "CollectReport": "curate.collect.engine",
    "PoliteClient": "curate.collect.http",
    "collection_failures": "curate.collect.journal",
}

__all__ = ["CollectReport", "CompositeSpec", "FiftyOneImportError", "INatClass", "PoliteClient",
           "classes_from_text", "collect_coco", "collect_fiftyone", "collect_hub", "collect_inat", "collect_synthetic",
           "collection_failures", "compose", "import_folder", "instance_masks", "load_recipe"]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
