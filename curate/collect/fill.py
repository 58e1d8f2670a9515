"""Fill a thin group: fetch the iNaturalist photos most likely to land in a class's hard group
(``curate collect inat DIR --fill RUN``, docs/design.md#collection-plan).

For each class that needs photos (``curate plan``'s count for the group, or ``n``):

1. **learn where the group's background occurs from the folder itself**: the group's photos'
   provenance as the iNaturalist collector recorded it (``extra.location`` = latitude, longitude;
   ``extra.observed_on`` -> month). The group's coordinates are clustered into **places**
   (:func:`cluster_places`: k-means for k = 2..4 in degrees, the k of highest mean silhouette kept
   when it is at least 0.7, else one place), so a group in two regions is not steered to the whole
   globe between them (issue 45). Each place is queried on its own: the box of its photos (their 2nd
   to 98th percentile of latitude and longitude, widened by ``pad`` degrees) and the months in which
   its photos are over-represented among the class's photos in that box (a month's share of the
   place's group photos is at least its share of all the class's photos there): iNaturalist's
   ``swlat/swlng/nelat/nelng`` and ``month`` filters;
2. **over-fetch** ``over_fetch * n`` candidate observations of the class's taxa from those queries
   (listing only: no photo is downloaded yet; each place lists its share, in proportion to the
   group's photos in it, and places with more fill what others lack), leaving out photos already in
   the folder before this fill and counting the photos skipped for their licence (the table says);
3. **score** each candidate against the group by its provenance: the log ratio of two kernel
   densities over (latitude, longitude, month), one of the group's photos and one of the class's
   other photos (Gaussian in degrees, ``bandwidth``; circular in months);
   With a CLIP (``model``), the candidates are instead ranked by their **background embedding**:
   ``cos(b, mean_group) - cos(b, mean_other)`` with ``b`` the photo's CLIP embedding with the class's
   text direction projected out (:mod:`curate.collect.fill_score`; the photos are downloaded through
   the collector's client for this, once each: staged in the job's journal, never in the dataset,
   and the top ones are added from there);
4. **add the top n** through the collector's engine (same licences, rate limits, journal and
   resumability, offline errors) as ``candidate`` samples with ``extra.proposed_for`` =
   ``{group, score, query, split, steered, scored_by}`` (``scored_by``: ``method`` place-month,
   embedding or none, the candidate's ``rank`` among the ``of`` scored, and for embeddings the model,
   the embedding and the formula) and the tag ``proposed:<group>``, so reviewers confirm the
   background as they do for any photo (the saved view / project "proposed for hard").

``steer=False`` is the baseline: the same path without the query filters or the place scoring (the
newest observations not in the folder; with a ``model``, the newest ``over_fetch * n`` ranked by
embedding alone), so that they can be compared at equal size.
A group with no photo that carries a place or a date (folder or COCO photos) cannot be steered: the
message says so.
"""
from __future__ import annotations

import itertools
import json
import logging
import math
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from curate.collect.engine import Candidate, CollectReport, Engine, ProgressFn, Skip
from curate.collect.fill_score import FORMULA, EmbeddingScorer, background_score
from curate.collect.http import PoliteClient
from curate.collect.inat import (
    DEFAULT_API_URL,
    INAT_PHOTO_LICENSES,
    MAX_PER_PAGE,
    INatAPI,
    INatClass,
    INatSettings,
    ResolvedTaxon,
    class_stream,
    make_client,
    resolve_taxon,
)
from curate.collect.journal import Journal
from curate.licenses import license_policy
from curate.store import Dataset

log = logging.getLogger(__name__)

GROUPS = ("easy", "hard")


class FillError(ValueError):
    """A class that cannot be filled as asked (no group photos, no provenance, nothing found)."""


@dataclass(frozen=True)
class Place:
    """Where and when one photo was taken (from the collector's provenance)."""

    lat: float
    lng: float
    month: int


#: Places: at most this many clusters of the group's coordinates.
MAX_PLACES = 4
#: ... and more than one only when their mean silhouette is at least this (Kaufman & Rousseeuw's
#: "strong structure"): evenly spread coordinates stay one place.
MIN_SILHOUETTE = 0.7


