"""The intervene stage: keep the object, change the background (``curate intervene``).

``intervene(dataset, out, settings)`` writes, for every easy or hard photo of ``dataset`` with a
trusted mask, the variants of :mod:`curate.interventions.plan` into the dataset folder ``out`` and
an :class:`curate.runs.InterventionRun` into ``out/runs/<name>/`` saying which image is which
(docs/design.md#interventions). ``curate evaluate`` then scores ``out`` like any folder and
``curate attribution`` splits the observed drop into the part the background causes and the rest.

How an image is made (:mod:`curate.interventions.image_ops`):

- the object is the photo's binary mask; it keeps its pixel position and scale in every variant;
- its *hole* is the mask grown by ``hole_margin`` of the image's shorter side (the edge, halo and
  contact shadow go with it) and is filled with tiles of the photo's own background from outside
  the hole's bounding box (Xiao et al.'s Only-BG-T): that filled photo is the photo's *only-bg*;
- a donor variant pastes the object, exactly along its mask, on the donor's only-bg scaled to
  cover the photo and centre-cropped; ``filled_fraction`` records how much of the result is
  filled-in hole rather than photographed background.

What is used (:mod:`curate.masks.sources`): photos whose group is easy or hard (from ``split``, a
split run, or else the ``group`` column), whose status is in ``statuses``, and whose mask is human
or exact; unverified model proposals only with ``allow_model_masks`` (counted either way). Photos
under licences that forbid derivatives are refused unless ``allow_restricted_licenses``; a donor
whose licence cannot be combined with the photo's is not used (:func:`curate.licenses.derivative_licence`).
Photos that do not decode, masks of the wrong size, empty masks and masks covering the whole image
are skipped and counted by reason; nothing is half-written (``out`` is a dataset folder written by
:meth:`curate.store.Dataset.add_samples`, whose commits are atomic, and the record is written last).

Everything is deterministic for a seed: a re-run with the same source, seed and settings writes
the same image, mask and table bytes (into a new folder, or into the same one, where it adds
nothing and rewrites the same record, also one a kill cut short). ``out`` holding an intervention
made otherwise, or a dataset no intervention wrote, is refused. Until the record is written the
folder's provenance entry carries ``unfinished``: the command that finishes it (:func:`finish_command`),
which ``curate check`` and ``curate info`` print (:func:`curate.store.summary.unfinished`). The
record's writer holds the run's lock (:func:`curate.runs.lock.run_lock`).
"""
from __future__ import annotations

import functools
import hashlib
import itertools
import logging
import os
import shlex
from collections import Counter, deque
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from curate.interventions import image_ops as ops
from curate.interventions.background_photos import (
    BACKGROUND_ALONE_VARIANT,
    BackgroundPhotos,
    choose,
    load_background_photos,
)
from curate.interventions.background_photos import decode as decode_photo
from curate.interventions.plan import (
    GHOST_VARIANTS,
    MATCHES,
    SWAP_CONTROLS,
    Assignment,
    Source,
    adversarial_set,
    describe,
    grid_mask,
    parse_variants,
    plan_donors,
    variant_rng,
)
from curate.licenses import RESTRICTED, normalize_license
from curate.masks.sources import MaskCounts, mask_source, trusted_rows, untrusted_masks_message, usable_mask
from curate.progress import Progress, report
from curate.runs.base import CONFIG_FILE, RUNS_DIR, RunError, prepare_run_dir, read_config
from curate.runs.interventions import InterventionRun, variants_table
from curate.runs.lock import run_lock
from curate.stages.common import open_dataset
from curate.store.schema import sample_id_for
from curate.store.summary import UNFINISHED_KEY

__all__ = ["InterveneSettings", "intervene", "finish_command", "DEFAULT_RUN_NAME", "PROVENANCE_KEY"]

logger = logging.getLogger(__name__)

#: The record's folder name in ``out/runs/`` unless ``run_name`` says otherwise.
DEFAULT_RUN_NAME = "intervene"
#: ``dataset.yaml`` provenance key of the folder's intervention (its identity: source and settings).
PROVENANCE_KEY = "intervene"
#: Donor only-bg images kept decoded at once (a photo is usually a donor for several others).
DONOR_CACHE = 256
#: The ghost control's reference fill, whatever ``fill`` is: the hole's bounding box tiled leaves no
#: outline of the donor's object (an inpainted box would keep a blurred blob of it; measured in
#: docs/interventions.md#the-ghost-control).
UNGHOSTED_FILL = "box-tile"


