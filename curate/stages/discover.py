"""The discover stage: background groups nobody listed, named, for people to judge (``curate discover``).

``discover(dataset, model, settings)`` finds, within each class, groups of photos whose
*backgrounds* look alike (:mod:`curate.discover.embed` takes the object out), scores each group's
reference accuracy on photos it was not fitted on, tests it against a permutation null with the
false-discovery rate controlled over all classes (:mod:`curate.discover.groups`), names it with
the phrase bank (:mod:`curate.discover.phrases`) and writes a :class:`curate.runs.DiscoveryRun`.
It writes nothing into the dataset's labels: a group becomes a background only when a person
accepts it (:mod:`curate.discover.decide`).

Where the correctness comes from (as for the split, papers/003 §2.1): ``model`` evaluated now
with the paper's setting (1 vs 1000 with "A photo of {}.", or the dataset's own label space) as
an ordinary evaluation run (``runs/discover-ref-*``, image embeddings from the shared cache), or
``settings.predictions``: finished evaluation runs of any models (the mean correctness over
them). The same CLIP embeds the backgrounds and names the groups.
"""
from __future__ import annotations

import logging
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from curate.discover.embed import METHODS, RemovalCache, choose_method, project_out, removal_embeddings
from curate.discover.groups import MIN_BOOT, ClassDiscovery, GroupSettings, benjamini_hochberg, discover_class
from curate.discover.phrases import MIN_NAME_SCORE, TEMPLATE, PhraseBank, name_groups
from curate.jsonio import json_safe
from curate.masks.sources import is_trusted
from curate.progress import Progress, phase
from curate.runs.base import discard_if_empty, slug, unique_run_name
from curate.runs.base import run_name as default_run_name
from curate.runs.discovery import DiscoveredGroup, DiscoveryRun
from curate.runs.evaluation import EvaluationRun
from curate.shell import suggest
from curate.stages.common import (
    check_device,
    claim_run_dir,
    identity_label,
    load_spec,
    model_identity,
    open_dataset,
    run_stage,
)

__all__ = ["DiscoverSettings", "discover"]

logger = logging.getLogger(__name__)


@dataclass
class DiscoverSettings:
    """How to discover (``curate discover`` options map one to one; the grouping ones are
    :class:`curate.discover.groups.GroupSettings`)."""

    max_groups: int = 6
    min_half: int = 10
    min_group: int = 4
    min_silhouette: float = 0.05
    min_overlap: float = 0.5
    error_weight: float = 0.0
    n_perm: int = 2000
    n_boot: int = 1000
    min_boot: int = MIN_BOOT  # a group (or its rest) of fewer photos gets no bootstrap interval
    fdr: float = 0.1
    seed: int = 0
    background_embedding: str = "auto"  # auto | removal | projection | whole (the baseline; curate.discover.embed)
    min_masked_share: float = 0.9  # auto: removal when this share of a class's photos has a trusted mask
    allow_model_masks: bool = False  # unverified mask proposals count as trusted masks
    phrases: Path | None = None  # the phrase bank (default: the one shipped, datasets/phrases.txt)
    top_names: int = 5
    min_name_score: float = MIN_NAME_SCORE  # a top phrase scoring less does not name its group (unnamed)
    exemplars: int = 8
    predictions: tuple[str, ...] = ()  # finished evaluation runs; none: the model is evaluated now
    statuses: tuple[str, ...] = ("accepted", "candidate")
    classes: tuple[str, ...] = ()  # only these class names (default all)
    device: str = "auto"
    precision: str = "fp32"
    batch_size: int = 64

    def __post_init__(self) -> None:
        if self.background_embedding not in METHODS:
            raise ValueError(f"background embedding must be one of {', '.join(METHODS)}, "
                             f"got {self.background_embedding!r}")
        if self.top_names < 1 or self.exemplars < 1:
            raise ValueError("top_names and exemplars must be >= 1")
        if not np.isfinite(self.min_name_score):
            raise ValueError(f"min_name_score must be a finite number, got {self.min_name_score!r}")
        self.group_settings  # noqa: B018 - validates the grouping settings now

    @property
    def group_settings(self) -> GroupSettings:
        return GroupSettings(max_groups=self.max_groups, min_half=self.min_half, min_group=self.min_group,
                             min_silhouette=self.min_silhouette, min_overlap=self.min_overlap,
                             error_weight=self.error_weight, n_perm=self.n_perm, n_boot=self.n_boot,
                             min_boot=self.min_boot, fdr=self.fdr, seed=self.seed)

    def to_dict(self) -> dict[str, Any]:
        return json_safe({**asdict(self), "phrases": str(self.phrases) if self.phrases else None})


