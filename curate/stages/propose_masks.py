"""The propose-masks stage: a segmentation model proposes object masks, people verify them.

``propose_masks(dataset, model, settings)`` runs a mask backend (:mod:`curate.masks.backends`:
CLIPSeg, SAM 3, OWLv2/Grounding DINO + SAM, or a CLIP's own CAM) on every sample in scope, with
the class name through ``settings.prompt`` as the text, and writes a :class:`curate.runs.MaskRun`
(docs/design.md#masks):

- every proposal goes to the run folder (``runs/<name>/masks/<sample_id>.png`` and a row of
  ``proposals.parquet``: found, score, reason, applied);
- a proposal becomes the sample's mask in the dataset (``mask_status = model:<model id>``,
  ``extra.mask_score``, ``extra.mask_run``) only where the sample has no human or exact mask:
  those are never overwritten (:mod:`curate.masks.sources`); an earlier model proposal is
  replaced;
- a photo where nothing is found gets no mask and a counted reason (never an empty mask); a
  proposal whose size is not the image's is refused and counted; a photo that does not decode
  is counted with its error;
- scope: every sample with a class that is not rejected; ``only_missing`` keeps the samples with
  no mask at all; samples whose proposal a reviewer rejected (``mask_status = bad``, no mask) are
  left alone unless ``retry_rejected``.

Batches run on the engine seam (:mod:`curate.engine`: one model load per worker; Ray actors
load the model from its folders, the driver loads nothing). Each finished batch is written at
once (its masks into the dataset in ONE table commit, :meth:`curate.store.Dataset.set_masks`,
and its rows to ``runs/<name>/parts/``), so an interrupted run keeps its finished masks and
the same ``run_name`` resumes it, proposing only the rest. The run's lock
(:func:`curate.runs.lock.run_lock`) is held from before the folder is looked at until the record
is written, so a second writer of a live run is refused instead of resuming into it; a damaged
``pending.json`` is reported as such (``overwrite`` restarts the run). With no sample in scope
nothing is loaded or written (a ValueError says what left the samples out): an empty run would
be the newest and hide the last real one from ``--measure``.

:func:`measure_masks` scores a run's proposals against human or exact masks (mean IoU, IoU >= 0.5
/ 0.75, boundary F, beside the centre-box and whole-image baselines) and counts the reviewers'
verdicts (:mod:`curate.masks.measure`).
"""
from __future__ import annotations

import io
import logging
import time
from collections import Counter
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from curate.engine import make_engine
from curate.jsonio import read_json, write_json
from curate.masks.sources import MASK_RUN_KEY, MASK_SCORE_KEY, REJECTED_STATUS, mask_source, model_status
from curate.progress import Progress, report
from curate.runs.base import (
    CONFIG_FILE,
    RUNS_DIR,
    RunError,
    prepare_run_dir,
    read_parquet,
    unique_run_name,
    write_bytes,
)
from curate.runs.base import run_name as default_run_name
from curate.runs.lock import run_lock
from curate.runs.masks import MaskRun, proposals_table
from curate.stages.common import check_device, open_dataset
from curate.store.atomic import atomic_write_beside, durability_barrier

__all__ = ["ProposeMasksSettings", "propose_masks", "measure_masks", "DEFAULT_PROMPTS"]

logger = logging.getLogger(__name__)

#: Default text per backend: SAM 3 (and Grounding DINO, see _prompt_template) a noun phrase;
#: CLIPSeg, CAM and OWLv2 a CLIP-style sentence (their text towers were trained on captions);
#: a salient-object model reads no text (the bare class name is recorded, not used).
DEFAULT_PROMPTS: dict[str, str] = {"clipseg": "a photo of a {}.", "cam": "a photo of a {}.", "sam3": "{}",
                                   "grounded": "a photo of a {}.", "salient": "{}"}
#: The file that marks an unfinished run as resumable: the model and settings it was started with.
PENDING_FILE = "pending.json"
#: Samples (or seconds) between two commits of proposals into the dataset: a commit rewrites
#: samples.parquet, so committing every batch would make 10,000 masks cost 600+ table writes.
APPLY_EVERY = 256
APPLY_SECONDS = 30.0


