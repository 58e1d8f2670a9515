"""curate: build and score CounterAnimal-style spurious-feature benchmarks.

The front door (everything loads lazily, so ``import curate`` costs nothing)::

    import curate
    ds = curate.Dataset.open("world/")
    model = curate.load_model("CLIP-LAION400M-ViT-B/32")
    run = curate.evaluate(ds, curate.ModelSpec("CLIP-LAION400M-ViT-B/32"), curate.EvalSettings(label_space="top20"))
    print(run.group("easy").acc1, run.group("hard").acc1, run.drop.acc1)

Where things live (see ``docs/design.md``): ``store`` (the dataset folder), ``collect``
(iNaturalist, COCO, folders, the synthetic world), ``models`` (CLIPs and classifiers by name),
``zeroshot`` (label spaces, prompts, text classifiers), ``stages`` (evaluate, explain,
fidelity, split, label_backgrounds: one shape each), ``runs`` (the typed run records the
stages write and every reader loads), ``metrics`` (formulas only), ``saliency`` (CAMs and
attention maps), ``review`` (FiftyOne, Label Studio), ``publish`` (the Hub), ``report``,
``compare``, ``cli``.
"""
from __future__ import annotations

from curate.lazy import lazy_exports

__version__ = "0.1.0"

_EXPORTS = {
    "Dataset": "curate.store",
    "NewSample": "curate.store",
    "load_model": "curate.models",
    "ModelSpec": "curate.models",
    "evaluate": "curate.stages.evaluate",
    "EvalSettings": "curate.stages.evaluate",
    "explain": "curate.stages.explain",
    "ExplainSettings": "curate.stages.explain",
    "fidelity": "curate.stages.fidelity",
    "FidelitySettings": "curate.stages.fidelity",
    "split_dataset": "curate.stages.split:split",  # ``curate.split`` is the split subpackage
    "SplitSettings": "curate.stages.split",
    "compare_runs": "curate.compare",
    "build_report": "curate.report",
    "EvaluationRun": "curate.runs",
    "list_runs": "curate.runs",
    "load_run": "curate.runs",
}

__all__ = ["__version__", *_EXPORTS]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
