"""What a new user runs into first (issue 28): `collect folder` with a relative or slashed
DIRECTORY, `collect folder` into a folder made by `curate create`, a non-image file named
``.jpg``, `collect inat` without a network, and the synthetic world's planted/synthetic split."""
from __future__ import annotations

import ast
import hashlib
import io
import json
import socket
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from click.testing import CliRunner
from PIL import Image

from curate.cli import main
from curate.collect.http import HttpError, PoliteClient, RetryPolicy
from curate.store import Dataset, check_dataset
from curate.store.images import ImageRejected, prepare_image

UNRESOLVABLE = "curate-no-such-host.invalid"  # the .invalid TLD never resolves (RFC 2606)


def _image(path: Path, seed: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 255, (12, 16, 3), dtype=np.uint8)).save(buffer, "JPEG")
    path.write_bytes(buffer.getvalue())


def _imagefolder(src: Path, seed: int = 0) -> Path:
    _image(src / "9" / "a.jpg", seed + 1)
    _image(src / "ostrich" / "b.jpg", seed + 2)
    _image(src / "10" / "c.jpg", seed + 3)
    return src


def _invoke(*args: str):
    return CliRunner().invoke(main, list(args))


# ------------------------------------------------------------------------------------------
# 1. collect folder with a relative DIRECTORY
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("directory", ["mydata/", "mydata", "./mydata", "nested/../mydata/"])
def test_collect_folder_into_a_relative_directory(tmp_path, monkeypatch, directory) -> None:
    monkeypatch.chdir(tmp_path)
    _imagefolder(Path("src"))
    for _ in range(2):  # a re-run resumes and adds nothing
        result = _invoke("collect", "folder", directory, "src")
        assert result.exit_code == 0, result.output
    ds = Dataset.open(tmp_path / "mydata")
    assert len(ds) == 3 and not check_dataset(ds.root)
    jobs = ds.provenance["collect.folder"]["jobs"]
    assert [job["journal"] for job in jobs.values()] == [f".collect/folder-{next(iter(jobs))}.jsonl"]