def _reference_run(ds: Any, loaded: Any, settings: DiscoverSettings, label: str, progress: Progress | None
                   ) -> EvaluationRun:
    from curate.stages.evaluate import EvalSettings, evaluate

    label_space = "imagenet1k" if ds.label_space.is_builtin else "dataset"
    eval_settings = EvalSettings(label_space=label_space, prompts="simple", statuses=tuple(settings.statuses),
                                 device=settings.device, precision=settings.precision, seed=settings.seed)
    name = unique_run_name(ds.root, default_run_name("discover-ref", label))
    return evaluate(ds, loaded, eval_settings, run_name=name, progress=progress)


def _correctness(runs: list[EvaluationRun], ids: list[str]) -> dict[str, float]:
    """Mean top-1 correctness over the runs, for the photos every run scored."""
    maps = [run.correct1_by_sample() for run in runs]
    return {sid: float(np.mean([m[sid] for m in maps])) for sid in ids if all(sid in m for m in maps)}


def _class_directions(loaded: Any, names: list[str]) -> np.ndarray:
    """The zero-shot classifier rows of "A photo of {}." for ``names`` (L2-normalised)."""
    from curate.zeroshot.classifier import build_text_classifier
    from curate.zeroshot.prompts import load_prompts

    return build_text_classifier(loaded, names, load_prompts("simple")).numpy()


@run_stage("discover")
def discover(
    dataset: Any, model: Any, settings: DiscoverSettings | None = None, *, run_name: str | None = None,
    overwrite: bool = False, progress: Progress | None = None,
) -> DiscoveryRun:
    """Find, score and name background groups per class; write the :class:`DiscoveryRun` (module docstring).

    Args:
        dataset: a :class:`curate.store.Dataset` or its folder.
        model: the CLIP that embeds backgrounds and names groups (and, without
            ``settings.predictions``, the reference): a spec, a name, a weights file or a loaded model.
        settings: :class:`DiscoverSettings`.
        run_name: the run folder (default ``discover-<model>-<UTC time>``); a finished one is
            refused before any work unless ``overwrite``, an unfinished one (killed) replaced
            (:func:`curate.stages.common.run_stage`).
        progress: :class:`curate.progress.Progress`.
    Raises:
        ValueError: not a CLIP, no photo with a class, an unknown class in ``settings.classes``.
        PhraseBankError: a phrase file that is missing, empty, not UTF-8 or has duplicates.
        FileNotFoundError / RunError: a ``predictions`` name that is not a finished evaluation run.
    """
    settings = settings or DiscoverSettings()
    grouping = settings.group_settings
    check_device(settings.device)
    bank = PhraseBank.load(settings.phrases)  # a bad phrase file fails before any work
    ds = open_dataset(dataset)
    names = ds.label_space.names
    wanted = set(settings.classes)
    unknown = sorted(wanted - set(names))
    if unknown:
        raise ValueError(f"unknown class name(s) {', '.join(map(repr, unknown))}; the dataset's classes are listed by "
                         f"`{suggest('curate info {dir}', dir=ds.root)}`")
    rows = [r for r in ds.rows(status=list(settings.statuses)) if r["class_index"] is not None
            and (not wanted or names[int(r["class_index"])] in wanted)]
    if not rows:
        raise ValueError(f"{ds.root}: no photo with a class and status in {list(settings.statuses)} to discover in")
    runs = [EvaluationRun.finished(ds.root, name) for name in settings.predictions]
    loaded = load_spec(model, device=settings.device, precision=settings.precision)
    identity = model_identity(model, loaded)
    if loaded.kind != "clip":
        raise ValueError(f"discover needs a CLIP (it embeds backgrounds and names them with text); "
                         f"{loaded.model_id} is a {loaded.kind}")
    label = identity_label(identity)
    run_dir = claim_run_dir(ds.root, run_name, "discover", label, overwrite=overwrite)
    try:
        record = _run(ds, loaded, identity, rows, runs, settings, grouping, bank, label, progress)
        record.write(run_dir)
    except BaseException:
        discard_if_empty(run_dir)  # nothing was written: leave no folder
        raise
    ds.record_provenance("discover", json_safe({"run": run_dir.name, "model_id": loaded.model_id,
                                                 **{k: record.counts[k] for k in ("groups", "significant")}}))
    return record


