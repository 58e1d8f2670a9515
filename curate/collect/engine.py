"""The resumable ingestion engine every collector runs on (iNaturalist, COCO, folders, composites).

A collector turns its source into an *ordered* stream of :class:`Candidate` items per quota
group (a class), and the engine:

1. skips items whose outcome the job's :class:`~curate.collect.journal.Journal` already holds
   (nothing is fetched twice), and items whose source id is already in the dataset
   ("present" when for the same class: it counts; "duplicate_source" otherwise);
2. fetches the others on a bounded thread pool (at most ``concurrency`` at once and never more
   in flight than the group still needs), from a staged copy when a killed run left one, else
   over HTTP (staging the complete body first), from disk, or by generating it;
3. verifies each image by a full decode (:func:`curate.store.prepare_image`) and computes its
   mask in the worker;
4. walks the results *in stream order*, so the outcome never depends on thread timing: a
   content duplicate of an earlier item is recorded as such, a verified image counts towards
   the quota, and the group stops exactly at its quota;
5. commits in batches through :meth:`Dataset.add_samples`, handing it the verified
   :class:`~curate.store.PreparedImage` so that no image is decoded twice (issue 42: ``collect hub``
   went from 0.67x to 1.23x the CPU speed of a ``load_dataset`` + save loop at 10,000 rows,
   ``benchmarks/collect.py --hub``; docs/results.md#collectors) (atomic, deduplicated by
   sha256; images that fail verification go to the store's ``quarantine.jsonl``), then journals the
   outcomes, then drops the staged bodies. A :class:`Checkpoint` in the stream (a paging
   cursor) is journaled only once everything before it is committed.

Killing the process at any instant therefore loses at most uncommitted work whose bodies are
staged, and a re-run of the same job reaches the same dataset as an uninterrupted run: the
same items in the same order meet the same decisions.
"""
from __future__ import annotations

import logging
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from curate.collect.http import HttpError, PoliteClient, UnsafeURLError
from curate.collect.journal import COUNTED_OUTCOMES, Journal
from curate.store import Dataset, ImageRejected, NewSample, PreparedImage, prepare_image
from curate.store.atomic import atomic_write_bytes
from curate.store.records import iso_time

log = logging.getLogger(__name__)

#: ``progress(label, done, total)``: ``total`` is None when unknown.
ProgressFn = Callable[[str, int, "int | None"], None]


class CandidateError(Exception):
    """A candidate that cannot become a sample for a reason found while preparing it
    (e.g. a COCO annotation whose size does not match its image); recorded as a failure."""

    def __init__(self, code: str, detail: str, *, retryable: bool = False) -> None:
        super().__init__(f"{code}: {detail}")
        self.code = code
        self.detail = detail
        self.retryable = retryable


@dataclass
class Candidate:
    """One item a collector wants in the dataset.

    ``key``: unique within the job (journal key). ``group``: its quota group (a class).
    ``sample``: the :class:`NewSample` fields except ``image``/``mask`` (plain JSON values:
    they are journaled so a failed item can be retried on a later run without the source).
    Exactly one of ``url`` (fetched with the job's :class:`PoliteClient`), ``path`` (read from
    disk) or ``produce`` (called to make the bytes) gives the image. ``mask(prepared)`` returns
    the H x W mask for the stored image (or None); ``side_files(prepared, sample_id)`` returns
    extra files (dataset-relative path -> bytes) written atomically before the sample is added.
    """

    key: str
    group: str
    sample: dict[str, Any]
    url: str | None = None
    path: str | Path | None = None
    produce: Callable[[], bytes] | None = None
    mask: Callable[[PreparedImage], np.ndarray | None] | None = None
    side_files: Callable[[PreparedImage, str], dict[str, bytes]] | None = None
    #: whether (source, source_id) identifies the item globally (iNaturalist photo ids, COCO image
    #: ids do; a folder's relative paths do not, so folders rely on content dedup alone)
    dedup_by_source: bool = True

    def journal_view(self) -> dict[str, Any]:
        """What the journal keeps to retry this item later (URL-fetched items only)."""
        return {"sample": self.sample, "url": self.url}

    @classmethod
    def from_journal(cls, record: Mapping[str, Any]) -> Candidate | None:
        """Rebuild a URL candidate from a journaled failure (None when it cannot be)."""
        view = record.get("candidate") or {}
        if not view.get("url") or not isinstance(view.get("sample"), dict):
            return None
        return cls(key=str(record["key"]), group=str(record["group"]), sample=dict(view["sample"]), url=view["url"])


