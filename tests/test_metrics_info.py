"""Every metric declares itself once (curate.metrics.info), as torchmetrics declares direction."""
from __future__ import annotations

import subprocess
import sys

from curate.metrics import metric_infos


def test_every_metric_has_a_formula_a_direction_and_a_source() -> None:
    infos = {i.name: i for i in metric_infos()}
    assert {"balanced accuracy", "drop", "effective robustness", "SSS", "RMA", "F-Fid+", "F-Fid-"} <= set(infos)
    for info in infos.values():
        assert info.formula and info.paper.startswith(("papers/", "Taori")), info
    # directions the tables rely on: SSS lower is better, RMA higher; Fid+ higher, Fid- lower
    assert infos["SSS"].higher_is_better is False and infos["RMA"].higher_is_better is True
    assert infos["F-Fid+"].higher_is_better is True and infos["F-Fid-"].higher_is_better is False
    assert infos["drop"].higher_is_better is None  # reliance, not quality


def test_metrics_package_stays_a_leaf() -> None:
    """Formulas only: importing every metric module loads neither the saliency engine nor the stages."""
    code = ("import sys, curate.metrics as m; m.metric_infos(); "
            "bad = [k for k in sys.modules if k.startswith(('curate.saliency', 'curate.stages'))]; print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"