@dataclass
class ProposeMasksSettings:
    """How to propose (CLI options of ``curate propose-masks`` map one to one)."""

    prompt: str | None = None  # template with {} for the class name; None: DEFAULT_PROMPTS[backend]
    threshold: float = 0.5  # per-pixel probability (clipseg, cam) or instance / box score (sam3, grounded)
    only_missing: bool = False  # only samples with no mask at all
    retry_rejected: bool = False  # also samples whose proposal a reviewer rejected
    limit: int | None = None  # at most N samples (in file order), e.g. to try a model first
    device: str = "auto"
    precision: str = "fp32"
    batch_size: int = 16  # images per engine batch (one model forward per batch)
    workers: int | None = None  # local: decoding processes; ray: model actors
    engine: str = "local"
    ray_address: str | None = None
    gpus_per_worker: float = 0.0


def _class_text(name: str) -> str:
    """The class name as a prompt word: the first of ImageNet's comma-separated synonyms."""
    return str(name).split(",")[0].strip()


def _prompt_template(settings: ProposeMasksSettings, backend: str, spec_text: str = "") -> str:
    """``--prompt``, else the backend's default (Grounding DINO: the bare class name, its phrases
    are short and lower case; OWLv2 is CLIP-based and takes the CLIP sentence)."""
    if settings.prompt is None and backend == "grounded" and "+grounding-dino:" in spec_text:
        return "{}"
    template = settings.prompt if settings.prompt is not None else DEFAULT_PROMPTS[backend]
    if "{}" not in template:
        raise ValueError(f"--prompt {template!r} has no '{{}}' for the class name")
    return template


class _ProposeWorker:
    """``BatchJob.worker``: the driver's proposer on the local engine, else the model loaded once
    in the worker (a Ray actor) from its spec and checked against the driver's model id."""

    def __init__(self, *, proposer: Any | None, spec: str, precision: str, batch_size: int, expected_model_id: str,
                 threshold: float) -> None:
        self.proposer, self.spec, self.precision = proposer, spec, precision
        self.batch_size, self.expected_model_id, self.threshold = batch_size, expected_model_id, threshold

    def __call__(self, device: str) -> Any:
        from curate.engine.base import worker_model

        return _ProposeBatch(worker_model(self.proposer, device, self._load, self.expected_model_id, self.spec),
                             self.threshold)

    def _load(self, device: str) -> Any:
        from curate.masks.backends.base import load_mask_model

        return load_mask_model(self.spec, device=device, precision=self.precision, batch_size=self.batch_size)


class _ProposeBatch:
    """One batch: ``{"items", "proposals", "failed"}`` for the images that decoded."""

    def __init__(self, proposer: Any, threshold: float) -> None:
        self.proposer, self.threshold = proposer, threshold

    def __call__(self, payload: dict[str, Any]) -> dict[str, Any]:
        items = payload["items"]
        proposals = self.proposer.propose(payload["images"], [i["prompt"] for i in items], self.threshold) \
            if items else []
        if len(proposals) != len(items):
            raise RuntimeError(f"the mask model returned {len(proposals)} proposals for {len(items)} images")
        return {"items": items, "proposals": [(p.mask, p.score, p.reason) for p in proposals],
                "failed": payload["failed"]}


def _png(mask: np.ndarray) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(mask.astype(np.uint8), mode="L").save(buffer, "PNG", compress_level=1)
    return buffer.getvalue()


def _check_proposal(mask: Any, width: int, height: int) -> tuple[np.ndarray | None, str | None]:
    """A proposal as a 0/1 uint8 array, or None and why it is refused (wrong size, empty)."""
    if mask is None:
        return None, None
    array = np.asarray(mask)
    if array.ndim != 2 or array.shape != (height, width):
        return None, f"wrong_size: the proposal is {tuple(array.shape)[::-1]} (w x h), the image {width}x{height}"
    array = (array != 0).astype(np.uint8)
    if not array.any():
        return None, "nothing_found: the proposal is empty"
    return array, None


