"""Rehearsal: the whole workflow, offline, on stand-ins of CounterAnimal's size (issue 29 §1).

CounterAnimal has about 13,000 photos in 45 classes, per-photo provenance, dozens of model runs and
thousands of review tasks. This script runs every stage of curate on a folder of that shape and
prints, per stage, **wall time, CPU time and peak memory (RSS)** as a table, with a line per stage
on what it did (counts). Stages, in the order a user runs them:

1. **build**: ``--photos`` synthetic photos (``curate.collect.synthetic``'s generator, ``--size``
   px) in ``--classes`` ImageNet animal classes, added with ``Dataset.add_samples`` as
   ``curate collect inat`` writes its rows: ``source="inat"``, photo id, photo URL, a mixed licence
   (cc0 / cc-by / cc-by-nc), attribution, and the collector's ``extra`` (observation id and URL,
   photo id, observer, observer id and name, place, coordinates, taxon, quality grade, job: the
   fields of ``curate/collect/inat.py``), plus the world's exact mask and synthetic background.
   The generator has 10 silhouettes: class ``c`` draws silhouette ``c % 10``, on its common
   background with probability ``--p`` and otherwise on one of its own 3 other backgrounds (of
   10), so that each background of a class has the split's 10 photos; two classes can share a
   silhouette (accuracy is not the point).
2. **train**: ``--trained`` tiny CLIPs (``curate.train_reference``, ``--steps`` steps each, own
   seeds) on a subset of the photos (``--train-photos``).
3. **backgrounds**: ``curate label-backgrounds --measure`` with the first trained CLIP: CLIP
   pre-labels of every photo scored against the (synthetic) background labels; writes nothing.
4. **split**: ``curate split`` with the first trained CLIP as the reference (easy/hard groups).
5. **evaluate**: ``--runs`` ``curate evaluate`` runs (1 vs 1000, bootstrap 1000): the trained CLIPs,
   then random-weight tiny CLIPs (``curate-tiny-clip-rn``, ``curate-tiny-clip``, ``curate-tiny-rn``,
   ``curate-tiny-vit``) and a timm test classifier (``timm:test_vit``) of several seeds, cycled
   until ``--runs`` runs exist.
6. **compare**, **report**, **audit** (every check, the first trained CLIP).
7. **explain**: ``curate explain`` (``curate.stages.explain.explain``) with the first trained CLIP,
   the CLI's defaults: GradCAM maps of the true class, 1 vs 1000, SSS and RMA on the exact masks,
   by easy / hard. Every photo by default (~3.5 ms of CPU a photo at 48 px, ~1 min at 13,000);
   ``--explain-limit N`` keeps the first N photos of each class.
8. **discover**: ``curate discover`` (``curate.stages.discover.discover``) with the first trained
   CLIP and the CLI's defaults: background embeddings with the object removed (every photo has an
   exact mask), groups per class on two halves, 2,000 permutations, FDR 0.1. Correctness comes
   from that CLIP's finished evaluate run (``--predictions``), as a user who ran ``evaluate``
   first would pass it; without one (evaluate skipped) the stage evaluates the CLIP itself.
9. **intervene make** / **evaluate** / **attribution**: ``curate intervene`` with every variant
   (only-fg, no-fg, only-bg, mixed-same / rand / next, swap, paste, noise-fg / bg and 8
   adversarial backgrounds: ~19 images a photo) into a new folder, ``curate evaluate`` of that
   folder with the first trained CLIP (1 vs 1000), and ``curate attribution``: the drop, its
   background part and the rest, with paired bootstrap intervals. Only easy / hard photos are
   used (~30% here), at most ``--intervene-per-cell`` of them per (class, group) (``--per-cell``;
   default 50, which keeps the scarce hard photos and trims the easy ones; 0 = every photo).
   Uncapped, 13,000 photos would make ~74,000 images, ~2 min of CPU to make and ~2 min to evaluate.
10. **fiftyone push** / **fiftyone pull** of every sample, against a private offline ``mongod``
   (``.services/mongodb``, as the test suites start it); skipped with a printed reason when the
   services are not provisioned (``make services``).
11. **labelstudio start** / **push** / **pull** of every sample (``all_samples=True``), against a
   Label Studio server on 127.0.0.1 started as the tests do (``.services/labelstudio-venv``), with
   the local-files document root set to the work folder.
12. **publish**: ``write_hub_folder`` to a local Hub folder (every sample, split or not).

CPU time is user + system of this process and its threads, plus the CPU time the stage's child
processes used (decoding workers, ``mongod``, the Label Studio server; read with psutil while they
live, and from ``RUSAGE_CHILDREN`` once reaped). Peak RSS is sampled every 50 ms with psutil: this
process, and apart its child processes together (the servers). CPU time moves much less with the
load of a shared machine than wall time.

    .venv/bin/python benchmarks/rehearsal.py --small                 # 900 photos, 9 classes, 4 runs: minutes
    .venv/bin/python benchmarks/rehearsal.py                         # 13,000 photos, 45 classes, 20 runs
    .venv/bin/python benchmarks/rehearsal.py --photos 4500 --classes 15 --runs 8 --skip labelstudio
    .venv/bin/python benchmarks/rehearsal.py --small --keep /tmp/rehearsal   # keep the work folder

It runs on demand, not in ``make test``.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import secrets
import shutil
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

try:
    import psutil
except ImportError:  # peak RSS then falls back to ru_maxrss (this process, whole run)
    psutil = None

STAGES = ("build", "train", "backgrounds", "split", "evaluate", "compare", "report", "audit", "explain", "discover",
          "intervene", "fiftyone", "labelstudio", "publish")
#: Random-weight models cycled after the trained CLIPs (name, what it is).
#: timm's test_resnet is left out: 160 px input, ~30 ms a photo here (6.5 min a run at 13,000 photos).
RANDOM_MODELS = ("curate-tiny-clip-rn", "curate-tiny-clip", "curate-tiny-rn", "curate-tiny-vit", "timm:test_vit")
LICENSES = (("cc-by-nc", "CC-BY-NC", "some rights reserved (CC BY-NC)"), ("cc-by", "CC-BY", "some rights reserved (CC BY)"),
            ("cc0", "CC0", "no rights reserved"))


# ---------------------------------------------------------------------------------------------
# Measuring
# ---------------------------------------------------------------------------------------------

@dataclass
class Row:
    stage: str
    wall: float = 0.0
    cpu: float = 0.0
    peak_self: float = float("nan")  # MiB
    peak_children: float = 0.0  # MiB
    note: str = ""
    skipped: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


class Meter:
    """Wall, CPU (self + children) and sampled peak RSS of a block."""

    def __init__(self) -> None:
        self.me = psutil.Process() if psutil else None

    def _children(self) -> dict[int, tuple[float, float]]:
        """pid -> (cpu seconds, rss MiB) of the live descendants."""
        out: dict[int, tuple[float, float]] = {}
        if self.me is None:
            return out
        for child in self.me.children(recursive=True):
            try:
                times, rss = child.cpu_times(), child.memory_info().rss
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            out[child.pid] = (times.user + times.system, rss / 2**20)
        return out

    def run(self, stage: str, fn: Callable[[], str]) -> Row:
        row = Row(stage)
        peaks = {"self": 0.0, "children": 0.0}
        stop = threading.Event()

        def sample() -> None:
            while not stop.is_set():
                if self.me is not None:
                    try:
                        peaks["self"] = max(peaks["self"], self.me.memory_info().rss / 2**20)
                        peaks["children"] = max(peaks["children"], sum(v[1] for v in self._children().values()))
                    except Exception:  # a child ending between the listing and the read
                        pass
                stop.wait(0.05)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        before_children = self._children()
        self_cpu0 = _rusage(resource.RUSAGE_SELF)
        reaped0 = _rusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        try:
            row.note = fn() or ""
        except SkipStage as skip:
            row.skipped = str(skip)
        except Exception as error:  # report the stage as failed, keep the others
            row.skipped = f"FAILED: {type(error).__name__}: {str(error)[:300]}"
            traceback.print_exc()
        row.wall = time.perf_counter() - start
        after_children = self._children()
        stop.set()
        sampler.join()
        live = sum(cpu - before_children.get(pid, (0.0, 0.0))[0] for pid, (cpu, _) in after_children.items())
        gone_before = sum(before_children[pid][0] for pid in before_children if pid not in after_children)
        reaped = _rusage(resource.RUSAGE_CHILDREN) - reaped0 - gone_before
        row.cpu = _rusage(resource.RUSAGE_SELF) - self_cpu0 + live + max(0.0, reaped)
        row.peak_self = peaks["self"] if self.me is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        row.peak_children = peaks["children"]
        status = f"skipped: {row.skipped}" if row.skipped else row.note
        print(f"[{stage}] {row.wall:.1f} s wall, {row.cpu:.1f} CPU-s, peak {row.peak_self:.0f} MiB "
              f"(+{row.peak_children:.0f} children): {status}", file=sys.stderr, flush=True)
        return row


class SkipStage(Exception):
    pass


def _rusage(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


# ---------------------------------------------------------------------------------------------
# The stand-in folder
# ---------------------------------------------------------------------------------------------

def animal_classes(n: int) -> list[tuple[int, str]]:
    """``n`` ImageNet-1K animal classes (indices < 398): the synthetic world's ten first, then
    others spread evenly over the animal range."""
    from curate.collect.synthetic import DEFAULT_CLASSES
    from curate.labels import imagenet1k

    names = imagenet1k().names
    chosen = [c.imagenet_index for c in DEFAULT_CLASSES][:n]
    rest = [i for i in np.linspace(0, 397, 4 * n).astype(int).tolist() if i not in chosen]
    for i in rest:
        if len(chosen) >= n:
            break
        if i not in chosen:
            chosen.append(i)
    return [(i, names[i]) for i in chosen[:n]]


def inat_row(ordinal: int, cls_index: int, cls_name: str, job: str) -> dict[str, Any]:
    """source, source_id, source_url, license, attribution and ``extra`` as ``curate collect inat``
    writes them (curate/collect/inat.py), unique per photo."""
    obs, photo, user = 10_000_000 + ordinal * 7, 50_000_000 + ordinal * 3, ordinal % 5_000
    code, raw, words = LICENSES[ordinal % len(LICENSES)]
    observer = f"naturalist{user}"
    extra = {
        "observation_id": obs,
        "observation_url": f"https://www.inaturalist.org/observations/{obs}",
        "photo_id": photo,
        "observer": observer,
        "observer_id": user,
        "observer_name": f"Observer Number {user}",
        "observed_on": f"2023-05-{10 + ordinal % 18}",
        "observed_at": f"2023-05-{10 + ordinal % 18}T{10 + ordinal % 12}:00:00+00:00",
        "place": f"Nature Reserve {ordinal % 900}, Some County, Some Country",
        "location": [round((ordinal % 1_800) / 10 - 90, 1), round((ordinal % 3_600) / 10 - 180, 1)],
        "quality_grade": "research",
        "taxon_id": 40_000 + cls_index,
        "taxon_name": f"Genus species{cls_index}",
        "taxon_rank": "species",
        "taxon_common_name": cls_name,
        "query_taxon_ids": [40_000 + cls_index],
        "photo_size": "medium",
        "original_dimensions": [2048, 1536],
        "license_code": raw,
        "inat_job": job,
    }
    return {"source": "inat", "source_id": str(photo),
            "source_url": f"https://inaturalist-open-data.s3.amazonaws.com/photos/{photo}/medium.jpg",
            "license": code, "attribution": f"(c) {observer}, {words}", "extra": extra}


def build_folder(root: Path, photos: int, n_classes: int, size: int, p: float, train_photos: int
                 ) -> tuple[Any, np.ndarray, np.ndarray, list[str], dict[int, str]]:
    """Write the stand-in folder; returns the dataset, a training subset (images, labels, names) and
    each class's common background."""
    from curate.collect.synthetic import (
        BACKGROUNDS,
        DEFAULT_CLASSES,
        SyntheticClass,
        WorldSpec,
        generate_sample,
        png_bytes,
    )
    from curate.store import Dataset, NewSample

    backgrounds = tuple(BACKGROUNDS)[:10]
    classes = animal_classes(n_classes)
    per = [photos // n_classes + (1 if c < photos % n_classes else 0) for c in range(n_classes)]
    ds = Dataset.create(root, name=root.name, backgrounds=list(backgrounds), recipe="rehearsal")
    train_every = max(1, photos // max(1, train_photos))
    train_x: list[np.ndarray] = []
    train_y: list[int] = []
    job = "inat-2024-05-01T10:00:00"
    common_of: dict[int, str] = {}

    def items():
        ordinal = 0
        for c, (index, name) in enumerate(classes):
            base = DEFAULT_CLASSES[c % len(DEFAULT_CLASSES)]
            common = backgrounds[(c + c // len(DEFAULT_CLASSES)) % len(backgrounds)]
            k = backgrounds.index(common)
            own = tuple(backgrounds[(k + j * (c % 3 + 1)) % len(backgrounds)] for j in range(4))  # 4 distinct
            spec = WorldSpec(classes=(SyntheticClass(index, name, base.shape, common),), backgrounds=own, p=p,
                             per_class=per[c], image_size=size, seed=1_000 + c)
            common_of[index] = common
            for i in range(per[c]):
                sample = generate_sample(spec, i)
                if ordinal % train_every == 0 and len(train_x) < train_photos:
                    train_x.append(sample.image)
                    train_y.append(c)
                yield NewSample(image=png_bytes(sample.image), class_index=index, status="accepted",
                                background=sample.background, background_source="synthetic", background_score=1.0,
                                mask=sample.mask, mask_status="synthetic", **inat_row(ordinal, index, name, job))
                ordinal += 1

    report = ds.add_samples(items(), actor="collect.inat")
    if report.quarantined:
        raise RuntimeError(f"{len(report.quarantined)} photos quarantined: {report.quarantined[:3]}")
    ds = Dataset.open(root)
    return ds, np.stack(train_x), np.asarray(train_y), [name for _, name in classes], common_of


# ---------------------------------------------------------------------------------------------
# The rehearsal
# ---------------------------------------------------------------------------------------------

def rehearse(args: argparse.Namespace, work: Path) -> list[Row]:
    import torch

    torch.set_num_threads(args.threads)
    meter = Meter()
    rows: list[Row] = []
    root = work / "counteranimal-standin"
    state: dict[str, Any] = {}
    skip = set(args.skip)

    def stage(name: str, fn: Callable[[], str]) -> None:
        if name.split(" ")[0] in skip:
            rows.append(Row(name, skipped="--skip"))
            print(f"[{name}] skipped (--skip)", file=sys.stderr, flush=True)
            return
        rows.append(meter.run(name, fn))

    def build() -> str:
        ds, x, y, names, common = build_folder(root, args.photos, args.classes, args.size, args.p, args.train_photos)
        state.update(ds=ds, x=x, y=y, names=names, common=common)
        extra_bytes = sum(len(r["extra"] or "") for r in ds.rows()) / max(1, len(ds))
        mib = sum(f.stat().st_size for f in root.rglob("*") if f.is_file()) / 2**20
        return (f"{len(ds):,} photos in {len(names)} classes ({args.size} px PNGs + exact masks), iNaturalist-shaped "
                f"provenance (extra ~{extra_bytes:.0f} B/row, 3 licences), synthetic backgrounds; folder {mib:.0f} MiB")

    def train() -> str:
        from curate.train_reference import TrainConfig, train_reference_clip

        weights = []
        every = max(1, args.steps // 5)
        for seed in range(args.trained):
            out = work / "models" / f"tiny-clip-seed{seed}.pt"
            config = TrainConfig(steps=args.steps, batch_size=128, seed=seed, threads=args.threads)
            def progress(step: int, loss: float, seed: int = seed) -> None:
                if (step + 1) % every == 0:
                    print(f"  train seed {seed}: step {step + 1}/{args.steps}, loss {loss:.3f}", file=sys.stderr, flush=True)

            result = train_reference_clip(state["x"], state["y"], state["names"], out, config,
                                          meta={"rehearsal": True, "seed": seed}, progress=progress)
            weights.append((out, result.losses[0], result.losses[-1]))
        state["weights"] = [w for w, _, _ in weights]
        losses = ", ".join(f"{a:.2f}->{b:.2f}" for _, a, b in weights)
        return (f"{args.trained} tiny CLIP(s) (curate-tiny-clip-rn), {args.steps} steps of 128 on {len(state['y']):,} "
                f"photos, loss {losses}")

    def reference():
        from curate.models import ModelSpec

        if not state.get("weights"):
            raise SkipStage("no trained CLIP (train stage skipped or failed)")
        return ModelSpec("auto", str(state["weights"][0]))

    def backgrounds() -> str:
        from curate.stages.label_backgrounds import LabelBackgroundsSettings, label_backgrounds

        report = label_backgrounds(root, reference(), LabelBackgroundsSettings(measure=True, device="cpu"))
        return (f"CLIP pre-labels of {report.n_measured:,} photos measured against the synthetic labels: agreement "
                f"{100 * (report.agreement or 0):.1f}% (chance {100 * (report.chance_uniform or 0):.1f}%); nothing written")

    def split() -> str:
        from curate.stages.split import SplitSettings
        from curate.stages.split import split as split_stage
        from curate.store import Dataset

        run = split_stage(root, reference(), SplitSettings(device="cpu"), run_name="split-rehearsal", overwrite=True)
        ds = Dataset.open(root)
        note = ""
        if not run.kept:  # the later stages need easy/hard groups: the world's truth instead
            common = state["common"]
            per_sample = {r["sample_id"]: {"group": "easy" if r["background"] == common[r["class_index"]] else "hard"}
                          for r in ds.rows()}
            ds.update(list(per_sample), per_sample=per_sample, actor="rehearsal", reason="truth groups (split kept none)")
            note = "; the split kept no class, so the groups are the world's truth (easy = common background)"
        groups: dict[str, int] = {}
        for r in Dataset.open(root).rows():
            groups[str(r["group"])] = groups.get(str(r["group"]), 0) + 1
        return f"{len(run.kept)} of {args.classes} classes kept; groups {dict(sorted(groups.items()))}{note}"

    def evaluate() -> str:
        import curate
        from curate.stages.evaluate import EvalSettings
        from curate.stages.evaluate import evaluate as evaluate_stage

        settings = EvalSettings(device="cpu", label_space="imagenet1k")
        plan: list[tuple[str, Any]] = [(f"trained-seed{i}", curate.ModelSpec("auto", str(w)))
                                       for i, w in enumerate(state.get("weights", []))][: args.runs]
        k = 0
        while len(plan) < args.runs:
            name = RANDOM_MODELS[k % len(RANDOM_MODELS)]
            seed = k // len(RANDOM_MODELS)
            plan.append((f"{name.replace(':', '-')}-seed{seed}", (name, seed)))
            k += 1
        per_run = []
        for i, (label, model) in enumerate(plan):
            start, cpu0 = time.perf_counter(), _rusage(resource.RUSAGE_SELF)
            if isinstance(model, tuple):
                model = curate.load_model(model[0], None, device="cpu", seed=model[1])
            run = evaluate_stage(root, model, settings, run_name=f"eval-{i:02d}-{label}", overwrite=True)
            if i == 0 and label == "trained-seed0":  # the reference CLIP's run: discover's --predictions
                state["reference_eval"] = run.name
            per_run.append((label, time.perf_counter() - start, _rusage(resource.RUSAGE_SELF) - cpu0))
            try:
                accuracy = f"easy {100 * run.group('easy').acc1:.1f} hard {100 * run.group('hard').acc1:.1f}"
            except Exception:  # noqa: BLE001 - no groups (the split stage skipped or kept nothing)
                accuracy = "no easy/hard groups"
            print(f"  evaluate {i + 1}/{len(plan)} {label}: {per_run[-1][1]:.1f} s wall, {per_run[-1][2]:.1f} CPU-s, "
                  f"{accuracy}", file=sys.stderr, flush=True)
        state["eval_runs"] = per_run
        walls = [w for _, w, _ in per_run]
        return (f"{len(per_run)} runs (1 vs 1000, bootstrap 1000): {sum(1 for _, m in plan if not isinstance(m, tuple))} "
                f"trained CLIPs, the rest random-weight tiny CLIPs / timm test classifiers; per run {min(walls):.1f}-"
                f"{max(walls):.1f} s wall")

    def compare() -> str:
        from curate.compare import compare_runs

        rows_, out = compare_runs(root)
        return f"{len(rows_)} rows in {out.relative_to(work)}"

    def report() -> str:
        from curate.report import build_report

        path = build_report(root, work / "report")
        return f"{path.relative_to(work)} ({path.stat().st_size / 1024:.0f} KiB) and report.html"

    def audit() -> str:
        from curate.stages.audit import AuditSettings
        from curate.stages.audit import audit as audit_stage

        run = audit_stage(root, reference(), AuditSettings(device="cpu"), run_name="audit-rehearsal", overwrite=True)
        tagged = sum(1 for r in state["ds"].__class__.open(root).rows() if any(t.startswith("suspect:") for t in r["tags"] or []))
        return f"checks {', '.join(run.checks)} on {run.dataset.get('samples', '?'):,} photos; {tagged:,} photos pre-tagged suspect:*"

    def explain() -> str:
        from curate.stages.explain import ExplainSettings
        from curate.stages.explain import explain as explain_stage
        from curate.store import Dataset

        # the first --explain-limit photos of each class with a mask, in the folder's order
        limit = args.explain_limit or None
        taken: dict[int, int] = {}
        chosen = []
        for r in Dataset.open(root).rows(status=["accepted", "candidate"]):
            if r["mask_path"] is None or r["class_index"] is None:
                continue
            c = int(r["class_index"])
            if limit is None or taken.get(c, 0) < limit:
                taken[c] = taken.get(c, 0) + 1
                chosen.append(r["sample_id"])
        settings = ExplainSettings(method="gradcam", target="true", label_space="dataset", device="cpu",
                                   sample_ids=tuple(chosen) if limit else None)
        run = explain_stage(root, reference(), settings, run_name="explain-rehearsal", overwrite=True)
        cap = f"at most {limit} a class" if limit else "every photo"
        parts = "; ".join(f"{part} SSS {g.sss.mean:.3f} RMA {g.rma.mean:.3f} (uniform {g.sss_uniform:.3f}, n {g.n})"
                          for part, g in run.groups.items())
        nan = f"; NaN maps {run.nan_count} ({', '.join(f'{k} {v}' for k, v in run.nan_reasons.items())})" \
            if run.nan_count else ""
        skipped = f"; {run.skipped_count} skipped" if run.skipped_count else ""
        return (f"{run.method} @ {run.layer}, target {run.target}, 1 vs {run.config.get('num_classes_scored')}: "
                f"{run.n_images:,} photos ({cap}), {run.n_predictions:,} maps, {run.mask_line}; "
                f"SSS {run.overall.sss.mean:.3f} overall; {parts}{nan}{skipped}")

    def discover() -> str:
        from curate.stages.discover import DiscoverSettings
        from curate.stages.discover import discover as discover_stage

        predictions = (state["reference_eval"],) if state.get("reference_eval") else ()
        settings = DiscoverSettings(device="cpu", predictions=predictions)
        record = discover_stage(root, reference(), settings, run_name="discover-rehearsal", overwrite=True)
        c = record.counts
        proposed = record.proposed
        best = max(proposed, key=lambda g: g.gap, default=None)
        headline = (f"; largest gap {best.gap:+.1f} points [{best.gap_low:+.0f}, {best.gap_high:+.0f}] "
                    f"({best.group_id}, {best.size} photos, q {best.q_value:.3f}, labelled as {best.labelled_as} "
                    f"{100 * best.labelled_share:.0f}%, named '{best.top_name}')" if best else "")
        without = ", ".join(f"{v} {k}" for k, v in (c.get("classes_without_groups") or {}).items())
        left = ", ".join(f"{v} {k}" for k, v in (c.get("left_out") or {}).items())
        source = f"predictions {predictions[0]}" if predictions else "the CLIP evaluated now (discover-ref-*)"
        return (f"{c.get('grouped', 0):,} of {c.get('photos', 0):,} photos grouped in {c.get('classes', 0)} classes "
                f"(embedding {c.get('methods')}; correctness from {source}); {c.get('groups', 0)} groups, "
                f"{c.get('significant', 0)} significant at FDR {record.fdr:g} ({c.get('significant_new', 0)} new)"
                f"{'; without groups: ' + without if without else ''}{'; left out: ' + left if left else ''}{headline}")

    out_dir = work / "interventions"

    def intervene_make() -> str:
        from curate.stages.intervene import InterveneSettings
        from curate.stages.intervene import intervene as intervene_stage

        settings = InterveneSettings(per_cell=args.intervene_per_cell or None)
        record = intervene_stage(root, out_dir, settings, run_name="intervene", overwrite=True)
        state["intervened"] = True
        c = record.counts
        groups = c.get("by_group") or {}
        skipped = ", ".join(f"{v} {k}" for k, v in (c.get("skipped_sources") or {}).items())
        missing = ", ".join(f"{v} {k}" for k, v in (c.get("not_planned") or {}).items())
        mib = sum(f.stat().st_size for f in out_dir.rglob("*") if f.is_file()) / 2**20
        cap = f"at most {args.intervene_per_cell} per (class, group)" if args.intervene_per_cell else "every photo"
        return (f"{c.get('sources', 0):,} photos ({cap}: {groups.get('easy', 0)} easy, {groups.get('hard', 0)} hard, "
                f"{c.get('classes', 0)} classes) -> {c.get('images', 0):,} images ({len(c.get('variants') or {})} "
                f"variants: {', '.join(f'{k} {v}' for k, v in (c.get('variants') or {}).items())}), folder {mib:.0f} MiB"
                f"{'; skipped ' + skipped if skipped else ''}{'; not planned ' + missing if missing else ''}")

    def intervene_evaluate() -> str:
        from curate.stages.evaluate import EvalSettings
        from curate.stages.evaluate import evaluate as evaluate_stage

        if not state.get("intervened"):
            raise SkipStage("no intervention folder")
        run = evaluate_stage(out_dir, reference(), EvalSettings(device="cpu", label_space="imagenet1k"),
                             run_name="eval-reference", overwrite=True)
        state["intervention_eval"] = run.name
        n = len(run.correct1_by_sample())
        return f"the first trained CLIP on the {n:,} intervention images (1 vs 1000, bootstrap 1000)"

    def intervene_attribution() -> str:
        from curate.stages.attribution import AttributionSettings, attribution

        if not state.get("intervention_eval"):
            raise SkipStage("the intervention folder was not evaluated")
        record = attribution(out_dir, [state["intervention_eval"]], AttributionSettings(),
                             run_name="attribution-rehearsal", overwrite=True)
        m = record.models[0]

        def fig(name: str) -> str:
            low, high = m.interval(name)
            return f"{100 * m.value(name):+.1f} [{100 * low:+.1f}, {100 * high:+.1f}]"

        return (f"drop D {fig('drop')} points = background B {fig('background_part')} + rest {fig('rest')} "
                f"({m.classes_used} classes); paste control {fig('paste_cost')}; only-FG "
                f"{100 * m.value('only_fg'):.1f}%, BG-gap {100 * m.value('bg_gap'):+.1f}; {len(m.flagged)} classes "
                f"flagged (paste control > 5 points); bootstrap 1000")

    services: dict[str, Any] = {}

    def fiftyone_start() -> str:
        from curate.review.database import start_mongod
        from curate.review.provision import ServiceError, provision_mongod, services_dir

        if not (services_dir() / "mongodb").is_dir():
            raise SkipStage(f"MongoDB is not provisioned in {services_dir()} (run `make services`)")
        try:
            binaries = provision_mongod()
        except ServiceError as error:
            raise SkipStage(f"MongoDB is not provisioned ({error}); run `make services`") from error
        server = start_mongod(work / "mongo" / "db", binaries=binaries)
        services["mongo"] = server
        os.environ.update(FIFTYONE_DATABASE_URI=server.uri, FIFTYONE_DATABASE_VALIDATION="false",
                          FIFTYONE_DO_NOT_TRACK="true")
        from curate.review.fiftyone import import_fiftyone_module

        fo = import_fiftyone_module()
        import fiftyone.core.odm.database as fodb

        if fo.config.database_uri != server.uri:
            fodb._disconnect()
            fo.config.database_uri = server.uri
        fo.config.database_validation = False
        return f"private mongod {binaries.version()} on port {server.port}; FiftyOne imported"

    def fiftyone_push() -> str:
        from curate.review.fiftyone import push_fiftyone

        if "mongo" not in services:
            raise SkipStage("no MongoDB")
        result = push_fiftyone(root, name=f"rehearsal-{secrets.token_hex(3)}")
        services["fo_name"] = result.name
        return (f"{result.samples:,} samples ({result.added:,} added), {len(result.runs)} run fields, "
                f"{len(result.views)} saved views")

    def fiftyone_pull() -> str:
        from curate.review.fiftyone import pull_fiftyone

        if "fo_name" not in services:
            raise SkipStage("nothing pushed")
        pulled = pull_fiftyone(root, name=services["fo_name"])
        return (f"{pulled.observed:,} samples read back, {len(pulled.applied)} changes, {len(pulled.conflicts)} "
                f"conflicts, {len(pulled.problems)} problems (no reviewer edits: the read path)")

    def labelstudio_start() -> str:
        from curate.review.database import start_labelstudio
        from curate.review.provision import ServiceError, provision_labelstudio, services_dir

        if not (services_dir() / "labelstudio-venv").is_dir():
            raise SkipStage(f"Label Studio is not provisioned in {services_dir()} (run `make services`)")
        try:
            venv = provision_labelstudio()
        except ServiceError as error:
            raise SkipStage(f"Label Studio is not provisioned ({error}); run `make services`") from error
        token = secrets.token_hex(20)
        server = start_labelstudio(work / "labelstudio" / "data", username="reviewer@example.com",
                                   password=secrets.token_urlsafe(16), token=token, document_root=work, venv=venv)
        services.update(ls=server, ls_token=token)
        return f"label-studio on {server.url} (first start: migrations)"

    def labelstudio_push() -> str:
        from curate.review.labelstudio import MediaSource, push_labelstudio

        if "ls" not in services:
            raise SkipStage("no Label Studio server")
        result = push_labelstudio(root, url=services["ls"].url, token=services["ls_token"], project="rehearsal",
                                  all_samples=True, media=MediaSource("local-files", document_root=work))
        services["ls_pushed"] = True
        return f"{result.imported:,} tasks imported into project {result.project_id} ({result.refreshed} refreshed)"

    def labelstudio_pull() -> str:
        from curate.review.labelstudio import pull_labelstudio

        if not services.get("ls_pushed"):
            raise SkipStage("nothing pushed")
        pulled = pull_labelstudio(root, url=services["ls"].url, token=services["ls_token"], project="rehearsal")
        return (f"project exported and read back: {pulled.observed:,} annotated tasks, {len(pulled.applied)} changes "
                f"(nobody annotated: the export and read path)")

    def publish() -> str:
        from curate.publish import write_hub_folder

        hub = write_hub_folder(root, work / "hub", include_unsplit=True, force=True)
        mib = sum(f.stat().st_size for f in hub.path.rglob("*") if f.is_file()) / 2**20
        return (f"splits {hub.splits}, {hub.classes} classes, {len(hub.files)} files, {mib:.0f} MiB; "
                f"excluded {hub.excluded or {}}; licence {hub.licence.license} {hub.licence.counts}")

    try:
        stage("build", build)
        stage("train", train)
        stage("backgrounds", backgrounds)
        stage("split", split)
        stage("evaluate", evaluate)
        stage("compare", compare)
        stage("report", report)
        stage("audit", audit)
        stage("explain", explain)
        stage("discover", discover)
        stage("intervene make", intervene_make)
        stage("intervene evaluate", intervene_evaluate)
        stage("intervene attribution", intervene_attribution)
        stage("fiftyone start", fiftyone_start)
        stage("fiftyone push", fiftyone_push)
        stage("fiftyone pull", fiftyone_pull)
        stage("labelstudio start", labelstudio_start)
        stage("labelstudio push", labelstudio_push)
        stage("labelstudio pull", labelstudio_pull)
        stage("publish", publish)
    finally:
        for key in ("ls", "mongo"):
            if key in services:
                try:
                    services[key].stop()
                except Exception as error:  # noqa: BLE001 - report, keep stopping the other
                    print(f"could not stop {key}: {error}", file=sys.stderr)
    state_evals = state.get("eval_runs") or []
    if rows and state_evals:
        for row in rows:
            if row.stage == "evaluate":
                row.extra["runs"] = state_evals
    return rows


def print_table(rows: list[Row], args: argparse.Namespace, load: tuple[float, float], total: float) -> None:
    print(f"\nrehearsal: {args.photos:,} photos, {args.classes} classes, {args.runs} evaluate runs, {args.size} px "
          f"({os.cpu_count()} CPUs, torch threads {args.threads}; load average {load[0]:.2f} at start, {load[1]:.2f} at end; "
          f"total {total / 60:.1f} min wall)")
    print("| stage | wall s | CPU s | CPU ms / photo | peak RSS MiB (children) | what it did |")
    print("|---|---:|---:|---:|---:|---|")
    for row in rows:
        if row.skipped and row.skipped == "--skip":
            print(f"| {row.stage} | | | | | skipped (--skip) |")
            continue
        what = f"skipped: {row.skipped}" if row.skipped else row.note
        children = f" ({row.peak_children:.0f})" if row.peak_children >= 1 else ""
        print(f"| {row.stage} | {row.wall:.1f} | {row.cpu:.1f} | {1000 * row.cpu / args.photos:.2f} | "
              f"{row.peak_self:.0f}{children} | {what.replace('|', '/')} |")
    runs = next((r.extra.get("runs") for r in rows if r.stage == "evaluate" and r.extra.get("runs")), None)
    if runs:
        print("\nper evaluate run (wall s / CPU s of this process): "
              + "; ".join(f"{label} {w:.1f} / {c:.1f}" for label, w, c in runs))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--photos", type=int, default=13_000)
    parser.add_argument("--classes", type=int, default=45)
    parser.add_argument("--runs", type=int, default=20, help="curate evaluate runs (default 20)")
    parser.add_argument("--trained", type=int, default=2, help="tiny CLIPs trained with curate.train_reference (default 2)")
    parser.add_argument("--steps", type=int, default=30, help="training steps per tiny CLIP (default 30)")
    parser.add_argument("--train-photos", type=int, default=3_000, help="photos the tiny CLIPs train on (default 3000)")
    parser.add_argument("--size", type=int, default=48, help="photo side in px (default 48)")
    parser.add_argument("--p", type=float, default=0.6, help="share of a class's photos on its common background")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    parser.add_argument("--explain-limit", type=int, default=0,
                        help="explain: at most N photos per class (default 0 = every photo)")
    parser.add_argument("--intervene-per-cell", type=int, default=50,
                        help="intervene: at most N photos per (class, group) (default 50; 0 = every photo)")
    parser.add_argument("--skip", default="", help=f"comma-separated stages to skip, of: {', '.join(STAGES)}")
    parser.add_argument("--small", action="store_true", help="900 photos, 9 classes, 4 runs, 30 steps: a few minutes")
    parser.add_argument("--keep", type=Path, help="work here and keep the folder (default: a temporary folder, removed)")
    parser.add_argument("--json", type=Path, help="also write the rows as JSON here")
    args = parser.parse_args()
    if args.small:
        args.photos, args.classes, args.runs, args.steps, args.train_photos = 900, 9, 4, 30, 900
    args.skip = [s.strip() for s in args.skip.split(",") if s.strip()]
    unknown = [s for s in args.skip if s not in STAGES]
    if unknown:
        parser.error(f"unknown stages {unknown}; known: {', '.join(STAGES)}")
    if args.classes > 398 or args.photos < args.classes * 12:
        parser.error("need at most 398 classes and at least 12 photos per class (the split's 10 per background)")
    work = args.keep or Path(tempfile.mkdtemp(prefix="curate-rehearsal-"))
    if args.keep and (args.keep / "counteranimal-standin").exists():
        shutil.rmtree(args.keep)
    work.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("FIFTYONE_DO_NOT_TRACK", "true")
    load0 = os.getloadavg()[0]
    start = time.perf_counter()
    print(f"rehearsal in {work}", file=sys.stderr, flush=True)
    try:
        rows = rehearse(args, work)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print_table(rows, args, (load0, os.getloadavg()[0]), time.perf_counter() - start)
    if args.json:
        args.json.write_text(json.dumps([row.__dict__ for row in rows], indent=1, default=str))


if __name__ == "__main__":
    main()
