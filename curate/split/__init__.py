"""Background pre-labels and spurious discovery (papers/003 §2.1): easy and hard groups.

- :mod:`curate.split.backgrounds`: a CLIP proposes background labels for people to review
  (the stage: :mod:`curate.stages.label_backgrounds`).
- :mod:`curate.split.discovery`: the rule on plain arrays (hand-testable), its p-values,
  cross-fitted (selection-corrected) drops and noise summary (it lives in
  :mod:`curate.metrics.split_rule`, below the run record that stores it).
- :mod:`curate.split.pins`: backgrounds a person fixes for a class.
- :mod:`curate.runs.split_tables`: the split's tables as text (Tables 1 and 5; ties named), with no
  figure code, so the run record writes them without importing matplotlib.
- :mod:`curate.split.tables`: the split's figures (Figs. 3 and 4; the stage writes them), and the
  text tables re-exported.
- :mod:`curate.split.export`: the released CounterAnimal folder layout.

The stage that runs the rule on a dataset folder is :func:`curate.stages.split.split`; its run
record is :class:`curate.runs.SplitRun`.
"""