def _resolve_model(model: Any, settings: ProposeMasksSettings, remote: bool) -> tuple[Any, str, str, dict, str]:
    """``(proposer or None, spec text, model_id, info, backend)`` for a spec or a loaded proposer."""
    from curate.masks.backends.base import MaskModelSpec, load_mask_model, mask_model_identity, parse_mask_spec

    if hasattr(model, "propose") and hasattr(model, "model_id"):
        info = dict(getattr(model, "info", {}) or {})
        spec_text = str(info.get("spec") or getattr(model, "spec", "") or "")
        if remote and not spec_text:
            raise ValueError(f"{model.model_id} was passed loaded and names no spec: Ray workers load a mask model "
                             "from its spec; pass the spec (e.g. clipseg:PATH) instead")
        backend = str(info.get("backend") or (parse_mask_spec(spec_text).backend if spec_text else "clipseg"))
        return model, spec_text, model.model_id, info, backend
    spec = model if isinstance(model, MaskModelSpec) else parse_mask_spec(str(model))
    if remote:
        model_id, info = mask_model_identity(spec, precision=settings.precision)
        return None, spec.text, model_id, info, spec.backend
    proposer = load_mask_model(spec, device=settings.device, precision=settings.precision,
                               batch_size=settings.batch_size)
    return proposer, spec.text, proposer.model_id, dict(proposer.info), spec.backend


def _tuned_on(info: dict[str, Any]) -> list[str]:
    """The sample ids the model's folder says it was trained on (curate's fine-tuning record)."""
    folders = info.get("folders")
    if not isinstance(folders, dict) or not folders:
        return []
    from curate.masks.train import read_tuned_on

    ids: set[str] = set()
    for value in folders.values():
        try:
            ids |= read_tuned_on(Path(value))
        except (OSError, ValueError):
            continue
    return sorted(ids)


def _resumable(root: Path, run_name: str | None, overwrite: bool) -> bool:
    """Whether ``runs/<run_name>`` is an unfinished run (no ``config.json``, a ``pending.json``)
    that the same model and settings would resume (checked under the run's lock)."""
    if not run_name or overwrite:
        return False
    path = root / RUNS_DIR / run_name
    return path.is_dir() and not (path / CONFIG_FILE).is_file() and (path / PENDING_FILE).is_file()


def _claim(root: Path, name: str, overwrite: bool, pending: dict[str, Any]) -> tuple[Path, dict[str, Any] | None]:
    """The run folder and, when it resumes an interrupted run of the same model and settings, that
    run's ``pending.json`` (else None). The caller holds the run's lock (:func:`curate.runs.lock.run_lock`)."""
    path = root / RUNS_DIR / name
    if _resumable(root, name, overwrite):
        try:
            before = read_json(path / PENDING_FILE)
        except ValueError as error:
            before = error
        if not isinstance(before, dict):  # a run killed while writing it, or a hand edit
            why = before if isinstance(before, ValueError) else f"{path / PENDING_FILE} holds no JSON object"
            raise RunError(f"run {path} is unfinished and its record of what it was started with is damaged "
                           f"({why}); pass --overwrite to restart it (the masks it applied stay in the dataset)")
        if {k: before.get(k) for k in pending} == pending:
            return path, before
        raise FileExistsError(f"run {path} is an unfinished run of another model or other settings; choose "
                              "another --run-name or pass --overwrite")
    path = prepare_run_dir(root, name, overwrite=overwrite)
    if overwrite:
        # the commit marker goes first: an overwrite interrupted from here on is an
        # unfinished run, never the old record mixed with new masks
        for stale_file in (path / CONFIG_FILE, path / MaskRun.PROPOSALS, path / PENDING_FILE):
            stale_file.unlink(missing_ok=True)
        for stale in (path / MaskRun.PARTS, path / MaskRun.MASKS):
            if stale.is_dir():
                for file in stale.iterdir():
                    file.unlink()
    return path, None


