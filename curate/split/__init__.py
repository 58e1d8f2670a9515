"""Background pre-labels and spurious discovery (papers/003 §2.1): easy and hard groups.

- :mod:`curate.split.backgrounds`: a CLIP proposes background labels for people to review.
- :mod:`curate.split.discovery`: the rule on plain arrays (hand-testable).
- :mod:`curate.split.apply`: the rule on a dataset folder: groups, provenance, tables, figures.
- :mod:`curate.split.export`: the released CounterAnimal folder layout.
"""