@dataclass(frozen=True)
class InterveneSettings:
    """How to intervene (``curate intervene`` options map one to one).

    ``variants``: names from :data:`curate.interventions.plan.VARIANTS` (``original`` is always
    made). ``swaps``: donors per photo for the swap. ``adversarial_backgrounds``: size of the fixed
    background set every object is tried on (0: none). ``hole_margin``: the hole's growth as a
    share of the image's shorter side (at least one pixel). ``sigma``: the noise's standard
    deviation on the [0, 1] pixel scale. ``per_cell``: at most this many photos per (class, group),
    in a seeded order (None: all). ``match_pool``: donors are drawn among this many best matched.
    ``fill``: how a hole is filled (:data:`curate.interventions.image_ops.FILLS`). ``match``: donors
    by how much of their hole the object covers (``cover``) or by object size (``size``,
    :func:`curate.interventions.plan.plan_donors`). ``max_uncovered``: a donor whose hole the object
    leaves more than this share of is not used (None: no cap). ``background_photos``: a dataset folder of
    photos of backgrounds alone (:mod:`curate.interventions.background_photos`); with it every hard swap
    also brings ``swap-bgonly``, the hard object on a photo of its donor's background alone (the fill
    control that needs no fill; stored resolved, None: none).
    """

    variants: tuple[str, ...] = field(default_factory=lambda: parse_variants(None))
    split: str | None = None
    seed: int = 0
    swaps: int = 1
    adversarial_backgrounds: int = 8
    hole_margin: float = 0.02
    sigma: float = 0.25
    per_cell: int | None = None
    match_pool: int = 5
    fill: str = "tile"
    match: str = "cover"
    max_uncovered: float | None = None
    background_photos: str | None = None
    statuses: tuple[str, ...] = ("candidate", "accepted")
    allow_model_masks: bool = False
    allow_restricted_licenses: bool = False
    workers: int | None = None  # threads making images (None: up to 4, one per core); never changes the output

    def __post_init__(self) -> None:
        object.__setattr__(self, "variants", parse_variants(self.variants))
        if self.workers is not None and self.workers < 1:
            raise ValueError(f"--workers must be >= 1, got {self.workers}")
        if self.swaps < 1:
            raise ValueError(f"--swaps must be >= 1, got {self.swaps}")
        if self.adversarial_backgrounds < 0:
            raise ValueError(f"--adversarial-backgrounds must be >= 0, got {self.adversarial_backgrounds}")
        if not 0.0 <= self.hole_margin <= 0.25:
            raise ValueError(f"--hole-margin is a share of the image's shorter side in [0, 0.25], got {self.hole_margin}")
        if not 0.0 < self.sigma <= 2.0:
            raise ValueError(f"--sigma is on the [0, 1] pixel scale and must be in (0, 2], got {self.sigma}")
        if self.per_cell is not None and self.per_cell < 1:
            raise ValueError(f"--per-cell must be >= 1, got {self.per_cell}")
        if self.match_pool < 1:
            raise ValueError(f"--match-pool must be >= 1, got {self.match_pool}")
        if self.fill not in ops.FILLS:
            raise ValueError(f"--fill must be one of {', '.join(ops.FILLS)}, got {self.fill!r}")
        if self.match not in MATCHES:
            raise ValueError(f"--donor-match must be one of {', '.join(MATCHES)}, got {self.match!r}")
        if self.max_uncovered is not None and not 0.0 <= self.max_uncovered <= 1.0:
            raise ValueError(f"--max-uncovered is a share of the donor's hole in [0, 1], got {self.max_uncovered}")
        if self.background_photos is not None:
            if "swap" not in self.variants:
                raise ValueError("--background-photos makes swap-bgonly beside each hard swap: ask for the swap variant")
            object.__setattr__(self, "background_photos", str(Path(self.background_photos).expanduser().resolve()))

    def to_dict(self) -> dict[str, Any]:
        """The settings that decide the images (``workers`` does not, so it is not recorded; nor is
        ``background_photos`` when None, so a folder made before it existed is still this intervention)."""
        data = asdict(self)
        data["variants"], data["statuses"] = list(self.variants), list(self.statuses)
        del data["workers"]
        if data["background_photos"] is None:
            del data["background_photos"]
        return data


@dataclass
class _Photo:
    """A source photo loaded for making its variants."""

    row: dict[str, Any]
    image: np.ndarray
    mask: np.ndarray
    hole: np.ndarray
    filled: ops.Filled | None  # None: the object covers the whole image
    unghosted: ops.Filled | None = None  # the hole's bounding box filled (swap-unghosted donors only)


def _groups(ds: Any, rows: list[dict[str, Any]], split: str | None) -> dict[str, str | None]:
    """Each row's group: from the split run ``split`` (its easy / hard backgrounds), else the column."""
    if split is None:
        return {r["sample_id"]: r["group"] for r in rows}
    from curate.runs.lookup import named_run
    from curate.runs.split import SplitRun
    from curate.split.discovery import group_assignments

    run = named_run(ds.root, split, SplitRun)
    return group_assignments([r["sample_id"] for r in rows], [r["class_index"] for r in rows],
                             [r["background"] for r in rows], run.classes)