def _run(ds: Any, loaded: Any, identity: dict[str, Any], rows: list[dict[str, Any]], runs: list[EvaluationRun],
         settings: DiscoverSettings, grouping: GroupSettings, bank: Any, label: str, progress: Progress | None) -> DiscoveryRun:
    from curate.features import compute_features

    names = ds.label_space.names
    left_out: Counter = Counter()
    passed = ["predictions"] * len(runs)
    if not runs:
        runs = [_reference_run(ds, loaded, settings, label, progress)]
        passed = ["spec" if identity.get("passed") == "spec" else "loaded"]
    correct = _correctness(runs, [r["sample_id"] for r in rows])
    left_out["no_prediction"] += sum(1 for r in rows if r["sample_id"] not in correct)
    by_class: dict[int, list[dict[str, Any]]] = {}
    for r in rows:
        if r["sample_id"] in correct:
            by_class.setdefault(int(r["class_index"]), []).append(r)
    methods = {c: choose_method(members, settings.background_embedding, min_masked_share=settings.min_masked_share,
                                allow_model_masks=settings.allow_model_masks) for c, members in by_class.items()}
    # projection: whole-image embeddings from the shared cache, the class direction projected out
    projected_ids = [r["sample_id"] for c, members in by_class.items() if methods[c] in ("projection", "whole")
                     for r in members]
    whole: dict[str, np.ndarray] = {}
    if projected_ids:
        feats = compute_features(ds, loaded, projected_ids, batch_size=settings.batch_size,
                                 progress=phase(progress, "encoding whole images"))
        whole = dict(zip(feats.sample_ids, feats.values))
        left_out["image_failed"] += len(feats.failed)
    class_list = sorted(by_class)
    directions = dict(zip(class_list, _class_directions(loaded, [names[c] for c in class_list])))
    cache = RemovalCache(ds.root, loaded) if getattr(loaded, "cache_safe", True) else None
    removal_rows = [r for c, members in by_class.items() if methods[c] == "removal" for r in members]
    encode_progress = phase(progress, "encoding backgrounds")
    done = [0]

    def tick(n: int) -> None:
        done[0] += n
        if encode_progress:
            encode_progress(done[0], len(removal_rows))

    trusted = [r for r in removal_rows if is_trusted(r, allow_model_masks=settings.allow_model_masks)]
    left_out["no_trusted_mask"] += len(removal_rows) - len(trusted)
    trusted_ids = {r["sample_id"] for r in trusted}
    removed: dict[str, np.ndarray] = {}
    if trusted:
        ids, values, failed = removal_embeddings(ds, loaded, trusted, cache, batch_size=settings.batch_size,
                                                 progress=tick)
        removed = dict(zip(ids, values))
        left_out.update(failed)
        if cache is not None:
            cache.save()
    phrase_vectors = loaded.encode_text(bank.prompts(), normalize=True).float().cpu().numpy()
    results = []
    per_class_info = []
    for c in class_list:
        method = methods[c]
        members = by_class[c]
        if method == "removal":
            usable = [r for r in members if r["sample_id"] in removed]
            x = np.stack([removed[r["sample_id"]] for r in usable]) if usable else np.zeros((0, 1))
        else:
            usable = [r for r in members if r["sample_id"] in whole]
            x = np.stack([whole[r["sample_id"]] for r in usable]) if usable else np.zeros((0, 1))
            if usable and method == "projection":
                x = project_out(x, directions[c])
        y = np.array([correct[r["sample_id"]] for r in usable], dtype=np.float64)
        found = (discover_class(x, y, grouping, key=names[c]) if usable
                 else ClassDiscovery(n=0, reason="too_few_photos"))
        untrusted = sum(1 for r in members if r["sample_id"] not in trusted_ids) if method == "removal" else 0
        if found.reason == "too_few_photos" and len(members) - untrusted < 2 * grouping.min_half <= len(members):
            found.reason = "no_trusted_mask"  # the photos are there, their trusted masks are not
        results.append((c, method, usable, x, found))
        per_class_info.append(json_safe({
            "class_index": c, "class_name": names[c], "photos": len(usable), "method": method,
            "k_halves": list(found.k_halves), "silhouettes": [round(float(s), 4) for s in found.silhouettes],
            "unstable": found.unstable, "unassigned": found.unassigned, "reason": found.reason,
            "groups": len(found.groups)}))
    q_values = benjamini_hochberg([g.p_value for _, _, _, _, found in results for g in found.groups])
    groups: list[DiscoveredGroup] = []
    member_rows: list[dict[str, Any]] = []
    position = 0
    for c, method, usable, x, found in results:
        if not found.groups:
            member_rows += [{"sample_id": r["sample_id"], "class_index": c, "group_id": None, "similarity": None}
                            for r in usable]
            continue
        xn = x / np.linalg.norm(x, axis=1, keepdims=True)
        reference = xn.mean(axis=0)
        reference /= np.linalg.norm(reference)
        centroids = np.stack([g.centroid for g in found.groups])
        named = name_groups(centroids, reference, phrase_vectors, bank.phrases, top=settings.top_names)
        ids_of_group: dict[int, str] = {}
        for g, group_names in zip(found.groups, named):
            q = float(q_values[position])
            position += 1
            g.q_value, g.significant = q, bool(q < settings.fdr)
            group_id = f"{slug(names[c], 40)}-g{g.index + 1}"
            ids_of_group[g.index] = group_id
            sims = xn[g.members] @ g.centroid
            labels = Counter(usable[i]["background"] for i in g.members if usable[i]["background"] is not None)
            known, known_n = labels.most_common(1)[0] if labels else (None, 0)
            order = np.argsort(-sims, kind="stable")
            groups.append(DiscoveredGroup(
                group_id=group_id, class_index=c, class_name=names[c], method=method, size=len(g.members),
                accuracy=g.accuracy, accuracy_low=g.accuracy_low, accuracy_high=g.accuracy_high,
                rest_accuracy=g.rest_accuracy, gap=g.gap, gap_low=g.gap_low, gap_high=g.gap_high,
                p_value=g.p_value, q_value=q, significant=g.significant, overlap=g.overlap,
                names=[(p, float(s)) for p, s in group_names],
                exemplars=[usable[g.members[i]]["sample_id"] for i in order[: settings.exemplars]],
                labelled_as=known, labelled_share=known_n / len(g.members)))
        for i, r in enumerate(usable):
            k = int(found.assignment[i]) if found.assignment is not None else -1
            sim = float(xn[i] @ found.groups[k].centroid) if k >= 0 else None
            member_rows.append({"sample_id": r["sample_id"], "class_index": c,
                                "group_id": ids_of_group.get(k), "similarity": sim})
    reasons = Counter(info["reason"] for info in per_class_info if info["reason"])
    counts = {"photos": len(rows), "grouped": sum(len(u) for _, _, u, _, _ in results),
              "classes": len(class_list), "groups": len(groups),
              "significant": sum(1 for g in groups if g.significant),
              "significant_new": sum(1 for g in groups if g.significant and g.is_new),
              "classes_without_groups": dict(sorted(reasons.items())),
              "left_out": dict(sorted((k, v) for k, v in left_out.items() if v)),
              "methods": dict(sorted(Counter(methods.values()).items()))}
    references = [{"run": run.name, "model_id": run.model_id or None, "label_space": run.label_space_name or None,
                   "chance": run.chance, "prompts": list(run.templates), "passed": how}
                  for run, how in zip(runs, passed)]
    config = {"model": identity, "settings": settings.to_dict(), "references": references,
              "phrases": {"source": bank.source, "sha256": bank.sha256, "count": len(bank.phrases),
                          "template": TEMPLATE},
              "counts": counts, "classes": per_class_info}
    logger.info("discover: %d groups in %d classes, %d significant at FDR %.2f", len(groups), len(class_list),
                counts["significant"], settings.fdr)
    return DiscoveryRun(config=json_safe(config), groups=groups, member_rows=member_rows)