def _nothing_in_scope(root: Path, skipped: dict[str, int], settings: ProposeMasksSettings) -> str:
    """Why no run is written: no sample is in scope, and what would bring some into it."""
    why = ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in skipped.items() if v) or "the folder has no samples"
    hints = []
    if skipped.get("has_mask") and settings.only_missing:
        hints.append("without --only-missing every sample is proposed for (beside a human or exact mask the "
                     "proposal stays in the run, for --measure)")
    if skipped.get("rejected_proposal") and not settings.retry_rejected:
        hints.append("--retry-rejected proposes again where reviewers rejected a proposal")
    return (f"nothing to propose in {root}: no sample is in scope ({why}); no run was written"
            + (f" ({'; '.join(hints)})" if hints else ""))


def propose_masks(
    dataset: Any, model: Any, settings: ProposeMasksSettings | None = None, *, run_name: str | None = None,
    overwrite: bool = False, progress: Progress | None = None,
) -> MaskRun:
    """Propose a mask for every sample in scope; see the module docstring.

    Args:
        dataset: a :class:`curate.store.Dataset` or its folder.
        model: a mask model spec (``clipseg:PATH``, ``sam3:PATH``, ``sam:PATH+owlv2:PATH``,
            ``sam:PATH+grounding-dino:PATH``, ``cam:<clip spec>``, ``salient:PATH.onnx``) or a loaded
            proposer.
        settings: :class:`ProposeMasksSettings`.
        run_name: the run folder's name (default ``masks-<model>-<time>``); an unfinished run of
            that name with the same model and settings is resumed.
        overwrite: replace a finished run of that name.
        progress: :class:`curate.progress.Progress` (phase "proposing masks").

    Raises:
        ValueError: no sample is in scope (nothing is written); bad settings.
        RunLockedError: another live process writes the run of that name.
    """
    settings = settings or ProposeMasksSettings()
    if not 0.0 <= settings.threshold <= 1.0:
        raise ValueError(f"--threshold must be in [0, 1], got {settings.threshold}")
    if settings.batch_size < 1:
        raise ValueError(f"--batch-size must be >= 1, got {settings.batch_size}")
    if settings.limit is not None and settings.limit < 0:
        raise ValueError(f"--limit must be >= 0, got {settings.limit}")
    check_device(settings.device)
    engine = make_engine(settings.engine, workers=settings.workers, ray_address=settings.ray_address,
                         gpus_per_worker=settings.gpus_per_worker)
    ds = open_dataset(dataset)
    with ExitStack() as held:  # the run's lock, released however the run ends
        return _propose(ds, model, settings, engine, run_name, overwrite, progress, held)