def _scope(ds: Any, settings: InterveneSettings) -> tuple[list[dict[str, Any]], Counter, Any]:
    rows = [r for r in ds.rows() if r["class_index"] is not None and r["status"] in settings.statuses]
    groups = _groups(ds, rows, settings.split)
    grouped = [{**r, "group": groups.get(r["sample_id"])} for r in rows if groups.get(r["sample_id"]) in ("easy", "hard")]
    if not grouped:
        where = f"split run {settings.split}" if settings.split else "the group column"
        raise ValueError(f"{ds.root}: no easy or hard photos ({where}); run `curate split` first or pass --split RUN")
    skipped: Counter = Counter()
    skipped["no_mask"] = sum(1 for r in grouped if r["mask_path"] is None)
    trusted, masks = trusted_rows(grouped, allow_model_masks=settings.allow_model_masks)
    if not trusted:
        if masks.skipped_model:
            raise ValueError(untrusted_masks_message(ds.root, masks, "the interventions"))
        raise ValueError(f"{ds.root}: none of the {len(grouped)} easy / hard photos has a usable mask; collect masks "
                         "(COCO, curate propose-masks + curate review) first")
    kept = []
    for row in trusted:
        code = normalize_license(row["license"])  # no licence = all rights reserved (iNaturalist's meaning)
        if code in RESTRICTED and not settings.allow_restricted_licenses:
            skipped["license_restricted"] += 1
            continue
        kept.append({**row, "license": code})
    if settings.per_cell is not None:
        kept = _cap(kept, settings.per_cell, settings.seed)
    return kept, skipped, masks


def _cap(rows: list[dict[str, Any]], per_cell: int, seed: int) -> list[dict[str, Any]]:
    """At most ``per_cell`` rows per (class, group), chosen in a seeded order of their ids."""
    def key(row: dict[str, Any]) -> str:
        return hashlib.sha256(f"{seed}:{row['sample_id']}".encode()).hexdigest()

    cells: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for row in sorted(rows, key=key):
        cells.setdefault((int(row["class_index"]), str(row["group"])), []).append(row)
    return sorted((r for members in cells.values() for r in members[:per_cell]), key=lambda r: r["sample_id"])


def _load(ds: Any, row: dict[str, Any], margin_share: float, fill: str = "tile", unghosted: bool = False) -> _Photo:
    """Decode a photo and make its hole and only-bg (raises OSError / ValueError when it cannot);
    with ``unghosted`` also its background with the hole's bounding box tiled (:data:`UNGHOSTED_FILL`)."""
    with Image.open(ds.image_path(row)) as opened:
        image = np.asarray(opened.convert("RGB"))
    mask, reason = usable_mask(ds, row)
    if mask is None:
        raise ValueError(reason)
    if mask.shape != image.shape[:2]:
        raise ValueError("mask_size")
    hole = ops.object_hole(mask, ops.hole_margin(mask.shape, margin_share) if margin_share > 0 else 0)
    filled = None if hole.all() else ops.fill_hole(image, hole, fill)
    boxed = ops.fill_hole(image, hole, UNGHOSTED_FILL) if unghosted and filled is not None else None
    return _Photo(row, image, mask, hole, filled, boxed)


def _identity(ds: Any, settings: InterveneSettings) -> dict[str, Any]:
    return {"source": str(ds.root.resolve()), "source_name": ds.name, **settings.to_dict()}


def _open_out(ds: Any, out: Path, identity: dict[str, Any], run_name: str) -> Any:
    from curate.store import Dataset, DatasetError

    if out.resolve() == ds.root.resolve():
        raise ValueError("write the variants into a new dataset folder (--out), not into the source folder")
    if not (out / "dataset.yaml").exists():
        return Dataset.create(out, name=out.name, label_space=ds.label_space, backgrounds=list(ds.backgrounds),
                              recipe="intervention")
    target = Dataset.open(out)
    if target.label_space.names != ds.label_space.names:
        raise DatasetError(f"{out} has another label space than {ds.root}; write the variants into a new folder")
    entry = dict(target.provenance.get(PROVENANCE_KEY) or {})
    if len(target) and not entry:
        raise DatasetError(f"{out} is a dataset of {len(target)} samples, not an intervention folder (no `curate "
                           "intervene` wrote it); write the variants into a new folder")
    recorded = {k: v for k, v in entry.items() if k not in ("recorded_at", "curate_version", "run", "counts",
                                                             UNFINISHED_KEY)}
    if len(target) and recorded != identity:
        changed = sorted(k for k in set(recorded) | set(identity) if recorded.get(k) != identity.get(k))
        raise DatasetError(f"{out} holds an intervention made with other settings or from another folder ({changed}); "
                           "write into a new folder (images of two interventions would be scored together)")
    config = out / RUNS_DIR / run_name / CONFIG_FILE
    if config.is_file():
        try:
            kind = read_config(config.parent).get("kind")
        except RunError as error:  # torn by a kill or a full disk: this intervention's own record is rewritten
            if entry.get("run") != run_name:
                raise DatasetError(f"{config.parent} is a damaged run that is not this intervention's record ({error}); "
                                   "choose another --run-name") from None
            kind = InterventionRun.KIND
        if kind != InterventionRun.KIND:
            raise DatasetError(f"{config.parent} is another kind of run; choose another --run-name")
    return target