@dataclass
class Skip:
    """An item left out by policy (licence, ambiguous category, ...): journaled, never fetched."""

    key: str
    group: str
    reason: str
    detail: str = ""


@dataclass
class Checkpoint:
    """A journal record (e.g. a paging cursor) to write once every earlier item is committed."""

    record: dict[str, Any]


StreamItem = Candidate | Skip | Checkpoint


@dataclass
class GroupStats:
    """Per-group counts of one run (``have`` includes earlier runs of the same job)."""

    group: str
    label: str
    target: int | None = None
    have: int = 0
    outcomes: Counter = field(default_factory=Counter)
    exhausted: bool = False

    @property
    def complete(self) -> bool:
        return self.target is not None and self.have >= self.target

    def as_dict(self) -> dict[str, Any]:
        return {"group": self.group, "label": self.label, "target": self.target, "have": self.have,
                "exhausted": self.exhausted, "this_run": dict(self.outcomes)}


@dataclass
class CollectReport:
    """What a collector run did. ``groups``: per class; ``failures``: (key, reason) of this run's
    failed and quarantined items; ``added``: new sample ids; ``client``: HTTP counts."""

    dataset: Path
    kind: str
    job_id: str
    journal: Path
    groups: dict[str, GroupStats] = field(default_factory=dict)
    added: list[str] = field(default_factory=list)
    failures: list[tuple[str, str]] = field(default_factory=list)
    client: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)

    def totals(self) -> Counter:
        total: Counter = Counter()
        for stats in self.groups.values():
            total.update(stats.outcomes)
        return total

    @property
    def incomplete(self) -> list[GroupStats]:
        """Groups with a target that they did not reach."""
        return [g for g in self.groups.values() if g.target is not None and g.have < g.target]

    def __str__(self) -> str:
        totals = self.totals()
        parts = [f"{totals.get(k, 0)} {k}" for k in ("added", "present", "duplicate", "duplicate_source",
                                                      "quarantined", "failed", "skipped") if totals.get(k)]
        return f"{self.kind} job {self.job_id}: " + (", ".join(parts) if parts else "nothing to do")


@dataclass
class _Fetched:
    data: bytes | None = None
    prepared: PreparedImage | None = None
    rejected: ImageRejected | None = None
    mask: np.ndarray | None = None
    error: str | None = None
    error_detail: str = ""
    retryable: bool = False


@dataclass
class _Pending:
    """An item walked in order and waiting in the current batch."""

    candidate: Candidate
    outcome: str
    sample: NewSample | None = None
    sample_id: str | None = None
    sha256: str | None = None
    reason: str | None = None
    detail: str = ""
    side: dict[str, bytes] = field(default_factory=dict)


