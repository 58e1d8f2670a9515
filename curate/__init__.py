"""curate: build and score CounterAnimal-style spurious-feature benchmarks.

Stages (one module or subpackage each, see DESIGN.md): ``store`` (the dataset folder),
``collect`` (inat, coco, folder, synthetic), ``models`` (CLIPs and classifiers by name),
``labels`` (label spaces), ``train_reference`` (the tiny offline reference CLIP), ``cli``.
"""
from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