def finish_command(source: Path, out: Path, settings: InterveneSettings, run_name: str = DEFAULT_RUN_NAME) -> str:
    """The ``curate intervene`` command line that makes, or finishes, this intervention: absolute
    folders and every setting that is not the default (the settings only Python sets, ``match_pool``
    and ``statuses``, are named after it when they are not the default)."""
    default = InterveneSettings()
    words = ["curate", "intervene", str(Path(source).resolve()), "--out", str(Path(out).resolve())]
    if settings.split:
        words += ["--split", settings.split]
    if settings.variants != default.variants:
        implied = SWAP_CONTROLS if "swap" in settings.variants else ()  # a swap brings its ghost and fill controls
        words += ["--variants", ",".join(v for v in settings.variants if v != "original" and v not in implied)
                  or "original"]
    for option in ("seed", "swaps", "adversarial_backgrounds", "hole_margin", "sigma", "per_cell", "fill",
                   "max_uncovered", "background_photos"):
        if getattr(settings, option) != getattr(default, option):
            words += [f"--{option.replace('_', '-')}", str(getattr(settings, option))]
    for flag in ("allow_model_masks", "allow_restricted_licenses"):
        if getattr(settings, flag):
            words.append(f"--{flag.replace('_', '-')}")
    if run_name != DEFAULT_RUN_NAME:
        words += ["--run-name", run_name]
    if settings.match != default.match:
        words += ["--donor-match", settings.match]
    python_only = [f"{k}={getattr(settings, k)!r}" for k in ("match_pool", "statuses")
                   if getattr(settings, k) != getattr(default, k)]
    return shlex.join(words) + (f" (InterveneSettings: {', '.join(python_only)})" if python_only else "")


def intervene(dataset: Any, out: str | Path, settings: InterveneSettings | None = None, *, run_name: str | None = None,
              overwrite: bool = False, progress: Progress | None = None) -> InterventionRun:
    """Write the variants of ``dataset``'s masked easy / hard photos into ``out`` (module docstring).

    Args:
        dataset: a :class:`curate.store.Dataset` or its folder (the photos and their masks).
        out: the folder of the derived dataset (created; re-running into it with the same
            settings adds nothing).
        settings: :class:`InterveneSettings`.
        run_name: the record's folder in ``out/runs/`` (default ``intervene``).
        overwrite: accepted for the common stage shape; a re-run with the same settings replaces
            the record in any case, and another intervention into the same folder is refused.
        progress: :class:`curate.progress.Progress` (phase "making variants").
    """
    del overwrite  # same identity: the record is rewritten with the same bytes; another one is refused
    settings = settings or InterveneSettings()
    ds = open_dataset(dataset)
    out = Path(out).expanduser()
    rows, skipped, masks = _scope(ds, settings)
    identity = _identity(ds, settings)
    name = run_name or DEFAULT_RUN_NAME
    sources, photos_ok = _sources(ds, rows, settings, skipped)
    if not sources:
        raise ValueError(f"{ds.root}: no photo could be used ({dict(skipped)})")
    used = Counter(mask_source(r) for r in photos_ok)  # the masks the variants are cut along
    masks = MaskCounts(used={k: used.get(k, 0) for k in ("human", "exact", "model")},
                       skipped_model=masks.skipped_model, skipped_rejected=masks.skipped_rejected,
                       allow_model_masks=settings.allow_model_masks)
    adversarial = adversarial_set(sources, settings.adversarial_backgrounds if "adversarial" in settings.variants else 0,
                                  settings.seed)
    plan, missing = plan_donors(sources, settings.variants, seed=settings.seed, swaps=settings.swaps,
                                match_pool=settings.match_pool, adversarial=adversarial, match=settings.match,
                                max_uncovered=settings.max_uncovered)
    alone = _background_photos(ds, settings, plan, photos_ok)  # checked whole before anything is written
    target = _open_out(ds, out, identity, name)
    with run_lock(target.root, name, purpose="intervene"):  # one writer of the folder's record at a time
        return _make(ds, target, settings, name, identity, sources, photos_ok, plan, missing, adversarial, skipped,
                     masks, progress, alone)