class Engine:
    """Runs ordered candidate streams into a dataset under a job journal (module docstring).

    Args:
        dataset: the target dataset. journal: the job's opened :class:`Journal`.
        client: for URL candidates. actor: recorded in ``changes.jsonl``.
        concurrency: fetch/verify threads. batch_size / flush_seconds: commit every that many
            new samples or seconds. progress: ``progress(label, done, total)``.
    """

    def __init__(self, dataset: Dataset, journal: Journal, *, client: PoliteClient | None = None,
                 actor: str = "curate.collect", concurrency: int = 4, batch_size: int = 64,
                 flush_seconds: float = 10.0, progress: ProgressFn | None = None) -> None:
        self.ds = dataset
        self.journal = journal
        self.client = client
        self.actor = actor
        self.concurrency = max(1, int(concurrency))
        self.batch_size = max(1, int(batch_size))
        self.flush_seconds = flush_seconds
        self.progress = progress
        self.report = CollectReport(dataset=dataset.root, kind=journal.kind, job_id=journal.job_id,
                                    journal=journal.path)
        self._executor = ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix=f"collect-{journal.kind}")
        self._seen: set[str] = set()
        self._batch: list[_Pending] = []
        self._records: list[dict[str, Any]] = []
        self._last_flush = time.monotonic()
        self._started = time.monotonic()
        table = dataset.table()
        self._by_sha: dict[str, tuple[str, str, str | None, int | None]] = {}
        self._by_source: dict[tuple[str, str], tuple[str, int | None]] = {}
        for sid, sha, source, source_id, cls in zip(
                table.column("sample_id").to_pylist(), table.column("sha256").to_pylist(),
                table.column("source").to_pylist(), table.column("source_id").to_pylist(),
                table.column("class_index").to_pylist()):
            self._by_sha[sha] = (sid, source, source_id, cls)
            if source_id is not None:
                self._by_source[(source, source_id)] = (sid, cls)
        self._batch_sha: dict[str, str] = {}
        self._pulled_sources: set[tuple[str, str]] = set()
        self._counted: set[str] = set()  # sample ids counted by this run
        self._drop: list[str] = []  # staged bodies to delete once their records are journaled

    # ------------------------------------------------------------------ public
    def close(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def group(self, group: str, label: str, target: int | None) -> GroupStats:
        """The stats entry of ``group`` (created with the journal's count)."""
        stats = self.report.groups.get(group)
        if stats is None:
            stats = GroupStats(group=group, label=label, target=target, have=self.journal.count(group))
            self.report.groups[group] = stats
        stats.target = target
        return stats

    def fill(self, group: str, label: str, stream: Iterable[StreamItem], target: int | None = None) -> GroupStats:
        """Walk ``stream`` for ``group`` until it ends or ``target`` items are in (see module docstring)."""
        stats = self.group(group, label, target)
        self._tick(stats)
        if stats.complete:
            return stats
        window: deque[tuple[StreamItem, Future | None, bool]] = deque()
        inflight = 0  # fetches submitted and not yet walked
        promised = 0  # cheap items in the window that will count ("present")
        iterator = iter(stream)
        done = False
        try:
            while True:
                # pull while there is room: never more in flight than the group still needs
                while not done and inflight < self.concurrency * 2 and \
                        (target is None or stats.have + inflight + promised < target):
                    try:
                        item = next(iterator)
                    except StopIteration:
                        done = True
                        break
                    future, counts = None, False
                    if isinstance(item, Candidate):
                        if item.key in self._seen:
                            continue
                        self._seen.add(item.key)
                        if self.journal.final(item.key) is None:
                            hit = self._source_hit(item)
                            source_key = self._source_key(item)
                            if hit is not None:
                                counts = self._same_class(item, hit[1]) and hit[0] not in self._counted \
                                    and hit[0] not in self.journal.counted_samples
                            elif source_key is None or source_key not in self._pulled_sources:
                                if source_key is not None:
                                    self._pulled_sources.add(source_key)
                                future = self._executor.submit(self._fetch, item)
                                inflight += 1
                    window.append((item, future, counts))
                    promised += counts
                    if future is None and len(window) == 1:
                        break  # walk a cheap head at once, so that its count gates the pulling
                if not window:
                    break
                item, future, counts = window.popleft()
                inflight -= future is not None
                promised -= counts
                self._walk(item, future, stats)
                if target is not None and stats.have >= target:
                    self._flush(stats)  # the store may still refuse one: then keep going
                    if stats.have >= target:
                        break
                if self._batch and (len(self._batch) >= self.batch_size
                                    or time.monotonic() - self._last_flush > self.flush_seconds):
                    self._flush(stats)
            self._flush(stats)
        except BaseException:
            # an API that keeps failing, Ctrl-C, ...: commit what was verified before leaving
            try:
                self._flush(stats)
            except Exception as exc:  # noqa: BLE001 - the first error is the one to report
                log.warning("could not commit the last batch (%s); its bodies stay staged for the next run", exc)
            raise
        finally:
            for _, future, _ in window:
                if future is not None:
                    future.cancel()
            close = getattr(iterator, "close", None)
            if close is not None:
                close()
        if target is not None and stats.have >= target:
            log.info("%s: %s complete (%d/%d)", self.journal.kind, label, stats.have, target)
        return stats

    def finish(self) -> CollectReport:
        """Flush, clear staging, and return the report."""
        self._flush(None)
        self.journal.clear_staging()
        self.report.seconds = time.monotonic() - self._started
        if self.client is not None:
            self.report.client = self.client.stats.as_dict()
        return self.report

    # ------------------------------------------------------------------ walking in order
    @staticmethod
    def _source_key(cand: Candidate) -> tuple[str, str] | None:
        source, source_id = cand.sample.get("source"), cand.sample.get("source_id")
        if source is None or source_id is None or not cand.dedup_by_source:
            return None
        return (str(source), str(source_id))

    def _source_hit(self, cand: Candidate) -> tuple[str, int | None] | None:
        """(sample_id, class_index) of the dataset row (or batch item) with this source id."""
        key = self._source_key(cand)
        return None if key is None else self._by_source.get(key)

    @staticmethod
    def _same_class(cand: Candidate, class_index: int | None) -> bool:
        wanted = cand.sample.get("class_index")
        return wanted is None or wanted == class_index

    def _same_item(self, cand: Candidate, existing: tuple[str, str, str | None, int | None]) -> bool:
        """Whether the dataset row ``existing`` (sample_id, source, source_id, class_index) with the
        candidate's content is this very item, not yet counted by the job: same source and source id
        (or none), same class."""
        sid, source, source_id, cls = existing
        return (str(cand.sample.get("source")) == str(source) and cand.sample.get("source_id") == source_id
                and self._same_class(cand, cls) and sid not in self._counted
                and sid not in self.journal.counted_samples)

    def _walk(self, item: StreamItem, future: Future | None, stats: GroupStats) -> None:
        if isinstance(item, Checkpoint):
            self._flush(stats)
            self.journal.append([item.record])
            if item.record.get("name") == "exhausted" and str(item.record.get("group")) == stats.group:
                stats.exhausted = True
            return
        if isinstance(item, Skip):
            if self.journal.final(item.key) is None:
                self._records.append(self._record(item.key, item.group, "skipped", reason=item.reason,
                                                  detail=item.detail))
            stats.outcomes["skipped"] += 1
            return
        cand = item
        known = self.journal.final(cand.key)
        if known is not None:
            return  # decided by an earlier run (already counted in stats.have)
        hit = self._source_hit(cand)
        if hit is not None:
            sid, cls = hit
            if sid in self.journal.counted_samples or sid in self._counted:
                outcome, reason = "duplicate_source", f"the same source item was taken earlier as sample {sid}"
            elif not self._same_class(cand, cls):
                outcome, reason = "duplicate_source", f"already in the dataset as class {cls}"
            else:  # in the dataset already (an earlier job, or a run killed before journaling it)
                outcome, reason = "present", None
                self._counted.add(sid)
            self._records.append(self._record(cand.key, cand.group, outcome, sample_id=sid, reason=reason))
            self._count(stats, outcome)
            return
        if future is None:  # the same source item came earlier in this run and was not added
            self._records.append(self._record(cand.key, cand.group, "duplicate_source",
                                              reason="the same source item appeared earlier and was not added"))
            self._count(stats, "duplicate_source")
            return
        fetched: _Fetched = future.result()
        if fetched.error is not None:
            record = self._record(cand.key, cand.group, "failed", reason=fetched.error, detail=fetched.error_detail,
                                  retryable=fetched.retryable)
            if fetched.retryable and cand.url:
                record["candidate"] = cand.journal_view()
            self._records.append(record)
            self.report.failures.append((cand.key, f"{fetched.error}: {fetched.error_detail}"))
            if not fetched.retryable:
                self._drop.append(cand.key)
            self._count(stats, "failed")
            log.warning("%s: %s failed: %s: %s", self.journal.kind, cand.key, fetched.error, fetched.error_detail)
            return
        if fetched.prepared is None:  # failed verification: the store quarantines it with its bytes
            sample = NewSample(image=fetched.data or b"", **cand.sample)
            rejected = fetched.rejected
            self._batch.append(_Pending(cand, "quarantined", sample, reason=rejected.code if rejected else "corrupt",
                                        detail=rejected.detail if rejected else ""))
            return
        sha = fetched.prepared.sha256
        sid = sha[:16]
        existing = self._by_sha.get(sha)
        if existing is not None and self._same_item(cand, existing):
            # committed by a run killed before its journal heard of it (a folder's item, found by content)
            self._counted.add(existing[0])
            self._records.append(self._record(cand.key, cand.group, "present", sample_id=existing[0]))
            self._count(stats, "present")
            self._drop.append(cand.key)
            return
        if existing is not None or sha in self._batch_sha:
            other = existing[0] if existing is not None else self._batch_sha[sha]
            self._records.append(self._record(cand.key, cand.group, "duplicate", sample_id=other,
                                              reason="same image content as sample " + other))
            self._count(stats, "duplicate")
            self._drop.append(cand.key)  # after its record is journaled (else a kill re-downloads it)
            return
        side: dict[str, bytes] = {}
        if cand.side_files is not None:
            side = cand.side_files(fetched.prepared, sid)  # may complete cand.sample (e.g. extra)
        # the verified image itself: the store keeps its bytes without decoding them a second time
        sample = NewSample(image=fetched.prepared, mask=fetched.mask, **cand.sample)
        self._batch.append(_Pending(cand, "added", sample, sample_id=sid, sha256=sha, side=side))
        self._batch_sha[sha] = sid
        self._counted.add(sid)
        source_key = self._source_key(cand)
        if source_key is not None:
            self._by_source[source_key] = (sid, cand.sample.get("class_index"))
        stats.have += 1  # provisional: corrected in _flush if the store refuses it
        stats.outcomes["added"] += 1
        self._tick(stats)

    def _count(self, stats: GroupStats, outcome: str) -> None:
        stats.outcomes[outcome] += 1
        if outcome in COUNTED_OUTCOMES:
            stats.have += 1
        self._tick(stats)

    def _tick(self, stats: GroupStats) -> None:
        if self.progress is not None:
            self.progress(stats.label, stats.have, stats.target)

    def _record(self, key: str, group: str, outcome: str, *, sample_id: str | None = None, reason: str | None = None,
                detail: str = "", retryable: bool = False) -> dict[str, Any]:
        record: dict[str, Any] = {"t": "item", "key": key, "group": group, "outcome": outcome, "time": iso_time()}
        if sample_id is not None:
            record["sample_id"] = sample_id
        if reason is not None:
            record["reason"] = reason
        if detail:
            record["detail"] = detail[:500]
        if outcome == "failed":
            record["retryable"] = bool(retryable)
        return record

    # ------------------------------------------------------------------ committing
    def _flush(self, stats: GroupStats | None) -> None:
        if not self._batch and not self._records:
            return
        batch, self._batch = self._batch, []
        records, self._records = self._records, []
        if batch:
            for pending in batch:
                for rel, data in pending.side.items():
                    atomic_write_bytes(self.ds.root, self.ds.root / rel, data)
            samples = [p.sample for p in batch]
            report = self.ds.add_samples(samples, actor=self.actor)
            refused = {desc: reason for desc, reason in report.quarantined}
            for position, pending in enumerate(batch):
                cand = pending.candidate
                desc = samples[position].describe(position)
                group_stats = self.report.groups.get(cand.group)
                if pending.outcome == "added" and desc in refused:
                    # refused by the store for a reason verification did not see (class, field, mask)
                    code, _, detail = refused[desc].partition(": ")
                    pending.outcome, pending.reason, pending.detail = "quarantined", code, detail
                    if group_stats is not None:
                        group_stats.have -= 1
                        group_stats.outcomes["added"] -= 1
                    self._batch_sha.pop(pending.sha256 or "", None)
                    self._counted.discard(pending.sample_id or "")
                    source_key = self._source_key(cand)
                    if source_key is not None:
                        self._by_source.pop(source_key, None)
                if pending.outcome == "quarantined":
                    if group_stats is not None:
                        group_stats.outcomes["quarantined"] += 1
                    self.report.failures.append((cand.key, f"{pending.reason}: {pending.detail}"))
                    records.append(self._record(cand.key, cand.group, "quarantined", reason=pending.reason,
                                                detail=pending.detail))
                    continue
                sid, sha = pending.sample_id, pending.sha256
                assert sid is not None and sha is not None
                self._by_sha[sha] = (sid, str(cand.sample.get("source")), cand.sample.get("source_id"),
                                     cand.sample.get("class_index"))
                records.append(self._record(cand.key, cand.group, "added", sample_id=sid))
            self.report.added.extend(report.added)
            self._batch_sha.clear()
        self.journal.append(records)
        self.journal.drop_staged([p.candidate.key for p in batch] + self._drop)
        self._drop = []
        self._last_flush = time.monotonic()
        if stats is not None:
            self._tick(stats)

    # ------------------------------------------------------------------ fetching (worker threads)
    def _fetch(self, cand: Candidate) -> _Fetched:
        try:
            data = self._bytes_of(cand)
        except HttpError as exc:
            return _Fetched(error=exc.code, error_detail=str(exc), retryable=exc.retryable)
        except UnsafeURLError as exc:
            return _Fetched(error="unsafe_url", error_detail=str(exc))
        except CandidateError as exc:
            return _Fetched(error=exc.code, error_detail=exc.detail, retryable=exc.retryable)
        except OSError as exc:
            return _Fetched(error="unreadable", error_detail=f"{cand.path}: {exc.strerror or exc}")
        try:
            prepared = prepare_image(data)
        except ImageRejected as exc:
            return _Fetched(data=data, rejected=exc)
        mask = None
        if cand.mask is not None:
            try:
                mask = cand.mask(prepared)
            except CandidateError as exc:
                return _Fetched(error=exc.code, error_detail=exc.detail, retryable=exc.retryable)
        return _Fetched(data=data, prepared=prepared, mask=mask)

    def _bytes_of(self, cand: Candidate) -> bytes:
        if cand.url is not None:
            staged = self.journal.read_staged(cand.key)
            if staged is not None:
                return staged
            if self.client is None:
                raise CandidateError("no_client", "this job has no HTTP client for URL items")
            data = self.client.download(cand.url)
            self.journal.stage(cand.key, data)
            return data
        if cand.path is not None:
            return Path(cand.path).read_bytes()
        if cand.produce is not None:
            return cand.produce()
        raise CandidateError("no_source", "the candidate has no url, path or producer")
