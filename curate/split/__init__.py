"""Background pre-labels and spurious discovery (papers/003 §2.1): easy and hard groups.

- :mod:`curate.split.backgrounds`: a CLIP proposes background labels for people to review
  (the stage: :mod:`curate.stages.label_backgrounds`).
- :mod:`curate.split.discovery`: the rule on plain arrays (hand-testable), its p-values,
  cross-fitted (selection-corrected) drops and noise summary.
- :mod:`curate.split.pins`: backgrounds a person fixes for a class.
- :mod:`curate.split.tables`: the split's tables and figures (Tables 1 and 5, Figs. 3 and 4).
- :mod:`curate.split.export`: the released CounterAnimal folder layout.

The stage that runs the rule on a dataset folder is :func:`curate.stages.split.split`; its run
record is :class:`curate.runs.SplitRun`.
"""