def _background_photos(ds: Any, settings: InterveneSettings, plan: list[Assignment],
                       photos_ok: list[dict[str, Any]]) -> BackgroundPhotos | None:
    """The background-alone photos of ``settings.background_photos``, checked against the easy backgrounds
    the hard swaps' donors show (None: none asked for)."""
    if settings.background_photos is None:
        return None
    backgrounds = {r["sample_id"]: r["background"] for r in photos_ok}
    needed = sorted({str(backgrounds[a.donor.sample_id]) for a in plan
                     if a.variant == "swap" and a.source.group == "hard" and backgrounds.get(a.donor.sample_id)})
    return load_background_photos(settings.background_photos, list(ds.backgrounds), needed,
                                  allow_restricted=settings.allow_restricted_licenses)


def _make(ds: Any, target: Any, settings: InterveneSettings, name: str, identity: dict[str, Any],
          sources: list[Source], photos_ok: list[dict[str, Any]], plan: list[Assignment], missing: dict[str, int],
          adversarial: list[Source], skipped: Counter, masks: MaskCounts, progress: Progress | None,
          alone: BackgroundPhotos | None = None) -> InterventionRun:
    """Write the images into ``target`` and then the record (:func:`intervene`, under the run's lock)."""
    # the folder's identity before its first image: an interrupted run (images committed, no record)
    # is then recognised, and finished, by the same call; until the record is written the folder
    # says it is unfinished and how to finish it (`curate check`, `curate info`)
    target.record_provenance(PROVENANCE_KEY, {**identity, "run": name,
                                              UNFINISHED_KEY: finish_command(ds.root, target.root, settings, name)})
    by_source: dict[str, list[Assignment]] = {}
    for assignment in plan:
        by_source.setdefault(assignment.source.sample_id, []).append(assignment)
    maker = _Maker(ds, settings, {r["sample_id"]: r for r in photos_ok}, alone)
    variant_rows: list[dict[str, Any]] = []

    def items() -> Iterator[Any]:
        # images are made in threads (PNG encoding and numpy release the GIL) and consumed in source
        # order, a bounded window ahead, so the folder and the table come out the same for any --workers
        workers = settings.workers or max(1, min(4, os.cpu_count() or 1))
        with ThreadPoolExecutor(max_workers=workers) as pool:
            window: deque[Any] = deque()
            pending = iter(sources)
            for source in itertools.islice(pending, 2 * workers):
                window.append(pool.submit(maker.variants_of, source, by_source.get(source.sample_id, [])))
            done = 0
            while window:
                made, reasons = window.popleft().result()
                source = next(pending, None)
                if source is not None:
                    window.append(pool.submit(maker.variants_of, source, by_source.get(source.sample_id, [])))
                skipped.update(reasons)
                for sample, row in made:
                    variant_rows.append(row)
                    yield sample
                done += 1
                report(progress, done, len(sources), "making variants")

    added = target.add_samples(items(), actor="intervene")
    if added.quarantined:  # the store refused an image (a bug in the maker): leave its rows out, say so
        logger.warning("%d variant image(s) were quarantined by the store: %s", len(added.quarantined),
                       added.quarantined[:3])
        bad = {text for text, _ in added.quarantined}
        variant_rows = [r for r in variant_rows if r["source_id"] not in bad]
        skipped["quarantined"] += len(added.quarantined)
    table = variants_table([{k: v for k, v in r.items() if k != "source_id"} for r in variant_rows])
    counts = {"sources": len(sources), "images": len(set(r["sample_id"] for r in variant_rows)),
              "variants": dict(sorted(Counter(r["variant"] for r in variant_rows).items())),
              "skipped_sources": dict(sorted((k, v) for k, v in skipped.items() if v)),
              "not_planned": dict(sorted(missing.items())),
              "by_group": dict(sorted(Counter(s.group for s in sources).items())),
              "classes": len({s.class_index for s in sources})}
    record = InterventionRun(config={
        "source": {"root": str(ds.root.resolve()), "name": ds.name, "split": settings.split},
        "settings": settings.to_dict(), "counts": counts, "masks": masks.as_dict(),
        "adversarial_set": [s.sample_id for s in adversarial], "truth": False,
        **({"background_photos": {"root": alone.root, "name": alone.name, "usable": alone.count(),
                                  "by_background": {k: len(v) for k, v in alone.by_background.items()},
                                  "skipped": alone.skipped}} if alone is not None else {}),
    }, variants_rows=table)
    run_dir = prepare_run_dir(target.root, name, overwrite=True)
    record.write(run_dir)
    target.record_provenance(PROVENANCE_KEY, {**identity, "run": name, "counts": counts})
    logger.info("intervene: %d photos -> %d images in %s (%s)", len(sources), counts["images"], target.root,
                counts["variants"])
    return record


