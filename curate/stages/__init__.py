"""The stages: each turns a dataset folder (and usually a model) into a run record.

Every stage has the same shape::

    stage(dataset, model, settings, *, run_name=None, overwrite=False, progress=None) -> <Kind>Run

- ``dataset``: a :class:`curate.store.Dataset` or its folder;
- ``model``: a :class:`curate.models.ModelSpec`, a loaded model, or a name/weights file;
- ``settings``: the stage's own settings dataclass (``EvalSettings``, ``ExplainSettings``,
  ``FidelitySettings``, ``SplitSettings``, ...), whose fields the CLI options map one to one;
- ``run_name`` / ``overwrite``: the run folder (default ``<kind>-<model>-<UTC time>``; a
  finished run's name is refused before any work unless ``overwrite``, an unfinished one is
  replaced: :func:`curate.stages.common.run_stage`, docs/design.md#run-folders);
- ``progress``: a :class:`curate.progress.Progress` callable or ``None``.

Modules: ``evaluate`` (zero-shot / 1000-way accuracy), ``explain`` (saliency, SSS, RMA),
``fidelity`` (Fid, R-Fid, F-Fid of explanations), ``split`` (spurious discovery),
``label_backgrounds`` (CLIP background pre-labels). Formulas live in :mod:`curate.metrics`;
run records in :mod:`curate.runs`.
"""
from __future__ import annotations