def _propose(ds: Any, model: Any, settings: ProposeMasksSettings, engine: Any, run_name: str | None,
             overwrite: bool, progress: Progress | None, held: ExitStack) -> MaskRun:
    """:func:`propose_masks` once its arguments are checked; run locks go on ``held``."""
    from curate.engine.base import BatchJob, DecodeImages

    remote = getattr(engine, "name", "local") != "local"
    if run_name:  # locked before the folder is looked at: a live run is never taken for an interrupted one
        held.enter_context(run_lock(ds.root, run_name, purpose="propose-masks"))
    fresh = None if _resumable(ds.root, run_name, overwrite) else _scope(ds.rows(), settings)
    if fresh is not None and not fresh[0]:  # nothing to do: no run (an empty one would hide the last real one)
        raise ValueError(_nothing_in_scope(ds.root, fresh[1], settings))
    proposer, spec_text, model_id, info, backend = _resolve_model(model, settings, remote)
    template = _prompt_template(settings, backend, spec_text)
    status = model_status(model_id)
    config_settings = {**asdict(settings), "prompt": template}
    pending = {"model_id": model_id, "settings": {k: v for k, v in config_settings.items()
                                                  if k not in ("workers", "engine", "ray_address", "gpus_per_worker",
                                                               "device", "batch_size")}}
    name = run_name or unique_run_name(ds.root, default_run_name("masks", model_id.split("@")[0]))
    if not run_name:
        held.enter_context(run_lock(ds.root, name, purpose="propose-masks"))
    run_dir, started_with = _claim(ds.root, name, overwrite, pending)
    resumed = started_with is not None
    if started_with is not None:  # the scope the run started with (the first attempt changed the folder since)
        scope_ids, skipped = list(started_with.get("scope") or []), dict(started_with.get("skipped") or {})
    else:
        scope_rows, skipped = fresh if fresh is not None else _scope(ds.rows(), settings)
        scope_ids = [r["sample_id"] for r in scope_rows]
        write_json(run_dir / PENDING_FILE, {**pending, "scope": scope_ids, "skipped": skipped})
    (run_dir / MaskRun.PARTS).mkdir(exist_ok=True)
    (run_dir / MaskRun.MASKS).mkdir(exist_ok=True)
    done_rows = _read_parts(run_dir) if resumed else []
    if resumed:
        _reconcile(ds, run_dir, done_rows, status)
    done_ids = {r["sample_id"] for r in done_rows}
    current = {r["sample_id"]: r for r in ds.rows(sample_id=[sid for sid in scope_ids if sid not in done_ids])}
    gone = [sid for sid in scope_ids if sid not in done_ids and sid not in current]
    if gone:
        skipped["removed_from_dataset"] = skipped.get("removed_from_dataset", 0) + len(gone)
    names = ds.label_space.names
    items = [{"sample_id": r["sample_id"], "class_index": int(r["class_index"]), "width": int(r["width"]),
              "height": int(r["height"]), "prompt": template.replace("{}", _class_text(names[int(r["class_index"])]))}
             for r in (current[sid] for sid in scope_ids if sid in current) if r["class_index"] is not None]
    worker = _ProposeWorker(proposer=None if remote else proposer, spec=spec_text, precision=settings.precision,
                            batch_size=settings.batch_size, expected_model_id=model_id,
                            threshold=settings.threshold)
    job = BatchJob(items=items, batch_size=settings.batch_size, decode=DecodeImages(ds, "image_unreadable: "), worker=worker)
    part = len(list((run_dir / MaskRun.PARTS).glob("part-*.parquet")))
    started = time.perf_counter()
    done = len(done_ids)
    total = len(done_ids) + len(items)
    phase_name = f"proposing masks (run {run_dir.name})"  # the name an interrupted run resumes with
    report(progress, done, total, phase_name)
    writer = _Writer(ds, run_dir, status, part)
    try:
        for result in engine.map_batches(ds, [i["sample_id"] for i in items], job):
            rows = writer.add(result)
            done_rows.extend(rows)
            done += len(rows)
            report(progress, done, total, phase_name)
    finally:  # an interrupted run (Ctrl-C, an error) keeps every finished proposal
        writer.flush()
    seconds = time.perf_counter() - started
    table = proposals_table(sorted(done_rows, key=lambda r: r["sample_id"]))
    reasons = Counter(str(r["reason"]).split(":")[0] for r in done_rows if not r["found"])
    counts = {"in_scope": total, "found": sum(1 for r in done_rows if r["found"]),
              "nothing_found": reasons.get("nothing_found", 0), "wrong_size": reasons.get("wrong_size", 0),
              "failed": sum(v for k, v in reasons.items() if k not in ("nothing_found", "wrong_size")),
              "applied": sum(1 for r in done_rows if r["applied"]),
              "kept_trusted": sum(1 for r in done_rows if r["found"] and not r["applied"]
                                  and r.get("reason") is None),
              "not_applied_changed": sum(1 for r in done_rows if r["found"] and not r["applied"]
                                         and str(r.get("reason") or "").startswith("changed_since")),
              "resumed": len(done_ids), **{f"skipped_{k}": v for k, v in skipped.items()}}
    record = MaskRun(config={
        "model": {"spec": spec_text, "model_id": model_id, "backend": backend, "info": info},
        "settings": config_settings,
        "dataset": {"name": ds.name, "samples": len(ds), "in_scope": total},
        "counts": counts, "reasons": dict(reasons), "seconds": round(seconds, 3),
        "tuned_on": _tuned_on(info),
    }, proposals_rows=table)
    record.write(run_dir)
    for file in (run_dir / MaskRun.PARTS).glob("part-*.parquet"):
        file.unlink()
    (run_dir / MaskRun.PARTS).rmdir()
    (run_dir / PENDING_FILE).unlink()
    ds.record_provenance("propose_masks", {"run": run_dir.name, "model_id": model_id, "prompt": template,
                                           "threshold": settings.threshold, "applied": counts["applied"]})
    return record