def _sources(ds: Any, rows: list[dict[str, Any]], settings: InterveneSettings, skipped: Counter
             ) -> tuple[list[Source], list[dict[str, Any]]]:
    """The planner's view of each usable photo (its mask checked and measured)."""
    sources, ok = [], []
    margin_share = settings.hole_margin
    for row in rows:
        mask, reason = usable_mask(ds, row)
        if mask is None:
            skipped[str(reason).split(":")[0]] += 1
            continue
        try:  # a photo that does not even open is no source and no donor (its header only: cheap)
            with Image.open(ds.image_path(row)):
                pass
        except (OSError, ValueError, Image.DecompressionBombError):
            skipped["image_unreadable"] += 1
            continue
        margin = ops.hole_margin(mask.shape, margin_share) if margin_share > 0 else 0
        hole = ops.object_hole(mask, margin)
        sources.append(Source(row["sample_id"], int(row["class_index"]), str(row["group"]), str(row["license"]),
                              ops.area_fraction(mask), not hole.all(), grid_mask(mask), grid_mask(hole)))
        ok.append(row)
    return sources, ok


class _Maker:
    """Makes the images of one photo (its own variants and its donor variants)."""

    def __init__(self, ds: Any, settings: InterveneSettings, rows: dict[str, dict[str, Any]],
                 alone: BackgroundPhotos | None = None) -> None:
        self.ds, self.settings, self.rows, self.alone = ds, settings, rows, alone
        self.photo = functools.lru_cache(maxsize=DONOR_CACHE)(self._photo)
        self.background_alone = functools.lru_cache(maxsize=DONOR_CACHE)(decode_photo)

    def _photo(self, sample_id: str) -> _Photo | str:
        try:
            return _load(self.ds, self.rows[sample_id], self.settings.hole_margin, self.settings.fill,
                         "swap-unghosted" in self.settings.variants)
        except (OSError, ValueError, Image.DecompressionBombError) as error:
            text = str(error)
            return text if text in ("mask_size", "mask_missing", "empty_mask") else f"image_unreadable: {text}"

    def variants_of(self, source: Source, assignments: list[Assignment]) -> tuple[list[tuple[Any, dict[str, Any]]], Counter]:
        """Every image of one photo (its own variants, then its donor variants) and the reasons of
        what could not be made."""
        skipped: Counter = Counter()
        return list(self._variants(source, assignments, skipped)), skipped

    def _variants(self, source: Source, assignments: list[Assignment], skipped: Counter
                  ) -> Iterator[tuple[Any, dict[str, Any]]]:
        photo = self.photo(source.sample_id)
        if isinstance(photo, str):
            skipped[photo.split(":")[0]] += 1
            return
        variants = self.settings.variants
        original = Path(self.ds.image_path(photo.row)).read_bytes()
        yield self._sample(photo, "original", original, None, photo.row["background"], None)
        if "only-fg" in variants:
            yield self._sample(photo, "only-fg", ops.png_bytes(ops.only_foreground(photo.image, photo.mask)), None, None,
                               None)
        own = [v for v in ("no-fg", "only-bg", "paste") if v in variants]
        if own and photo.filled is None:
            skipped["object_covers_image"] += 1
        elif own:
            filled = photo.filled
            assert filled is not None
            if "no-fg" in variants:
                yield self._sample(photo, "no-fg", ops.png_bytes(ops.no_foreground(photo.image, photo.hole)), None,
                                   photo.row["background"], None, filled=(filled.fraction, "black"), with_mask=False)
            if "only-bg" in variants:
                yield self._sample(photo, "only-bg", ops.png_bytes(filled.image), None, photo.row["background"], None,
                                   filled=(filled.fraction, filled.method), with_mask=False)
            if "paste" in variants:
                pasted = ops.paste(photo.image, photo.mask, filled.image)
                ring = float((_filled_region(photo) & ~photo.mask).mean())
                yield self._sample(photo, "paste", ops.png_bytes(pasted), None, photo.row["background"], None,
                                   filled=(ring, filled.method))
        if "noise-fg" in variants or "noise-bg" in variants:
            for variant, region in (("noise-fg", photo.mask), ("noise-bg", ~photo.mask)):
                if variant in variants:
                    rng = variant_rng(self.settings.seed, source.sample_id, "noise-fg")  # one noise field for both
                    noisy = ops.gaussian_noise(photo.image, region, self.settings.sigma, rng)
                    yield self._sample(photo, variant, ops.png_bytes(noisy), None, photo.row["background"], None)
        for assignment in assignments:
            yield from self._donor_images(photo, assignment, skipped)

    def _donor_images(self, photo: _Photo, assignment: Assignment, skipped: Counter
                      ) -> Iterator[tuple[Any, dict[str, Any]]]:
        """The donor variant's image and, beside a hard photo's swap, its ghost control on the same
        donor: ``ghost`` (the donor's only-bg as it enters the swap, nothing pasted), ``ghost-neutral``
        (the object's mask in the background's mean colour) and ``swap-unghosted`` (the object on the
        donor's background with the hole's bounding box filled: no outline of the donor's object); its
        fill control ``refill`` (:func:`_refill`); and, with background-alone photos, ``swap-bgonly``
        (:meth:`_background_alone`)."""
        donor = self.photo(assignment.donor.sample_id)
        if isinstance(donor, str) or donor.filled is None:
            skipped[f"donor_unusable:{assignment.variant}"] += 1
            return
        shape = photo.mask.shape
        background = ops.fit_background(donor.filled.image, shape)
        hole = ops.fit_mask(donor.hole, shape)
        fraction = float((ops.fit_mask(_filled_region(donor), shape) & ~photo.mask).mean())
        uncovered = ops.uncovered_fraction(hole, photo.mask)
        made = [(assignment.variant, ops.paste(photo.image, photo.mask, background), fraction, donor.filled.method)]
        if assignment.variant == "swap" and photo.row["group"] == "hard":
            wanted = [v for v in GHOST_VARIANTS if v in self.settings.variants]
            if "ghost" in wanted:
                made.append(("ghost", background, float(hole.mean()), donor.filled.method))
            if "ghost-neutral" in wanted:
                made.append(("ghost-neutral", ops.neutral_object(background, photo.mask), fraction,
                             donor.filled.method))
            if "swap-unghosted" in wanted and donor.unghosted is not None:
                boxed = ops.fit_background(donor.unghosted.image, shape)
                box = ops.fit_mask(ops.box_hole(donor.hole), shape)
                made.append(("swap-unghosted", ops.paste(photo.image, photo.mask, boxed),
                             float((box & ~photo.mask).mean()), donor.unghosted.method))
            if "refill" in self.settings.variants:
                shown = ops.fit_mask(_filled_region(donor), shape)
                if (shown | photo.hole).all():  # nothing of the photo's own background is left to fill from
                    skipped["refill_no_background"] += 1
                else:
                    made.append(("refill", *_refill(photo, shown, self.settings.fill)))
            if self.alone is not None:
                yield from self._background_alone(photo, assignment, donor.row["background"], skipped)
        for variant, image, filled, method in made:
            # the ghost shows the donor's pixels only: its licence is the donor's (two photos may share it);
            # the refill shows the photo's own pixels only (the donor lends its hole's shape, no pixel)
            own = variant == "refill"
            planned = replace(assignment, license=donor.row["license"] if variant == "ghost" else
                              photo.row["license"]) if variant in ("ghost", "refill") else assignment
            sample, row = self._sample(photo, variant, ops.png_bytes(image), planned,
                                       photo.row["background"] if own else donor.row["background"],
                                       None if own else donor.row, filled=(filled, method),
                                       with_mask=variant not in ("ghost", "ghost-neutral"))
            row["uncovered"] = uncovered
            yield sample, row

    def _background_alone(self, photo: _Photo, assignment: Assignment, background: str, skipped: Counter
                          ) -> Iterator[tuple[Any, dict[str, Any]]]:
        """``swap-bgonly`` of one hard swap: the object pasted, exactly along its mask, on a photo of the
        swap donor's background alone (:func:`curate.interventions.background_photos.choose`), fitted as a
        donor's only-bg is (``fit_background``): no hole, nothing filled. Its row names the photo
        (``donor_sample_id``), its licence is both parents' (``derivative_licence``)."""
        assert self.alone is not None
        if not background:  # a donor without a background label: no photo of "its" background to take
            skipped["bgonly_donor_unlabelled"] += 1
            return
        chosen = choose(self.alone, background, photo.row["sample_id"], photo.row["license"], assignment.k,
                        self.settings.seed)
        if chosen is None:
            skipped["bgonly_licence_incompatible"] += 1
            return
        picked, licence = chosen
        fitted = ops.fit_background(self.background_alone(picked.path), photo.mask.shape)
        bg_row = {"sample_id": picked.sample_id, "license": picked.license, "attribution": picked.attribution,
                  "background_source": picked.background_source}
        sample, row = self._sample(photo, BACKGROUND_ALONE_VARIANT, ops.png_bytes(ops.paste(photo.image, photo.mask,
                                                                                             fitted)),
                                   replace(assignment, license=licence), picked.background, bg_row, filled=(0.0, None))
        sample.extra["intervention"]["background_photos"] = self.alone.name
        row.update(donor_sample_id=picked.sample_id, donor_class_index=None, donor_group=None, fill=None)
        yield sample, row

    def _sample(self, photo: _Photo, variant: str, data: bytes, assignment: Assignment | None, background: str | None,
                donor_row: dict[str, Any] | None, *, filled: tuple[float, str | None] | None = None,
                with_mask: bool = True) -> tuple[Any, dict[str, Any]]:
        from curate.store import NewSample

        row = photo.row
        k = assignment.k if assignment is not None else 0
        source_id = f"{self.ds.name}:{row['sample_id']}:{variant}:{k}"
        sample_id = sample_id_for(hashlib.sha256(data).hexdigest())
        trusted_exact = mask_source(row) in ("human", "exact")
        if variant == "original":
            mask_status = row["mask_status"]
        else:  # the object's pixels are exactly the mask; a model's mask stays a model's
            mask_status = "exact" if trusted_exact else row["mask_status"]
        licence = assignment.license if assignment is not None else row["license"]
        extra: dict[str, Any] = {"intervention": {"variant": variant, "source_sample_id": row["sample_id"],
                                                  "source_dataset": self.ds.name, "k": k, "seed": self.settings.seed}}
        attribution = row["attribution"]
        background_source = row["background_source"] if background is not None else None
        if donor_row is not None:
            extra["intervention"]["donor_sample_id"] = donor_row["sample_id"]
            extra["object_license"], extra["background_license"] = row["license"], donor_row["license"]
            attribution = f"object: {row['attribution'] or 'unknown'}; background: {donor_row['attribution'] or 'unknown'}"
            background_source = donor_row["background_source"] if background is not None else None
        sample = NewSample(
            image=data, class_index=int(row["class_index"]), source="intervention", source_id=source_id,
            license=licence, attribution=attribution, status="accepted", background=background,
            background_source=background_source if background is not None else None,
            mask=photo.mask.astype(np.uint8) if with_mask and variant != "original" else
            (self.ds.load_mask(row) if variant == "original" else None),
            mask_status=mask_status if (with_mask or variant == "original") else None,
            group=row["group"] if variant == "original" else None, extra=extra, added_at=_added_at(row),
        )
        table_row = {"sample_id": sample_id, "variant": variant, "source_sample_id": row["sample_id"],
                     "class_index": int(row["class_index"]), "group": row["group"], "k": k,
                     "background": background, "filled_fraction": filled[0] if filled else 0.0,
                     "fill": filled[1] if filled else None, "license": licence, "source_id": source_id,
                     **({key: value for key, value in describe(assignment).items() if key not in ("k", "license")}
                        if assignment is not None else {})}
        return sample, table_row