def test_collect_counteranimal_into_relative_folders_with_slashes(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    _image(Path("CounterAnimal") / "9 ostrich" / "easy-ground" / "a.jpg", 1)
    _image(Path("CounterAnimal") / "9 ostrich" / "hard-water" / "b.jpg", 2)
    for _ in range(2):
        result = _invoke("collect", "folder", "counteranimal/", "CounterAnimal/", "--layout", "counteranimal")
        assert result.exit_code == 0, result.output
    rows = {r["source_id"]: r for r in Dataset.open(tmp_path / "counteranimal").rows()}
    assert {k: r["group"] for k, r in rows.items()} == {"9 ostrich/easy-ground/a.jpg": "easy",
                                                       "9 ostrich/hard-water/b.jpg": "hard"}


# ------------------------------------------------------------------------------------------
# 2. collect folder into a dataset folder made by `curate create`
# ------------------------------------------------------------------------------------------


def test_collect_folder_adds_to_a_dataset_made_by_create(tmp_path) -> None:
    made = tmp_path / "made"
    assert _invoke("create", str(made)).exit_code == 0
    result = _invoke("collect", "folder", str(made), str(_imagefolder(tmp_path / "src")))
    assert result.exit_code == 0, result.output
    more = tmp_path / "more"
    _image(more / "16" / "d.jpg", 7)
    result = _invoke("collect", "folder", str(made), str(more))
    assert result.exit_code == 0, result.output
    ds = Dataset.open(made)
    assert len(ds) == 4 and ds.name == "made" and not check_dataset(made)
    assert len(ds.provenance["collect.folder"]["jobs"]) == 2


def test_collect_folder_keeps_the_label_space_of_a_created_dataset(tmp_path) -> None:
    names = tmp_path / "animals.txt"
    names.write_text("cat\ndog\n")
    made = tmp_path / "made"
    assert _invoke("create", str(made), "--label-space", str(names), "--backgrounds", "grass,water").exit_code == 0
    _image(tmp_path / "src" / "dog" / "a.jpg", 1)
    _image(tmp_path / "src" / "cat" / "easy-grass" / "b.jpg", 2)
    # "cat" holds a sub-folder only: imagefolder takes its images recursively
    result = _invoke("collect", "folder", str(made), str(tmp_path / "src"))
    assert result.exit_code == 0, result.output
    ds = Dataset.open(made)
    assert list(ds.label_space.names) == ["cat", "dog"] and sorted(r["class_index"] for r in ds.rows()) == [0, 1]
    # the same file again: the same label space is fine
    assert _invoke("collect", "folder", str(made), str(tmp_path / "src"), "--label-space", str(names)).exit_code == 0
    # another label space is a clear error, and nothing is added
    other = tmp_path / "birds.txt"
    other.write_text("owl\nemu\n")
    result = _invoke("collect", "folder", str(made), str(tmp_path / "src"), "--label-space", str(other))
    assert result.exit_code != 0
    assert "label space" in result.output and "animals" in result.output and "birds" in result.output
    assert len(Dataset.open(made)) == 2


def test_collect_folder_refuses_backgrounds_an_existing_dataset_lacks(tmp_path) -> None:
    made = tmp_path / "made"
    assert _invoke("create", str(made), "--backgrounds", "grass,water").exit_code == 0
    result = _invoke("collect", "folder", str(made), str(_imagefolder(tmp_path / "src")), "--backgrounds", "grass,lava")
    assert result.exit_code != 0 and "lava" in result.output
    assert len(Dataset.open(made)) == 0
    result = _invoke("collect", "folder", str(made), str(tmp_path / "src"), "--backgrounds", "water")
    assert result.exit_code == 0, result.output


# ------------------------------------------------------------------------------------------
# 3. a non-image file named .jpg
# ------------------------------------------------------------------------------------------

TEXTS = {
    "bmp-like": b"BMW owners list\n" * 5,  # starts like a BMP header
    "fits-like": b"SIMPLE  = T / a note\n" * 3,  # starts like a FITS header
    "c-header": b"#define LIMIT 10\nint main(void) { return 0; }\n",  # read as an XBM header
    "png-signature-then-text": b"\x89PNG\r\n\x1a\nhello, this is a note\n",
}


@pytest.mark.parametrize("name", list(TEXTS))
def test_a_text_file_named_jpg_is_not_an_image(name) -> None:
    with pytest.raises(ImageRejected) as info:
        prepare_image(TEXTS[name])
    assert info.value.code == "not_an_image", info.value
    assert "not an image" in info.value.detail


def test_a_cut_image_is_still_truncated() -> None:
    buffer = io.BytesIO()
    Image.fromarray(np.random.default_rng(4).integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(buffer, "JPEG")
    for cut in (400, 1500):
        with pytest.raises(ImageRejected) as info:
            prepare_image(buffer.getvalue()[:cut])
        assert info.value.code == "truncated"


def test_collect_folder_quarantines_a_fake_jpg_as_not_an_image(tmp_path) -> None:
    src = _imagefolder(tmp_path / "src")
    (src / "9" / "fake.jpg").write_bytes(TEXTS["bmp-like"])
    result = _invoke("collect", "folder", str(tmp_path / "ds"), str(src))
    assert result.exit_code == 0, result.output
    assert "not_an_image" in result.output and "truncated" not in result.output
    records = [json.loads(line) for line in (tmp_path / "ds" / "quarantine.jsonl").read_text().splitlines()]
    assert [(r["source_id"], r["reason"]) for r in records] == [("9/fake.jpg", "not_an_image")]


# ------------------------------------------------------------------------------------------
# 4. no network: say so at once
# ------------------------------------------------------------------------------------------


def _closed_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # closed when the block ends: nothing listens there


def test_an_unresolvable_host_fails_at_once() -> None:
    client = PoliteClient(api_limits=None, download_limits=None, byte_limits=None, retry=RetryPolicy())
    start = time.monotonic()
    with client, pytest.raises(HttpError) as info:
        client.get_json(f"http://{UNRESOLVABLE}/v1/taxa")
    assert time.monotonic() - start < 5
    message = str(info.value)
    assert UNRESOLVABLE in message and "cannot be resolved (no network?)" in message
    assert "may be down" not in message and client.stats.retries == 0
    assert info.value.retryable and info.value.code == "unresolved_host"


def test_a_refused_connection_fails_quickly() -> None:
    port = _closed_port()
    client = PoliteClient(api_limits=None, download_limits=None, byte_limits=None, retry=RetryPolicy())
    start = time.monotonic()
    with client, pytest.raises(HttpError) as info:
        client.download(f"http://127.0.0.1:{port}/photo.jpg")
    assert time.monotonic() - start < 5
    message = str(info.value)
    assert f"127.0.0.1:{port}" in message and "refused the connection" in message
    assert "may be down or throttling" not in message
    assert info.value.retryable and info.value.code == "connection_refused"


def test_collect_inat_offline_says_so_at_once(tmp_path) -> None:
    start = time.monotonic()
    result = _invoke("collect", "inat", str(tmp_path / "ds"), "--classes", "9", "--per-class", "2",
                     "--api-url", f"http://{UNRESOLVABLE}/v1", "--contact", "test@example.org")
    assert time.monotonic() - start < 5
    assert result.exit_code == 1
    assert UNRESOLVABLE in result.output and "cannot be resolved (no network?)" in result.output
    assert "may be down" not in result.output


def test_collect_inat_into_a_relative_directory(tmp_path, monkeypatch) -> None:
    from fake_inat import FakeINat, make_world

    monkeypatch.chdir(tmp_path)
    with FakeINat(make_world(n_per_taxon=3)) as server:
        for _ in range(2):
            result = _invoke("collect", "inat", "birds/", "--classes", "9", "--per-class", "2", "--api-url",
                             server.api_url, "--photo-host", "127.0.0.1", "--api-rate", "none", "--download-rate",
                             "none", "--byte-rate", "none", "--contact", "test@example.org")
            assert result.exit_code == 0, result.output
    ds = Dataset.open(tmp_path / "birds")
    assert len(ds) == 2
    assert all(not Path(job["journal"]).is_absolute() for job in ds.provenance["collect.inat"]["jobs"].values())


# ------------------------------------------------------------------------------------------
# 5. planted <-> synthetic: no import circle, no borrowed private names, the same world
# ------------------------------------------------------------------------------------------

COLLECT = Path(__file__).resolve().parents[1] / "curate" / "collect"


def _imports_and_private_uses(module: str) -> tuple[set[str], set[tuple[str, str]]]:
    """(modules ``module`` imports anywhere, {(other module, private name)} it takes from them)."""
    tree = ast.parse((COLLECT / f"{module}.py").read_text(encoding="utf-8"))
    imported: set[str] = set()
    private: set[tuple[str, str]] = set()
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                if node.module == "curate.collect":
                    full = f"curate.collect.{alias.name}"
                    imported.add(full)
                    aliases[alias.asname or alias.name] = full
                else:
                    imported.add(node.module)
                    if alias.name.startswith("_"):
                        private.add((node.module, alias.name))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                imported.add(alias.name)
                aliases[alias.asname or alias.name] = alias.name
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases \
                and node.attr.startswith("_") and not node.attr.startswith("__"):
            private.add((aliases[node.value.id], node.attr))
    return imported, private


def test_planted_and_synthetic_do_not_import_each_other_in_a_circle() -> None:
    planted_imports, planted_private = _imports_and_private_uses("planted")
    synthetic_imports, synthetic_private = _imports_and_private_uses("synthetic")
    assert "curate.collect.synthetic" not in planted_imports
    assert "curate.collect.planted" in synthetic_imports
    assert not {(m, n) for m, n in planted_private if m.startswith("curate.collect")}, planted_private
    assert not {(m, n) for m, n in synthetic_private if m.startswith("curate.collect")}, synthetic_private


#: sha256 over worlds with every planted kind, both outlines, an uncommon scale and
#: counterfactuals, computed before planted.py and synthetic.py were untied.
WORLD_DIGEST = "d42d78f2ee67a5dd60c2f0eab2d4ffeee8ba5fbba250585c05e532943a20fc3e"


def _world_digest() -> tuple[int, str]:
    from curate.collect.synthetic import DEFAULT_CLASSES, WorldSpec, generate_world, render_counterfactual

    specs = [
        WorldSpec(classes=DEFAULT_CLASSES[:4], per_class=12, image_size=32, seed=3, wrong_label_rate=0.15,
                  duplicate_rate=0.15, near_duplicate_rate=0.15, feature_noise_rate=0.15, second_object_rate=0.15,
                  small_object_rate=0.2),
        WorldSpec(classes=DEFAULT_CLASSES[:3], per_class=8, image_size=32, seed=9, feature_noise_rate=0.5,
                  small_object_rate=0.5, uncommon_scale=0.7, p=0.5),
        WorldSpec(classes=DEFAULT_CLASSES[:3], per_class=4, image_size=40, seed=2, outline="double", p=0.5),
        WorldSpec(classes=DEFAULT_CLASSES[:2], per_class=10, image_size=32, seed=5, duplicate_rate=0.3,
                  near_duplicate_rate=0.3),
    ]
    digest, count = hashlib.sha256(), 0
    for spec in specs:
        for sample in generate_world(spec):
            digest.update(sample.image.tobytes() + sample.mask.tobytes() + sample.background.encode())
            digest.update(json.dumps(sample.extra, sort_keys=True, default=str).encode())
            count += 1
    for index in range(0, 12, 3):
        sample = render_counterfactual(specs[2], index, background="road", scale=1.2)
        digest.update(sample.image.tobytes() + sample.mask.tobytes())
        count += 1
    return count, digest.hexdigest()


def test_the_planted_world_is_byte_identical() -> None:
    count, digest = _world_digest()
    assert count == 48 + 24 + 12 + 20 + 4
    assert digest == WORLD_DIGEST


def test_yaml_of_a_folder_job_is_plain(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    _imagefolder(Path("src"))
    assert _invoke("collect", "folder", "./data", "./src").exit_code == 0
    config = yaml.safe_load((tmp_path / "data" / "dataset.yaml").read_text())
    job = next(iter(config["provenance"]["collect.folder"]["jobs"].values()))
    assert Path(job["src"]).is_absolute() and job["journal"].startswith(".collect/")


# ------------------------------------------------------------------------------------------
# issue 45: what a log file or a pipe receives from the collectors
# ------------------------------------------------------------------------------------------


def _two_split_hub_folder(src: Path) -> Path:
    """A Hub folder with a train and a validation split (ostrich and brambling photos)."""
    import datasets

    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=["ostrich", "brambling"])})
    (src / "data").mkdir(parents=True)
    for k, split in enumerate(("train", "validation")):
        images = [io.BytesIO() for _ in range(3)]
        for j, buffer in enumerate(images):
            Image.fromarray(np.full((8, 8, 3), 40 * k + 10 * j, np.uint8)).save(buffer, "PNG")
        datasets.Dataset.from_dict({"image": [{"bytes": b.getvalue(), "path": None} for b in images],
                                    "label": [0, 1, 0]}, features=features).to_parquet(
            str(src / "data" / f"{split}-00000-of-00001.parquet"))
    return src