@dataclass(frozen=True)
class PlaceBox:
    """One place of a group: a cluster of its photos' coordinates, with its own box and months."""

    box: tuple[float, float, float, float]  # swlat, swlng, nelat, nelng
    months: tuple[int, ...]
    photos: int  # the group's photos in the cluster

    def params(self) -> dict[str, str]:
        """The iNaturalist ``/observations`` filters of this place."""
        swlat, swlng, nelat, nelng = self.box
        out = {"swlat": f"{swlat:.3f}", "swlng": f"{swlng:.3f}", "nelat": f"{nelat:.3f}", "nelng": f"{nelng:.3f}"}
        if self.months and len(self.months) < 12:
            out["month"] = ",".join(str(m) for m in self.months)
        return out

    def describe(self) -> str:
        """``lat 47..70 lng -105..54 months 1,2,12 (9 photos)``."""
        swlat, swlng, nelat, nelng = self.box
        months = ",".join(map(str, self.months)) if self.months and len(self.months) < 12 else "all"
        return f"lat {swlat:.0f}..{nelat:.0f} lng {swlng:.0f}..{nelng:.0f} months {months} ({self.photos} photos)"


@dataclass
class Steering:
    """How the query of one class is steered, learned from the folder (module docstring)."""

    class_index: int
    group: str
    group_places: list[Place]
    other_places: list[Place]
    places: list[PlaceBox]
    bandwidth: float = 8.0

    @property
    def months(self) -> list[int]:
        """Every place's months (sorted)."""
        return sorted({m for p in self.places for m in p.months})

    @property
    def box(self) -> tuple[float, float, float, float]:
        """The box around every place."""
        boxes = np.array([p.box for p in self.places])
        return (float(boxes[:, 0].min()), float(boxes[:, 1].min()), float(boxes[:, 2].max()), float(boxes[:, 3].max()))

    def queries(self) -> list[dict[str, str]]:
        """The iNaturalist filters of each place (one query each)."""
        return [p.params() for p in self.places]

    def params(self) -> dict[str, str] | list[dict[str, str]]:
        """The filters: one place's, or the list of every place's (the fill job's identity)."""
        queries = self.queries()
        return queries[0] if len(queries) == 1 else queries

    def score(self, place: Place | None) -> float:
        """log density of the group's places minus that of the class's other places at ``place``."""
        if place is None:
            return float("-inf")
        return _log_density(place, self.group_places, self.bandwidth) - (
            _log_density(place, self.other_places, self.bandwidth) if self.other_places else 0.0)


def _log_density(x: Place, places: Sequence[Place], bandwidth: float) -> float:
    lat = np.array([p.lat for p in places])
    lng = np.array([p.lng for p in places])
    month = np.array([p.month for p in places])
    dm = np.abs(month - x.month)
    dm = np.minimum(dm, 12 - dm)
    k = np.exp(-((lat - x.lat) ** 2 + (lng - x.lng) ** 2) / (2 * bandwidth ** 2) - dm ** 2 / 2.0)
    return float(np.log(k.mean() + 1e-12))


def place_of(extra: Mapping[str, Any]) -> Place | None:
    """The :class:`Place` of a sample's ``extra`` (None when it lacks a location or a date)."""
    location = extra.get("location")
    observed = str(extra.get("observed_on") or extra.get("observed_at") or "")
    try:
        if isinstance(location, str):
            location = [float(v) for v in location.split(",")]
        lat, lng = float(location[0]), float(location[1])
        month = int(observed[5:7])
    except (TypeError, ValueError, IndexError):
        return None
    if not (1 <= month <= 12 and math.isfinite(lat) and math.isfinite(lng)):
        return None
    return Place(lat, lng, month)