def _refill(photo: _Photo, shown: np.ndarray, fill: str) -> tuple[np.ndarray, float, str]:
    """The fill control's image of one swap: the photo itself with R = ``shown`` & ~mask filled, where
    ``shown`` is the swap donor's filled region (its hole, or the hole's box for a ``box-`` fill) at the
    swap's geometry, so R is exactly what the swap shows of the donor's fill (docs/interventions.md#the-fill-control).

    R is filled by the swap's own fill (``fill`` without its ``box-`` prefix: ``shown`` is already the
    box) computed on the photo over ``shown | hole`` (the photo's own hole goes too, so neither the
    tiles' strips nor the inpainting's border take in the object or its halo), and only R is kept:
    ``refill = paste(filled, R, photo)``. Against the photo itself, whose background in R is real,
    it measures what filling that region costs or adds. Returns (image, R's share of the image, the fill's method)."""
    region = shown & ~photo.mask
    boxed = fill.startswith("box-")
    filled = ops.fill_hole(photo.image, shown | photo.hole, fill.removeprefix("box-"))
    return ops.paste(filled.image, region, photo.image), float(region.mean()), ("box-" if boxed else "") + filled.method


def _filled_region(photo: _Photo) -> np.ndarray:
    """The pixels of the photo's only-bg that were filled: its hole, or the hole's box for a ``box-`` fill."""
    boxed = photo.filled is not None and photo.filled.method.startswith("box-")
    return ops.box_hole(photo.hole) if boxed else photo.hole


def _added_at(row: dict[str, Any]) -> Any:
    """The source photo's ``added_at`` (so a re-run writes the same table), timezone-aware."""
    import datetime as dt

    value = row.get("added_at")
    if isinstance(value, dt.datetime):
        return value if value.tzinfo is not None else value.replace(tzinfo=dt.timezone.utc)
    return None