def _scope(rows: list[dict[str, Any]], settings: ProposeMasksSettings) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """The rows to propose for, and how many were left out and why."""
    skipped: Counter[str] = Counter()
    scope = []
    for row in rows:
        if row["class_index"] is None:
            skipped["no_class"] += 1
        elif row["status"] == "rejected":
            skipped["rejected_sample"] += 1
        elif row["mask_path"] is None and row["mask_status"] == REJECTED_STATUS and not settings.retry_rejected:
            skipped["rejected_proposal"] += 1
        elif settings.only_missing and row["mask_path"] is not None:
            skipped["has_mask"] += 1
        else:
            scope.append(row)
    if settings.limit is not None:
        skipped["over_limit"] += max(0, len(scope) - settings.limit)
        scope = scope[:settings.limit]
    return scope, dict(skipped)


class _Writer:
    """Writes finished batches: each proposal's PNG to the run folder at once; the dataset's
    masks and a ``parts/`` file every :data:`APPLY_EVERY` samples or :data:`APPLY_SECONDS`
    seconds, and at the end or on an interruption (so a table of 10,000 rows is committed ~40
    times, not once per batch). Only the PNG bytes are kept between flushes, not the arrays."""

    def __init__(self, ds: Any, run_dir: Path, status: str, part: int) -> None:
        self.ds, self.run_dir, self.status, self.part = ds, run_dir, status, part
        self.rows: list[dict[str, Any]] = []
        self.masks: dict[str, tuple[bytes, float | None, int]] = {}
        self.pngs: list[Path] = []
        self.last = time.monotonic()

    def add(self, result: dict[str, Any]) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = []
        for sid, reason in result["failed"].items():
            rows.append({"sample_id": sid, "found": False, "reason": reason, "applied": False})
        for item, (mask, score, why) in zip(result["items"], result["proposals"]):
            array, refused = _check_proposal(mask, item["width"], item["height"])
            row = {"sample_id": item["sample_id"], "class_index": item["class_index"], "prompt": item["prompt"],
                   "found": array is not None, "score": None if score is None else float(score), "applied": False}
            if array is None:
                row["reason"] = refused or f"nothing_found: {why or 'no mask'}"
            else:
                rel = f"{MaskRun.MASKS}/{item['sample_id']}.png"
                data = _png(array)
                # no fsync per file: flush() makes them durable in one barrier before the part lists them
                atomic_write_beside(self.run_dir / rel, data, fsync=False)
                self.pngs.append(self.run_dir / rel)
                row["mask_file"] = rel
                self.masks[item["sample_id"]] = (data, row["score"], item["class_index"])
            rows.append(row)
        self.rows.extend(rows)
        if len(self.rows) >= APPLY_EVERY or time.monotonic() - self.last >= APPLY_SECONDS:
            self.flush()
        return rows

    def flush(self) -> None:
        """Apply the buffered proposals where they may go (:func:`_applicable`), under the folder's
        lock so that nothing a reviewer committed meanwhile is overwritten; the part file (with the
        decision) is written before the dataset commit, and a resume checks it (:func:`_reconcile`)."""
        if not self.rows:
            return
        run = self.run_dir.name
        durability_barrier(self.ds.root, self.pngs, [self.run_dir / MaskRun.MASKS])
        with self.ds.locked("propose-masks"):
            apply: dict[str, tuple[bytes, float | None]] = {}
            if self.masks:
                current = {r["sample_id"]: r for r in self.ds.rows(sample_id=list(self.masks))}
                for row in self.rows:
                    sid = row["sample_id"]
                    if sid not in self.masks:
                        continue
                    data, score, class_index = self.masks[sid]
                    why_not = _applicable(current.get(sid), class_index)
                    if why_not is None:
                        apply[sid] = (data, score)
                        row["applied"] = True
                    elif why_not != "trusted_mask":
                        row["reason"] = why_not
            write_bytes(self.run_dir / MaskRun.PARTS / f"part-{self.part:05d}.parquet",
                        _parquet_bytes(proposals_table(self.rows)))
            if apply:
                _apply(self.ds, apply, self.status, run)
        self.part += 1
        self.rows, self.masks, self.pngs, self.last = [], {}, [], time.monotonic()