def learn_steering(rows: Sequence[Mapping[str, Any]], class_index: int, group: str = "hard", *,
                   pad: float = 2.0, bandwidth: float = 8.0) -> Steering:
    """The steering of one class from the folder's rows (``class_index``, ``group``, ``extra``)."""
    mine = [r for r in rows if r.get("class_index") == class_index and r.get("status") != "rejected"
            and not (r.get("group") is None and any(str(t).startswith("proposed:") for t in r.get("tags") or ()))]
    in_group = [r for r in mine if r.get("group") == group]
    if not in_group:
        raise FillError(f"class {class_index} has no photo in its {group} group; run `curate split` first (or "
                        "pick a class the split kept)")
    def places(rs: Sequence[Mapping[str, Any]]) -> list[Place]:
        out = []
        for r in rs:
            extra = r.get("extra") or {}
            place = place_of(json.loads(extra) if isinstance(extra, str) else extra)
            if place is not None:
                out.append(place)
        return out

    group_places = places(in_group)
    if not group_places:
        raise FillError(f"class {class_index}: none of its {len(in_group)} {group} photos has a place and a date "
                        "(folder or COCO photos have none), so the query cannot be steered; collect some of its "
                        "photos from iNaturalist, or fill without steering (--no-steer)")
    other_places = places([r for r in mine if r.get("group") != group])
    coords = np.array([(p.lat, p.lng) for p in group_places])
    labels = cluster_places(coords)
    boxes = []
    for k in range(int(labels.max()) + 1):
        members = [p for p, label in zip(group_places, labels) if label == k]
        lat = np.array([p.lat for p in members])
        lng = np.array([p.lng for p in members])
        lo_lat, hi_lat = np.percentile(lat, [2, 98])
        lo_lng, hi_lng = np.percentile(lng, [2, 98])
        box = (max(-90.0, lo_lat - pad), max(-180.0, lo_lng - pad), min(90.0, hi_lat + pad), min(180.0, hi_lng + pad))
        inside = [p for p in other_places if box[0] <= p.lat <= box[2] and box[1] <= p.lng <= box[3]]
        boxes.append(PlaceBox(tuple(float(v) for v in box), tuple(_over_represented(members, inside)), len(members)))
    boxes.sort(key=lambda b: (-b.photos, b.box))
    return Steering(class_index, group, group_places, other_places, boxes, bandwidth)


def _over_represented(group: Sequence[Place], other: Sequence[Place]) -> list[int]:
    """The months whose share of ``group`` is at least their share of ``group`` + ``other`` (all the
    group's months when none is)."""
    share_g = Counter(p.month for p in group)
    share_all = Counter(p.month for p in [*group, *other])
    n_g, n_all = len(group), len(group) + len(other)
    return sorted(m for m in share_g if share_g[m] / n_g >= share_all[m] / n_all) or sorted(share_g)