@pytest.mark.parametrize("args", [
    ["hub", "{tmp}/no-such-folder", "{tmp}/ds"],
    ["hub", "{hub}", "{tmp}/ds", "--label-column", "species"],
    ["folder", "{tmp}/ds", "{bad}"],
    ["coco", "{tmp}/ds", "--annotations", "{annotations}"],
    ["webdataset", "{annotations}/ds", "--shards", "{shard}"],  # DIR under a file: refused after the shards check
])
def test_a_refused_collect_prints_its_error_and_no_progress_line(tmp_path, args) -> None:
    """A request the collector refuses before any work prints one ``error:`` line where stderr is a
    pipe, not ``importing: 0 done in 00:00 (0/s)`` before it."""
    _image(tmp_path / "bad" / "dragon" / "1.jpg", 1)
    (tmp_path / "instances.json").write_text(json.dumps({"images": [], "annotations": [], "categories": []}))
    import tarfile

    _image(tmp_path / "member" / "k0.jpg", 2)
    with tarfile.open(tmp_path / "shard-0.tar", "w") as tar:
        tar.add(tmp_path / "member" / "k0.jpg", arcname="k0.jpg")
    values = {"tmp": tmp_path, "bad": tmp_path / "bad", "annotations": tmp_path / "instances.json",
              "hub": _two_split_hub_folder(tmp_path / "hubsrc"), "shard": tmp_path / "shard-0.tar"}
    result = CliRunner().invoke(main, ["collect", *(a.format(**values) for a in args)])
    assert result.exit_code != 0, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), result.output
    assert not (tmp_path / "ds").exists()


