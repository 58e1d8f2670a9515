"""`curate collect synthetic` with planted curation problems: the options reach WorldSpec's
``*_rate`` fields (the world is exactly the library's), the provenance records them, and bad
rates are a clear usage error that writes nothing."""
from __future__ import annotations

import json

import yaml
from click.testing import CliRunner

from curate.cli import main
from curate.collect.planted import planted_truth
from curate.collect.synthetic import DEFAULT_CLASSES, WorldSpec, collect_synthetic
from curate.store import Dataset

ARGS = ["--classes", "3", "--per-class", "10", "--image-size", "32", "--seed", "3"]


def _truth(ds: Dataset) -> dict[str, str]:
    extras = {r["sample_id"]: {**json.loads(r["extra"] or "{}"), "source_id": r["source_id"]} for r in ds.rows()}
    return planted_truth(extras)


def test_planted_rates_from_the_cli_make_the_librarys_world(tmp_path) -> None:
    result = CliRunner().invoke(main, ["collect", "synthetic", str(tmp_path / "cli"), *ARGS, "--planted-rate", "0.1",
                                       "--wrong-label-rate", "0.3", "--small-object-rate", "0"])
    assert result.exit_code == 0, result.output
    assert "planted (" in result.output and "wrong_label" in result.output
    cli = Dataset.open(tmp_path / "cli")
    rates = dict(wrong_label_rate=0.3, duplicate_rate=0.1, near_duplicate_rate=0.1, feature_noise_rate=0.1,
                 second_object_rate=0.1, small_object_rate=0.0)
    spec = WorldSpec(classes=DEFAULT_CLASSES[:3], per_class=10, image_size=32, seed=3, **rates)
    lib = collect_synthetic(tmp_path / "lib", spec)
    truth = _truth(cli)
    assert truth and truth == _truth(lib) and "small_object" not in truth.values()
    assert sorted(r["sha256"] for r in cli.rows()) == sorted(r["sha256"] for r in lib.rows())
    recorded = yaml.safe_load((tmp_path / "cli" / "dataset.yaml").read_text())["provenance"]["synthetic"]
    assert {k: recorded.get(k, 0.0) for k in rates} == rates


def test_bad_planted_rates_are_usage_errors_that_write_nothing(tmp_path) -> None:
    runner = CliRunner()
    for flags, message in ((["--planted-rate", "0.3"], "add up to 1.800 > 1"),
                           (["--feature-noise-rate", "-0.1"], "feature_noise_rate must be in [0, 1]")):
        result = runner.invoke(main, ["collect", "synthetic", str(tmp_path / "w"), *ARGS, *flags])
        assert result.exit_code == 2 and message in result.output, result.output
        assert not (tmp_path / "w").exists()