def cluster_places(coords: np.ndarray, max_places: int = MAX_PLACES, min_silhouette: float = MIN_SILHOUETTE,
                   sample: int = 2000) -> np.ndarray:
    """Cluster labels (0..k-1) of (latitude, longitude) rows, in degrees: k-means for k = 2 ..
    ``max_places`` (deterministic farthest-first start, Lloyd's iterations); the k with the highest mean
    silhouette is kept when that mean is at least ``min_silhouette``, else every row is one place (k = 1).
    The silhouette is computed on at most ``sample`` rows (every n/sample-th). Longitudes do not wrap
    at +-180."""
    n = len(coords)
    best, best_score = np.zeros(n, dtype=int), -1.0
    for k in range(2, min(max_places, n - 1) + 1):
        labels = _kmeans(coords, k)
        if len(set(labels.tolist())) < k:
            continue
        score = _silhouette(coords[:: max(1, n // sample)], labels[:: max(1, n // sample)])
        if score > best_score:
            best, best_score = labels, score
    return best if best_score >= min_silhouette else np.zeros(n, dtype=int)


def _kmeans(x: np.ndarray, k: int, iterations: int = 100) -> np.ndarray:
    centre = x.mean(axis=0)
    chosen = [int(np.argmax(((x - centre) ** 2).sum(1)))]
    while len(chosen) < k:
        d = np.min(((x[:, None, :] - x[chosen][None, :, :]) ** 2).sum(-1), axis=1)
        chosen.append(int(np.argmax(d)))
    centres = x[chosen].astype(float)
    labels = np.zeros(len(x), dtype=int)
    for _ in range(iterations):
        new = np.argmin(((x[:, None, :] - centres[None, :, :]) ** 2).sum(-1), axis=1)
        if np.array_equal(new, labels) and _ > 0:
            break
        labels = new
        centres = np.array([x[labels == j].mean(axis=0) if np.any(labels == j) else centres[j] for j in range(k)])
    return labels


def _silhouette(x: np.ndarray, labels: np.ndarray) -> float:
    """Mean silhouette (b - a) / max(a, b) (Rousseeuw 1987); a point alone in its cluster scores 0."""
    d = np.sqrt(((x[:, None, :] - x[None, :, :]) ** 2).sum(-1))
    scores = np.zeros(len(x))
    for i in range(len(x)):
        same = labels == labels[i]
        if same.sum() < 2:
            continue
        a = d[i, same].sum() / (same.sum() - 1)
        b = min(d[i, labels == j].mean() for j in set(labels.tolist()) if j != labels[i] and np.any(labels == j))
        scores[i] = (b - a) / max(a, b) if max(a, b) > 0 else 0.0
    return float(scores.mean())


@dataclass
class FillClass:
    """What the fill did for one class."""

    class_index: int
    wanted: int
    query: dict[str, str] | list[dict[str, str]]  # one place's filters, or each place's
    group: str = ""  # the journal group of the class
    label: str = ""
    listed: int = 0  # candidate photos listed (over-fetch), not in the folder
    skipped_license: int = 0  # photos the listing met whose licence is not accepted
    places: list[PlaceBox] = field(default_factory=list)  # where the query was steered (empty: unsteered)
    added: int = 0
    scores: list[float] = field(default_factory=list)  # of the top n, best first
    ranked: list[tuple[str, float]] = field(default_factory=list)  # (source_id, score) of every candidate, best first


@dataclass
class FillReport:
    """The fill of one run: per class, and the collector's report."""

    group: str
    split: str | None
    steered: bool
    classes: list[FillClass]
    collect: CollectReport | None = None
    scored_by: str = "place-month"  # place-month | embedding | none


def fill_group(
    dataset_root: str | Path,
    wanted: Mapping[int, int],
    *,
    group: str = "hard",
    split: str | None = None,
    steer: bool = True,
    over_fetch: float = 3.0,
    taxa: Mapping[int, Sequence[str | int]] | None = None,
    api_url: str = DEFAULT_API_URL,
    licenses: Sequence[str] | str | None = None,
    allow_restricted_licenses: bool = False,
    photo_size: str = "medium",
    per_page: int = MAX_PER_PAGE,
    client: PoliteClient | None = None,
    concurrency: int = 4,
    progress: ProgressFn | None = None,
    model: Any = None,
) -> FillReport:
    """Add up to ``wanted[class_index]`` photos per class, proposed for ``group`` (module docstring).

    Resumable: the job's journal (``.collect/inat-<job>.jsonl``, one job per class set, group and
    steering) keeps what was added; running the same fill again adds only what is missing.
    Raises :class:`FillError` for a class that cannot be steered or whose query lists nothing,
    before anything is downloaded; :class:`~curate.collect.http.HttpError` when the API fails (what
    was added stays, a re-run resumes). ``model`` (a CLIP: a :class:`~curate.models.spec.ModelSpec`,
    a name or a loaded model) ranks the candidates by background embedding instead of by place and
    month (module docstring); a model that is not a CLIP raises :class:`FillError`.
    """
    if group not in GROUPS:
        raise FillError(f"--group must be easy or hard, got {group!r}")
    if over_fetch < 1:
        raise FillError(f"--over-fetch must be >= 1, got {over_fetch}")
    ds = Dataset.open(dataset_root)
    rows = ds.rows()
    steering = {c: learn_steering(rows, c, group) for c in wanted} if steer else {}
    scorer = _scorer(model) if model is not None else None
    if scorer is not None:
        for c in wanted:
            _group_rows(rows, c, group)  # a class without group photos fails before anything is listed
    in_folder = {str(r["source_id"]): _job_of(r) for r in rows if r.get("source") == "inat"}
    codes = license_policy(licenses, allow_restricted=allow_restricted_licenses,
                           source_codes=INAT_PHOTO_LICENSES + ("all-rights-reserved",), source="iNaturalist")
    own_client = client is None
    client = client or make_client(api_url=api_url)
    api = INatAPI(client, api_url)
    method = "embedding" if scorer is not None else "place-month" if steer else "none"
    report = FillReport(group, split, steer, [], scored_by=method)
    try:
        identity = {"fill": group, "steered": steer, "classes": sorted(int(c) for c in wanted),
                    "steering": {str(c): s.params() for c, s in steering.items()}, "api_url": api_url.rstrip("/"),
                    "licenses": sorted(codes), "photo_size": photo_size}
        if scorer is not None:
            identity["scorer"] = scorer.model_id
        with Journal(ds.root, "inat", identity) as journal:
            picked: dict[int, list[Candidate]] = {}
            for index, n in wanted.items():
                cls = INatClass(index, ds.label_space.name_of(index), tuple((taxa or {}).get(index) or ()))
                taxon = _taxon(api, journal, cls)
                query = steering[index].params() if steer else {}
                queries = steering[index].queries() if steer else [{}]
                settings = [INatSettings(per_class=n, licenses=codes, photo_size=photo_size, per_page=per_page,
                                         api_url=api_url, params=tuple(sorted(q.items()))) for q in queries]
                entry = FillClass(index, n, query, group=cls.group, label=cls.label,
                                  places=list(steering[index].places) if steer else [])
                weights = [p.photos for p in entry.places] or [1]
                listing = _listing(api, journal, cls, taxon, settings, weights, in_folder,
                                   math.ceil(n * over_fetch) if steer or scorer is not None else n)
                candidates = [c for c, _ in listing]
                query_of = {c.key: q for c, q in listing}
                entry.listed, entry.skipped_license = len(candidates), listing.skipped_license
                if journal.count(cls.group) < n and not candidates:
                    raise FillError(f"class {cls.label}: the query {query or '(unsteered)'} lists no photo that is "
                                    "not already in the folder; widen it (--group, fewer filters) or fill unsteered")
                if scorer is not None:
                    values = _embedding_scores(scorer, ds, rows, index, group, cls.name, client, candidates,
                                               journal)
                else:
                    values = [steering[index].score(place_of(c.sample["extra"])) if steer else 0.0
                              for c in candidates]
                scored = sorted(((v, k, c) for k, (v, c) in enumerate(zip(values, candidates))),
                                key=lambda t: (-t[0], t[1]))
                entry.ranked = [(str(c.sample.get("source_id")), float(v)) for v, _, c in scored]
                how: dict[str, Any] = {"method": method, "of": len(scored)}
                if scorer is not None:
                    how.update(model=scorer.model_id, embedding="projection", formula=FORMULA)
                top = []
                for rank, (score, _, cand) in enumerate(scored[:n]):
                    proposal = {"group": group, "score": round(float(score), 4) if math.isfinite(score) else None,
                                "query": query_of[cand.key], "split": split, "steered": steer,
                                "scored_by": {**how, "rank": rank}}
                    sample = {**cand.sample, "extra": {**cand.sample["extra"], "proposed_for": proposal},
                              "tags": [f"proposed:{group}"]}
                    top.append(replace(cand, sample=sample))
                    entry.scores.append(float(score))
                picked[index] = top
                report.classes.append(entry)
            with Engine(ds, journal, client=client, actor="collect.inat.fill", concurrency=concurrency,
                        progress=progress) as engine:
                for entry in report.classes:
                    stats = engine.fill(entry.group, entry.label, iter(picked[entry.class_index]), entry.wanted)
                    entry.added = stats.have
                report.collect = engine.finish()
    finally:
        if own_client:
            client.close()
    return report


def _scorer(model: Any) -> EmbeddingScorer:
    """The scorer of a CLIP given as a spec, a name or a loaded model."""
    loaded = model
    if not hasattr(model, "encode_image"):
        from curate.models import load_model
        from curate.models.spec import ModelSpec

        spec = model if isinstance(model, ModelSpec) else ModelSpec(str(model), None)
        loaded = load_model(spec.name, spec.pretrained)
    if getattr(loaded, "kind", None) != "clip":
        raise FillError(f"--model must be a CLIP (it embeds backgrounds); {loaded.model_id} is a {loaded.kind}")
    return EmbeddingScorer(loaded)


def _group_rows(rows: Sequence[Mapping[str, Any]], class_index: int, group: str) -> tuple[list, list]:
    """(the class's photos in ``group``, those in the other group), rejected ones left out."""
    mine = [r for r in rows if r.get("class_index") == class_index and r.get("status") != "rejected"]
    other = GROUPS[1 - GROUPS.index(group)]
    in_group = [r for r in mine if r.get("group") == group]
    if not in_group:
        raise FillError(f"class {class_index} has no photo in its {group} group; run `curate split` first (or "
                        "pick a class the split kept)")
    return in_group, [r for r in mine if r.get("group") == other]


def _embedding_scores(scorer: EmbeddingScorer, ds: Dataset, rows: Sequence[Mapping[str, Any]], class_index: int,
                      group: str, class_name: str, client: PoliteClient, candidates: Sequence[Candidate],
                      journal: Journal) -> list[float]:
    """:func:`~curate.collect.fill_score.background_score` of each candidate (-inf: its photo could
    not be downloaded or read); the photos are staged in ``journal`` for the engine (downloaded once)."""
    in_group, other = _group_rows(rows, class_index, group)
    direction = scorer.direction(class_name)
    values, ok = scorer.candidate_backgrounds(client, candidates, direction, journal)
    scores = background_score(values, scorer.group_backgrounds(ds, in_group, direction),
                              scorer.group_backgrounds(ds, other, direction))
    return [float(s) if good else float("-inf") for s, good in zip(scores, ok)]


def _taxon(api: INatAPI, journal: Journal, cls: INatClass) -> ResolvedTaxon:
    cached = journal.get_state(cls.group, "taxon")
    if cached:
        return ResolvedTaxon.from_dict(cached)
    resolved = resolve_taxon(api, cls)
    journal.append([journal.set_state(cls.group, "taxon", resolved.to_dict())])
    return resolved


def _job_of(row: Mapping[str, Any]) -> str | None:
    """The iNaturalist job that added a row (``extra.inat_job``), or None."""
    extra = row.get("extra") or {}
    try:
        extra = json.loads(extra) if isinstance(extra, str) else extra
    except ValueError:
        return None
    return extra.get("inat_job") if isinstance(extra, dict) else None


class Listing(list):
    """(candidate, the query that listed it) pairs, and ``skipped_license``: how many photos the
    listing met whose licence is not accepted."""

    skipped_license: int = 0


def _listing(api: INatAPI, journal: Journal, cls: INatClass, taxon: ResolvedTaxon, settings: Sequence[INatSettings],
             weights: Sequence[int], in_folder: Mapping[str, str | None], limit: int) -> Listing:
    """Up to ``limit`` candidates of the (steered) listing, none that was in the folder before this
    fill (``in_folder``: source id -> the job that added it). With several places (one
    ``settings`` each), each lists newest first up to its share of ``limit`` (``weights``: the
    group's photos in it), then the places that have more fill what the others lacked, in turn.

    Listing only: the paging checkpoints are not kept, so a re-run lists the same observations again
    and the journal skips what is already added. A photo this very job added stays in the listing
    even when the journal does not name it (a run killed between the commit and the journal, issue
    45): the engine finds it in the folder and counts it, so the re-run lists, ranks and adds what an
    uninterrupted fill does."""
    out = Listing()
    seen: set[str] = set()
    refused: set[str] = set()

    def candidates(place: INatSettings) -> Iterator[tuple[Candidate, dict[str, str]]]:
        query = dict(place.params)
        for item in class_stream(api, journal, cls, taxon, place):
            if isinstance(item, Skip) and item.reason == "license":
                refused.add(item.key)
            if not isinstance(item, Candidate):
                continue
            source_id = str(item.sample.get("source_id"))
            if source_id in in_folder and in_folder[source_id] != journal.job_id and journal.final(item.key) is None:
                continue
            if source_id not in seen:
                seen.add(source_id)
                yield item, query

    streams = [candidates(place) for place in settings]
    total = sum(weights)
    for stream, weight in zip(streams, weights):
        out.extend(itertools.islice(stream, max(1, math.ceil(limit * weight / total))))
    live = list(streams)
    while live and len(out) < limit:
        for stream in list(live):
            pair = next(stream, None) if len(out) < limit else None
            if pair is None:
                live.remove(stream)
            else:
                out.append(pair)
    del out[limit:]
    for stream in streams:
        stream.close()
    out.skipped_license = len(refused)
    return out


def fill_table(report: FillReport) -> tuple[list[str], list[list[str]]]:
    """The fill's table: (columns, one row per class) with what was wanted, listed, skipped for its
    licence and added, and the places the query was steered to."""
    columns = ["class", "wanted", "listed", "skipped (licence)", "added", "places"]
    rows = [[e.label, str(e.wanted), str(e.listed), str(e.skipped_license), str(e.added),
             "; ".join(p.describe() for p in e.places) or "(unsteered)"] for e in report.classes]
    return columns, rows


def wanted_from_split(dataset_root: str | Path, split: str, *, group: str = "hard", classes: Sequence[int] = (),
                      n: int | None = None, half_width: float = 0.05) -> dict[int, int]:
    """``{class_index: photos to add}``: ``n`` for each class asked for, else what ``curate plan`` says the
    group needs for ``half_width`` (classes that need none are left out). Raises ``ValueError`` for a
    split with no groups or a class it did not keep."""
    from curate.split.plan import plan_dataset

    plan = plan_dataset(dataset_root, split=split, half_width=half_width, classes=list(classes) or None)
    known = {c.class_index for c in plan.classes}
    missing = sorted(set(classes) - known)
    if missing:
        raise FillError(f"split run {split} kept no class {missing} with both groups; plan the classes it kept "
                        f"({sorted(known)})")
    if n is not None:
        if n < 1:
            raise FillError(f"--n must be >= 1, got {n}")
        return {c.class_index: n for c in plan.classes}
    return {c.class_index: (c.need_hard if group == "hard" else c.need_easy) for c in plan.classes
            if (c.need_hard if group == "hard" else c.need_easy) > 0}