def _applicable(row: dict[str, Any] | None, class_index: int) -> str | None:
    """None when a proposal may become the sample's mask now, else why not: ``trusted_mask`` (a
    human or exact mask is there: never overwritten), ``changed_since: ...`` (the sample left the
    dataset or changed class while the model ran: the proposal was prompted with the old class)."""
    if row is None:
        return "changed_since: the sample left the dataset"
    if row["class_index"] != class_index:
        return f"changed_since: class {class_index} -> {row['class_index']}"
    return None if mask_source(row) in (None, "model", "rejected") else "trusted_mask"


def _apply(ds: Any, apply: dict[str, tuple[Any, float | None]], status: str, run: str) -> None:
    """One :meth:`~curate.store.Dataset.set_masks` commit of proposals (PNG bytes or paths)."""
    ds.set_masks({sid: data for sid, (data, _) in apply.items()}, mask_status=status,
                 extra_updates={sid: {MASK_SCORE_KEY: score, MASK_RUN_KEY: run} for sid, (_, score) in apply.items()},
                 actor=f"propose-masks:{status[len('model:'):]}", reason=f"mask proposal (run {run})")


def _reconcile(ds: Any, run_dir: Path, done_rows: list[dict[str, Any]], status: str) -> None:
    """On resume: a part file is written before its dataset commit, so a run killed in between
    lists proposals as applied that the dataset does not hold. Apply those again where they still
    may go (from the run folder's PNGs), else mark them not applied."""
    import json

    claimed = {r["sample_id"]: r for r in done_rows if r.get("applied")}
    if not claimed:
        return
    run = run_dir.name
    with ds.locked("propose-masks"):
        current = {r["sample_id"]: r for r in ds.rows(sample_id=list(claimed))}
        redo: dict[str, tuple[Any, float | None]] = {}
        for sid, row in claimed.items():
            now = current.get(sid)
            extra = json.loads(now["extra"] or "{}") if now is not None else {}
            if now is not None and now["mask_status"] == status and extra.get(MASK_RUN_KEY) == run:
                continue  # committed before the interruption
            path = run_dir / str(row.get("mask_file") or "")
            if _applicable(now, row["class_index"]) is None and row.get("mask_file") and path.is_file():
                redo[sid] = (path.read_bytes(), row.get("score"))
            else:
                row["applied"] = False
        if redo:
            _apply(ds, redo, status, run)


def _parquet_bytes(table: Any) -> bytes:
    import pyarrow.parquet as pq

    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    return buffer.getvalue()


def _read_parts(run_dir: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for file in sorted((run_dir / MaskRun.PARTS).glob("part-*.parquet")):
        rows.extend(read_parquet(file).to_pylist())
    return rows


def measure_masks(dataset: Any, run: str | Path | MaskRun | None = None) -> tuple[Any, Any]:
    """``(MaskMeasurement, ReviewVerdicts)`` of a mask run (default: the newest) against the
    dataset's human and exact masks, leaving out the samples the model was tuned on
    (:func:`curate.masks.measure.measure_run`, :func:`curate.masks.measure.review_verdicts`).
    The measurement is None when there is nothing to compare against but the run's applied
    proposals have verdicts to count; with neither, the ValueError says why."""
    from curate.masks.measure import measure_run, review_verdicts
    from curate.runs.base import RunError, list_runs

    ds = open_dataset(dataset)
    if isinstance(run, MaskRun):
        record = run
    else:
        if run is None:
            runs = list_runs(ds.root, "masks")
            if not runs:
                raise RunError(f"{ds.root} has no propose-masks run to measure; run `curate propose-masks` first")
            record = MaskRun.load(runs[-1])
        else:
            from curate.runs.lookup import named_run

            record = named_run(ds.root, run, MaskRun)
    verdicts = review_verdicts(ds, record)
    try:
        measurement = measure_run(ds, record)
    except ValueError:
        if not verdicts.applied:
            raise
        logger.warning("run %s: nothing to measure against (no proposal beside a human or exact mask the model was "
                       "not tuned on); only the reviewers' verdicts are counted", record.name)
        measurement = None
    return measurement, verdicts