def test_collect_progress_in_a_log_file_is_plain_text(tmp_path) -> None:
    """`collect hub ... 2> log`: the per-split progress line names the split in plain words, no rich markup."""
    import os
    import subprocess
    import sys

    src = _two_split_hub_folder(tmp_path / "hubsrc")
    log = tmp_path / "collect.log"
    with log.open("w") as handle:
        done = subprocess.run([sys.executable, "-m", "curate.cli", "collect", "hub", str(src), str(tmp_path / "ds")],
                              stdout=handle, stderr=subprocess.STDOUT, timeout=120, check=False,
                              env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)})
    text = log.read_text()
    assert done.returncode == 0, text
    assert "importing validation: 6 done in" in text, text
    assert "[dim]" not in text and "[/" not in text


def test_photos_without_a_licence_are_said_at_import_and_by_check(tmp_path) -> None:
    """An import that brings no licence warns that `curate publish` will leave those photos out, and
    `curate check` says it too (while the folder stays valid: exit 0, "ok")."""
    _imagefolder(tmp_path / "src")
    result = _invoke("collect", "folder", str(tmp_path / "ds"), str(tmp_path / "src"))
    assert result.exit_code == 0, result.output
    assert "3 photo(s) will not be published for their licence (no licence stated" in result.output, result.output
    checked = _invoke("check", str(tmp_path / "ds"))
    assert checked.exit_code == 0, checked.output
    assert "3 photo(s) will not be published for their licence" in checked.output and "ok" in checked.output
    assert not check_dataset(tmp_path / "ds")  # valid: a warning about publishing, not a problem of the folder
    _imagefolder(tmp_path / "src2", seed=10)
    licensed = _invoke("collect", "folder", str(tmp_path / "ds2"), str(tmp_path / "src2"), "--license", "cc-by-4.0")
    assert licensed.exit_code == 0 and "will not be published" not in licensed.output, licensed.output
    assert "will not be published" not in _invoke("check", str(tmp_path / "ds2")).output
