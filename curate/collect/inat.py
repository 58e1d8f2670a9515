"""Collect iNaturalist photos for ImageNet-1K classes (papers/003 §2.1), resumably and politely.

Why it is long (one job): one source's collector: taxon resolution, the API's paging, licences and
the resumable, polite stream into the folder each have their own rules (the numbered list below).

For each class (an ImageNet-1K index) the collector:

1. resolves an iNaturalist taxon: the recipe's ``inat_taxon`` override (names or taxon ids;
   a list collects from several taxa, e.g. Old and New World vultures), else the class's
   WordNet lemmas, scientific names first ("ostrich, Struthio camelus" -> *Struthio camelus*).
   A name resolves only to an active taxon whose scientific name, matched term or common name
   equals it (case-insensitively); nothing fuzzy. The taxon ids are journaled and recorded;
2. pages through ``GET /v1/observations`` newest first (``order_by=id&order=desc``) by id
   (``id_below``, never page numbers: iNaturalist refuses results past 10,000), anchored at the
   newest id seen by the first request so a resumed job sees the same listing;
3. takes, per observation, the first ``photos_per_observation`` photos whose licence is
   accepted (default CC0, CC-BY, CC-BY-NC; ND and all-rights-reserved only when the user
   insists), at ``photo_size`` (default medium), until ``per_class`` are in the dataset;
4. downloads, verifies and stores them through :mod:`curate.collect.engine` (rate limits,
   retries, staging, journal, dedup by photo id and by content).

Each sample keeps: ``source="inat"``, ``source_id`` = photo id, ``source_url`` = the photo URL,
``license`` (normalised code), ``attribution`` (iNaturalist's string), and in ``extra``:
observation id and URL, photo id, observer (login, id, name), observed date, place, public
location, quality grade, the observation's taxon (id, name, rank, common name), the queried
taxon ids, photo size and original dimensions.

pyinaturalist parses the responses (:class:`pyinaturalist.models.Observation`); requests go
through curate's own :class:`~curate.collect.http.PoliteClient` because pyinaturalist has no
base-URL setting (ENVIRONMENT.md), so ``api_url`` can point at a loopback stand-in.
"""
from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import yaml

from curate.collect.engine import (
    Candidate,
    Checkpoint,
    CollectReport,
    Engine,
    ProgressFn,
    Skip,
    StreamItem,
)
from curate.collect.http import (
    DEFAULT_API_LIMITS,
    DEFAULT_BYTE_LIMITS,
    DEFAULT_DOWNLOAD_LIMITS,
    HttpError,
    PoliteClient,
    check_url,
    host_of,
)
from curate.collect.journal import Journal
from curate.labels import LabelSpace, imagenet1k
from curate.licenses import license_policy, normalize_license
from curate.paths import data_dir
from curate.store import Dataset, DatasetError

log = logging.getLogger(__name__)

DEFAULT_API_URL = "https://api.inaturalist.org/v1"
#: Where iNaturalist serves photos (open-data bucket for CC photos, static host for the rest).
INAT_PHOTO_HOSTS: tuple[str, ...] = ("inaturalist-open-data.s3.amazonaws.com", "static.inaturalist.org")
PHOTO_SIZES: tuple[str, ...] = ("square", "small", "medium", "large", "original")
QUALITY_GRADES: tuple[str, ...] = ("research", "needs_id", "casual", "any")
#: The values of the v1 API's ``photo_license`` filter (its OpenAPI enum), the only licences an
#: iNaturalist photo has besides none (all rights reserved, which the collector asks for by sending
#: no filter). curate's ``pd`` and ``us-gov`` have no iNaturalist equivalent, so they are refused.
INAT_PHOTO_LICENSES: tuple[str, ...] = ("cc-by", "cc-by-nc", "cc-by-nd", "cc-by-sa", "cc-by-nc-nd", "cc-by-nc-sa", "cc0")
MAX_PER_PAGE = 200
_SCIENTIFIC = re.compile(r"^[A-Z][a-z]+( [A-Za-z][a-z\-]+){1,2}$")
_SIZE_IN_PATH = re.compile(r"(?P<size>square|thumb|small|medium|large|original)(?P<ext>\.[A-Za-z]{3,4})?$")


class TaxonNotFoundError(LookupError):
    """A class with no iNaturalist taxon; the message lists what was tried and how to fix it."""


@dataclass(frozen=True)
class INatClass:
    """A class to collect: ImageNet-1K ``index``, its ``name``, and an optional taxon override
    (scientific/common names or taxon ids, from the recipe's ``inat_taxon`` or ``--taxon``)."""

    index: int
    name: str
    taxon: tuple[str | int, ...] = ()

    @property
    def group(self) -> str:
        """The journal group: the index, plus a hash of the override (a new override = new listing)."""
        if not self.taxon:
            return str(self.index)
        digest = hashlib.sha256(repr(tuple(str(t) for t in self.taxon)).encode()).hexdigest()[:6]
        return f"{self.index}~{digest}"

    @property
    def label(self) -> str:
        return f"{self.index} {self.name}"


@dataclass
class ResolvedTaxon:
    """The iNaturalist taxa a class collects from (ids are what the API is queried with)."""

    ids: list[int]
    names: list[str]
    ranks: list[str]
    common_names: list[str | None]
    queries: list[str]
    via: str  # "override" or "lemma"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ResolvedTaxon:
        return cls(ids=[int(i) for i in data["ids"]], names=list(data["names"]), ranks=list(data["ranks"]),
                   common_names=list(data.get("common_names") or [None] * len(data["ids"])),
                   queries=list(data.get("queries") or []), via=str(data.get("via", "lemma")))

    def describe(self) -> str:
        return " + ".join(f"{n} ({r}, id {i})" for i, n, r in zip(self.ids, self.names, self.ranks))


# ------------------------------------------------------------------------------------------
# Classes: from a --classes option or a recipe
# ------------------------------------------------------------------------------------------


def classes_from_text(text: str | Sequence[str | int], label_space: LabelSpace | None = None) -> list[INatClass]:
    """``"9,ostrich,n01530575"`` (indices, names or WordNet ids) -> classes, in order, unique."""
    space = label_space or imagenet1k()
    keys = [k.strip() for k in text.split(",")] if isinstance(text, str) else list(text)
    out: list[INatClass] = []
    seen: set[int] = set()
    for key in keys:
        if key == "" or key is None:
            continue
        index = space.resolve(key)
        if index not in seen:
            seen.add(index)
            out.append(INatClass(index=index, name=space.name_of(index)))
    if not out:
        raise ValueError("no classes given; pass --classes 9,10 (ImageNet-1K indices or names) or --recipe")
    return out


def find_recipe(recipe: str | Path) -> Path:
    """A recipe path, or a recipe name in curate's ``datasets/`` (``counteranimal``)."""
    path = Path(recipe)
    if path.is_file():
        return path
    for candidate in (data_dir() / path.name, data_dir() / f"{path.name}.yaml"):
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"recipe {recipe} not found (looked for the file and in {data_dir()}); "
                            "give a path to a recipe YAML such as datasets/counteranimal.yaml")


def load_recipe(recipe: str | Path, label_space: LabelSpace | None = None) -> tuple[list[INatClass], dict[str, Any]]:
    """The classes of a recipe (``classes: [{index, label, inat_taxon?}]``) and the whole recipe.

    ``inat_taxon`` may be a name, a taxon id, or a list of them.
    """
    path = find_recipe(recipe)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ValueError(f"recipe {path} is not valid YAML: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("classes"), list):
        raise ValueError(f"recipe {path} needs a 'classes' list of {{index: ..., label: ...}} entries")
    space = label_space or imagenet1k()
    out: list[INatClass] = []
    for position, entry in enumerate(data["classes"]):
        if not isinstance(entry, dict) or "index" not in entry:
            raise ValueError(f"recipe {path}: class entry {position} has no 'index' (an ImageNet-1K index)")
        index = space.resolve(entry["index"])
        override = entry.get("inat_taxon")
        if override is None:
            taxa: tuple[str | int, ...] = ()
        elif isinstance(override, (list, tuple)):
            taxa = tuple(override)
        else:
            taxa = (override,)
        for taxon in taxa:
            if isinstance(taxon, bool) or not isinstance(taxon, (str, int)) or (isinstance(taxon, str) and not taxon.strip()):
                raise ValueError(f"recipe {path}: class {index} has a bad inat_taxon {taxon!r} (a name or a taxon id)")
        out.append(INatClass(index=index, name=space.name_of(index), taxon=taxa))
    return out, data


def parse_taxon_overrides(pairs: Iterable[str], label_space: LabelSpace | None = None) -> dict[int, tuple[str | int, ...]]:
    """``["16=Pycnonotidae", "23=Aegypiinae+Cathartidae", "30=60813"]`` -> {index: taxa}."""
    space = label_space or imagenet1k()
    out: dict[int, tuple[str | int, ...]] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not value.strip():
            raise ValueError(f"--taxon {pair!r}: write CLASS=TAXON, e.g. 16=Pycnonotidae or 23=Aegypiinae+Cathartidae")
        taxa = tuple(int(v) if v.strip().isdigit() else v.strip() for v in value.split("+") if v.strip())
        out[space.resolve(key.strip())] = taxa
    return out


def lemma_queries(index: int, label_space: LabelSpace | None = None) -> list[str]:
    """Names to look a class up by: its scientific-name lemmas first, then the others."""
    space = label_space or imagenet1k()
    names = [space.names[index], *(space.synonyms[index] if space.synonyms else ())]
    unique = list(dict.fromkeys(n.strip() for n in names if n and n.strip()))
    scientific = [n for n in unique if _SCIENTIFIC.match(n)]
    return scientific + [n for n in unique if n not in scientific]


# ------------------------------------------------------------------------------------------
# The API
# ------------------------------------------------------------------------------------------


class INatAPI:
    """The few iNaturalist v1 endpoints the collector needs, over a :class:`PoliteClient`."""

    def __init__(self, client: PoliteClient, api_url: str = DEFAULT_API_URL) -> None:
        check_url(api_url)
        self.client = client
        self.api_url = api_url.rstrip("/")

    def _get(self, path: str, params: Mapping[str, Any] | None = None) -> dict[str, Any]:
        url = f"{self.api_url}/{path}"
        data = self.client.get_json(url, params)
        if not isinstance(data, dict):
            raise HttpError(url, f"expected a JSON object, got {type(data).__name__}; is {self.api_url} an "
                            "iNaturalist v1 API?", code="bad_response")
        results = data.get("results")
        if not isinstance(results, list) or not all(isinstance(r, dict) for r in results):
            raise HttpError(url, "the response has no 'results' list; is the API URL an iNaturalist v1 API?",
                            code="bad_response")
        return data

    def search_taxa(self, query: str) -> list[dict[str, Any]]:
        """``GET /taxa?q=...`` (active taxa, best matches first)."""
        return self._get("taxa", {"q": query, "is_active": "true", "per_page": 30})["results"]

    def taxon(self, taxon_id: int) -> dict[str, Any] | None:
        """``GET /taxa/{id}`` (None when there is no such taxon)."""
        try:
            results = self._get(f"taxa/{int(taxon_id)}")["results"]
        except HttpError as exc:
            if exc.status == 404:
                return None
            raise
        return results[0] if results else None

    def observations(self, params: Mapping[str, Any]) -> list[dict[str, Any]]:
        """``GET /observations`` with ``params``; the ``results``."""
        return self._get("observations", params)["results"]


def _fold(text: Any) -> str:
    return " ".join(str(text or "").replace("_", " ").split()).casefold()


def match_taxon(results: Sequence[Mapping[str, Any]], query: str, *, names_only: bool = False) -> dict[str, Any] | None:
    """The active result that is exactly ``query``: by scientific name first, else (unless
    ``names_only``) by matched term or common name, case-insensitively; among several, the most
    observed. None when nothing matches exactly."""
    wanted = _fold(query)
    tiers: list[list[Mapping[str, Any]]] = [[], []]
    for taxon in results:
        if taxon.get("is_active") is False or not isinstance(taxon.get("id"), int):
            continue
        if _fold(taxon.get("name")) == wanted:
            tiers[0].append(taxon)
        elif wanted in (_fold(taxon.get("matched_term")), _fold(taxon.get("preferred_common_name")),
                        _fold(taxon.get("english_common_name"))):
            tiers[1].append(taxon)
    for tier in tiers[:1] if names_only else tiers:
        if tier:
            return dict(max(tier, key=lambda t: int(t.get("observations_count") or 0)))
    return None


def resolve_taxon(api: INatAPI, cls: INatClass, label_space: LabelSpace | None = None) -> ResolvedTaxon:
    """The taxa of ``cls`` (see the module docstring); raises :class:`TaxonNotFoundError`.

    Without an override, the lemmas are tried in order (scientific-looking ones first) and the
    first whose query returns a taxon with exactly that *scientific name* wins ("Nile crocodile"
    does not stop the search before "Crocodylus niloticus"); only when no lemma is a scientific
    name does an exact common-name match count.
    """
    found: list[dict[str, Any]] = []
    tried: list[str] = []
    if cls.taxon:
        for entry in cls.taxon:
            tried.append(str(entry))
            if isinstance(entry, int) or str(entry).isdigit():
                taxon = api.taxon(int(entry))
            else:
                taxon = match_taxon(api.search_taxa(str(entry)), str(entry))
            if taxon is None:
                log.warning("class %s: no active iNaturalist taxon is exactly %r", cls.label, entry)
            elif taxon["id"] not in [t["id"] for t in found]:
                found.append(taxon)
        via = "override"
    else:
        fallback: dict[str, Any] | None = None
        for query in lemma_queries(cls.index, label_space):
            tried.append(query)
            results = api.search_taxa(query)
            taxon = match_taxon(results, query, names_only=True)
            if taxon is not None:
                found.append(taxon)
                break
            if fallback is None:
                fallback = match_taxon(results, query)
        if not found and fallback is not None:
            found.append(fallback)
        via = "lemma"
    if not found:
        raise TaxonNotFoundError(
            f"class {cls.label}: no active iNaturalist taxon is exactly any of {tried}; give one with "
            f"`inat_taxon: <scientific name or taxon id>` in the recipe or --taxon {cls.index}=<name or id>")
    return ResolvedTaxon(ids=[int(t["id"]) for t in found], names=[str(t.get("name")) for t in found],
                         ranks=[str(t.get("rank")) for t in found],
                         common_names=[t.get("preferred_common_name") for t in found], queries=tried, via=via)


# ------------------------------------------------------------------------------------------
# Observations -> candidates
# ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class INatSettings:
    """What a job collects (all but ``per_class`` define the job's identity, see journal)."""

    per_class: int = 300
    quality_grade: str = "research"
    licenses: tuple[str, ...] = ("cc0", "cc-by", "cc-by-nc")
    photos_per_observation: int = 1
    photo_size: str = "medium"
    per_page: int = MAX_PER_PAGE
    api_url: str = DEFAULT_API_URL
    params: tuple[tuple[str, str], ...] = ()
    order: str = "desc"

    def __post_init__(self) -> None:
        if self.order not in ("desc", "asc"):
            raise ValueError(f"order must be 'desc' (latest first) or 'asc' (oldest first), got {self.order!r}")
        if self.per_class < 0:
            raise ValueError(f"per_class must be >= 0, got {self.per_class}")
        if self.quality_grade not in QUALITY_GRADES:
            raise ValueError(f"quality grade {self.quality_grade!r} is not one of {', '.join(QUALITY_GRADES)}")
        if self.photo_size not in PHOTO_SIZES:
            raise ValueError(f"photo size {self.photo_size!r} is not one of {', '.join(PHOTO_SIZES)}")
        unknown = [c for c in self.licenses if c not in INAT_PHOTO_LICENSES and c != "all-rights-reserved"]
        if unknown:
            raise ValueError(f"iNaturalist has no licence {', '.join(unknown)}; its photo licences: "
                             f"{', '.join(INAT_PHOTO_LICENSES)} (or none: all-rights-reserved)")
        if self.photos_per_observation < 1:
            raise ValueError("photos_per_observation must be >= 1")
        if not 1 <= self.per_page <= MAX_PER_PAGE:
            raise ValueError(f"per_page must be within 1..{MAX_PER_PAGE} (iNaturalist's maximum)")
        reserved = {"taxon_id", "id_below", "id_above", "order", "order_by", "per_page", "page", "photos",
                    "quality_grade", "photo_license"}
        clash = sorted(k for k, _ in self.params if k in reserved)
        if clash:
            raise ValueError(f"--param cannot set {', '.join(clash)}: the collector sets them (use its options)")

    def identity(self) -> dict[str, Any]:
        return {"api_url": self.api_url.rstrip("/"), "quality_grade": self.quality_grade,
                "licenses": sorted(self.licenses), "photos_per_observation": self.photos_per_observation,
                "photo_size": self.photo_size, "params": sorted(self.params), "order": self.order}


def sized_photo_url(url: str, size: str) -> str:
    """The URL of ``size`` for a photo URL (``.../photos/1/square.jpg`` -> ``.../photos/1/medium.jpg``);
    only the last path segment is rewritten; URLs without a size token are returned unchanged."""
    parts = urlsplit(url)
    head, _, last = parts.path.rpartition("/")
    match = _SIZE_IN_PATH.fullmatch(last)
    if not match:
        return url
    new_last = size + (match.group("ext") or "")
    return urlunsplit((parts.scheme, parts.netloc, f"{head}/{new_last}", parts.query, parts.fragment))


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return None


def _text(value: Any, limit: int = 500) -> str | None:
    if value is None:
        return None
    text = str(value).strip()
    return text[:limit] if text else None


def observation_items(obs: Mapping[str, Any], cls: INatClass, taxon: ResolvedTaxon, settings: INatSettings,
                      job_id: str) -> Iterator[StreamItem]:
    """The candidates (and licence skips) of one observation JSON (v1 schema), photos in order."""
    try:
        from pyinaturalist.models import Observation
    except ImportError:
        raise ImportError("collecting from iNaturalist needs pyinaturalist: pip install 'curate[inat]'") from None

    group = cls.group
    obs_id = _int(obs.get("id"))
    if obs_id is None:
        yield Skip(key=f"{group}/bad/{hashlib.sha256(repr(obs).encode()).hexdigest()[:12]}", group=group,
                   reason="bad_record", detail="an observation without an integer id")
        return
    grade = obs.get("quality_grade")
    if settings.quality_grade != "any" and grade != settings.quality_grade:
        yield Skip(key=f"{group}/{obs_id}", group=group, reason="quality_grade",
                   detail=f"quality grade {grade!r}, asked for {settings.quality_grade!r}")
        return
    try:
        parsed = Observation.from_json(dict(obs))
        photos = list(parsed.photos)
        user = parsed.user
        obs_taxon = parsed.taxon
    except Exception as exc:  # noqa: BLE001 - a malformed record from the server
        yield Skip(key=f"{group}/{obs_id}", group=group, reason="bad_record", detail=f"does not parse: {exc}")
        return
    observed_at = parsed.observed_on.isoformat() if parsed.observed_on else None
    location = None
    if isinstance(parsed.location, (list, tuple)) and len(parsed.location) == 2:
        try:
            location = [float(parsed.location[0]), float(parsed.location[1])]
        except (TypeError, ValueError):
            location = None
    taken = 0
    for photo in photos:
        photo_id = _int(photo.id)
        if photo_id is None:
            continue
        key = f"{group}/{obs_id}/{photo_id}"
        raw_code = next((p.get("license_code") for p in obs.get("photos") or [] if isinstance(p, dict)
                         and _int(p.get("id")) == photo_id), photo.license_code)
        code = normalize_license(raw_code)
        if code not in settings.licenses:
            yield Skip(key=key, group=group, reason="license", detail=f"licence {code} is not accepted")
            continue
        if taken >= settings.photos_per_observation:
            break
        taken += 1
        url = sized_photo_url(str(photo.url or ""), settings.photo_size)
        observer = _text(getattr(user, "login", None), 200) if user else None
        extra = {
            "observation_id": obs_id,
            "observation_url": f"https://www.inaturalist.org/observations/{obs_id}",
            "photo_id": photo_id,
            "observer": observer,
            "observer_id": _int(getattr(user, "id", None)) if user else None,
            "observer_name": _text(getattr(user, "name", None), 200) if user else None,
            "observed_on": _text(obs.get("observed_on"), 40),
            "observed_at": observed_at,
            "place": _text(parsed.place_guess, 300),
            "location": location,
            "quality_grade": _text(grade, 40),
            "taxon_id": _int(getattr(obs_taxon, "id", None)) if obs_taxon else None,
            "taxon_name": _text(getattr(obs_taxon, "name", None), 200) if obs_taxon else None,
            "taxon_rank": _text(getattr(obs_taxon, "rank", None), 40) if obs_taxon else None,
            "taxon_common_name": _text(getattr(obs_taxon, "preferred_common_name", None), 200) if obs_taxon else None,
            "query_taxon_ids": list(taxon.ids),
            "photo_size": settings.photo_size,
            "original_dimensions": list(photo.original_dimensions) if photo.original_dimensions != (0, 0) else None,
            "license_code": _text(raw_code, 40),
            "inat_job": job_id,
        }
        attribution = _text(photo.attribution, 500) or (f"(c) {observer}, {code}" if observer else None)
        sample = {
            "class_index": cls.index, "source": "inat", "source_id": str(photo_id), "source_url": url or None,
            "license": code, "attribution": attribution, "extra": extra,
        }
        yield Candidate(key=key, group=group, sample=sample, url=url)


def class_stream(api: INatAPI, journal: Journal, cls: INatClass, taxon: ResolvedTaxon,
                 settings: INatSettings) -> Iterator[StreamItem]:
    """The ordered items of one class: earlier retryable failures, then the listing from the
    journaled cursor, with cursor checkpoints after each page.

    ``order="desc"`` (latest first, the default): pages with ``id_below`` = the last id seen,
    anchored below the newest id of the first answer. ``order="asc"`` (oldest first): pages with
    ``id_above`` = the last id seen, anchored by ``id_below`` at the newest id when the job began
    (one extra request). Either way the listing is fixed at the job's start, so a resumed job
    walks the same observations, and no request ever uses ``page`` (refused past 10,000 results).
    """
    group = cls.group
    for record in journal.retryable_failures(group):
        candidate = Candidate.from_journal(record)
        if candidate is not None:
            yield candidate
    if journal.get_state(group, "exhausted"):
        return
    descending = settings.order == "desc"
    anchor = journal.get_state(group, "anchor")
    cursor = journal.get_state(group, "cursor")
    base: dict[str, Any] = {
        "taxon_id": ",".join(str(i) for i in taxon.ids), "photos": "true", "order_by": "id",
        "order": settings.order, "per_page": settings.per_page,
    }
    if settings.quality_grade != "any":
        base["quality_grade"] = settings.quality_grade
    if "all-rights-reserved" not in settings.licenses:
        base["photo_license"] = ",".join(settings.licenses)
    base.update(dict(settings.params))
    if not descending and anchor is None:
        newest = api.observations({**base, "order": "desc", "per_page": 1})
        newest_id = _int(newest[0].get("id")) if newest else None
        if newest_id is None:
            yield Checkpoint(journal.set_state(group, "exhausted", True))
            return
        anchor = newest_id + 1
        yield Checkpoint(journal.set_state(group, "anchor", anchor))
    while True:
        params = dict(base)
        if descending:
            bound = cursor if cursor is not None else anchor
            if bound is not None:
                params["id_below"] = int(bound)
        else:
            params["id_below"] = int(anchor)
            if cursor is not None:
                params["id_above"] = int(cursor)
        results = api.observations(params)
        ids = [_int(r.get("id")) for r in results]
        low = None if descending else cursor
        high = (cursor if cursor is not None else anchor) if descending else anchor
        listed = [(i, r) for i, r in zip(ids, results)
                  if i is not None and (high is None or i < int(high)) and (low is None or i > int(low))]
        if results and not listed:
            raise HttpError(f"{api.api_url}/observations", f"the API ignored id_below/id_above (asked for ids "
                            f"in ({low}, {high}), got {ids[:3]}...); is --api-url an iNaturalist v1 API?",
                            code="bad_response")
        listed.sort(key=lambda pair: -pair[0] if descending else pair[0])
        if descending and anchor is None and listed:
            anchor = listed[0][0] + 1
            yield Checkpoint(journal.set_state(group, "anchor", anchor))
        for _, obs in listed:
            yield from observation_items(obs, cls, taxon, settings, journal.job_id)
        if listed:
            cursor = listed[-1][0]
            yield Checkpoint(journal.set_state(group, "cursor", cursor))
        if len(results) < settings.per_page or not listed:
            yield Checkpoint(journal.set_state(group, "exhausted", True))
            return


# ------------------------------------------------------------------------------------------
# The collector
# ------------------------------------------------------------------------------------------


def _open_dataset(root: Path, *, name: str | None, recipe: str | None, backgrounds: Sequence[str] | None) -> Dataset:
    if (root / "dataset.yaml").exists():
        ds = Dataset.open(root)
        if not ds.label_space.is_builtin:
            raise DatasetError(f"{root} has the label space {ds.label_space.name!r}; iNaturalist classes are "
                               "ImageNet-1K indices, so collect into an ImageNet-1K dataset")
        return ds
    return Dataset.create(root, name=name or root.name, backgrounds=backgrounds, recipe=recipe)


def make_client(*, api_url: str, photo_hosts: Sequence[str] = (), api_rate: str | None = DEFAULT_API_LIMITS,
                download_rate: str | None = DEFAULT_DOWNLOAD_LIMITS, byte_rate: str | None = DEFAULT_BYTE_LIMITS,
                contact: str | None = None, timeout: tuple[float, float] | None = None,
                retry: Any = None) -> PoliteClient:
    """A :class:`PoliteClient` for iNaturalist: its photo hosts, the API's host and ``photo_hosts``
    may serve downloads (``"*"`` in ``photo_hosts`` allows any host)."""
    hosts: set[str] | None = set(INAT_PHOTO_HOSTS) | {host_of(api_url)} | {h.lower() for h in photo_hosts}
    if "*" in hosts:
        hosts = None
    kwargs: dict[str, Any] = {}
    if timeout is not None:
        kwargs["timeout"] = timeout
    if retry is not None:
        kwargs["retry"] = retry
    return PoliteClient(api_limits=api_rate, download_limits=download_rate, byte_limits=byte_rate,
                        allowed_download_hosts=hosts, contact=contact, **kwargs)


def collect_inat(
    dataset_root: str | Path,
    classes: Sequence[INatClass],
    *,
    per_class: int = 300,
    quality_grade: str = "research",
    licenses: Iterable[str] | str | None = None,
    allow_restricted_licenses: bool = False,
    photos_per_observation: int = 1,
    photo_size: str = "medium",
    api_url: str = DEFAULT_API_URL,
    params: Mapping[str, Any] | None = None,
    per_page: int = MAX_PER_PAGE,
    order: str = "desc",
    client: PoliteClient | None = None,
    photo_hosts: Sequence[str] = (),
    api_rate: str | None = DEFAULT_API_LIMITS,
    download_rate: str | None = DEFAULT_DOWNLOAD_LIMITS,
    byte_rate: str | None = DEFAULT_BYTE_LIMITS,
    contact: str | None = None,
    concurrency: int = 4,
    batch_size: int = 64,
    name: str | None = None,
    recipe: str | None = None,
    backgrounds: Sequence[str] | None = None,
    resolve_only: bool = False,
    progress: ProgressFn | None = None,
) -> CollectReport:
    """Collect the latest ``per_class`` iNaturalist photos of each class into ``dataset_root``
    (``order="asc"``: the oldest instead).

    Creates the dataset (ImageNet-1K label space) when missing. Safe to interrupt at any point
    and to run again: the job's journal (``.collect/inat-<job>.jsonl``) makes the re-run finish
    the job without fetching anything twice. ``resolve_only`` resolves and journals the taxa and
    stops (``report.info["taxa"]``). ``client`` overrides the client built from the rate and
    host options. Raises :class:`TaxonNotFoundError` (listing every unresolved class) before
    downloading anything, and :class:`~curate.collect.http.HttpError` when the API keeps failing
    (run again later: it resumes).
    """
    settings = INatSettings(
        per_class=per_class, quality_grade=quality_grade,
        licenses=license_policy(licenses, allow_restricted=allow_restricted_licenses,
                                source_codes=INAT_PHOTO_LICENSES + ("all-rights-reserved",),
                                source="iNaturalist"),
        photos_per_observation=photos_per_observation, photo_size=photo_size, per_page=per_page, api_url=api_url,
        params=tuple(sorted((str(k), str(v)) for k, v in (params or {}).items())), order=order,
    )
    if not classes:
        raise ValueError("no classes to collect")
    if len({c.index for c in classes}) != len(classes):
        raise ValueError("a class is listed twice; list each ImageNet-1K index once")
    root = Path(dataset_root)
    ds = _open_dataset(root, name=name, recipe=recipe, backgrounds=backgrounds)
    own_client = client is None
    client = client or make_client(api_url=api_url, photo_hosts=photo_hosts, api_rate=api_rate,
                                   download_rate=download_rate, byte_rate=byte_rate, contact=contact)
    api = INatAPI(client, api_url)
    try:
        with Journal(ds.root, "inat", settings.identity()) as journal:  # ds.root is absolute
            taxa = _resolve_all(api, journal, classes, ds.label_space)
            with Engine(ds, journal, client=client, actor="collect.inat", concurrency=concurrency,
                        batch_size=batch_size, progress=progress) as engine:
                for cls in classes:
                    engine.group(cls.group, cls.label, settings.per_class)
                if not resolve_only:
                    for cls in classes:
                        stats = engine.fill(cls.group, cls.label,
                                            class_stream(api, journal, cls, taxa[cls.index], settings),
                                            settings.per_class)
                        if stats.have < settings.per_class and stats.exhausted:
                            log.warning("class %s: only %d of %d photos exist with these filters (taxa %s)",
                                        cls.label, stats.have, settings.per_class, taxa[cls.index].describe())
                    for cls in classes:
                        if journal.get_state(cls.group, "exhausted"):
                            engine.report.groups[cls.group].exhausted = True
                report = engine.finish() if not resolve_only else engine.report
            report.info["taxa"] = {str(c.index): taxa[c.index].to_dict() for c in classes}
            report.info["settings"] = {**settings.identity(), "per_class": settings.per_class}
            _record(ds, journal, classes, taxa, settings, report, resolve_only)
    finally:
        if own_client:
            client.close()
    return report


def _resolve_all(api: INatAPI, journal: Journal, classes: Sequence[INatClass],
                 label_space: LabelSpace) -> dict[int, ResolvedTaxon]:
    """Resolve every class (journaled, so a re-run asks the API nothing); all errors at once."""
    taxa: dict[int, ResolvedTaxon] = {}
    problems: list[str] = []
    for cls in classes:
        cached = journal.get_state(cls.group, "taxon")
        if cached:
            taxa[cls.index] = ResolvedTaxon.from_dict(cached)
            continue
        try:
            resolved = resolve_taxon(api, cls, label_space)
        except TaxonNotFoundError as exc:
            problems.append(str(exc))
            continue
        log.info("class %s -> iNaturalist %s", cls.label, resolved.describe())
        journal.append([journal.set_state(cls.group, "taxon", resolved.to_dict())])
        taxa[cls.index] = resolved
    if problems:
        raise TaxonNotFoundError(f"{len(problems)} class(es) have no iNaturalist taxon:\n  " + "\n  ".join(problems))
    return taxa


def _record(ds: Dataset, journal: Journal, classes: Sequence[INatClass], taxa: Mapping[int, ResolvedTaxon],
            settings: INatSettings, report: CollectReport, resolve_only: bool) -> None:
    """Provenance in dataset.yaml: ``provenance["collect.inat"]["jobs"][job_id]``."""
    entry = dict(ds.provenance.get("collect.inat") or {})
    jobs = dict(entry.get("jobs") or {})
    jobs[journal.job_id] = {
        **settings.identity(), "per_class": settings.per_class, "journal": str(journal.path.relative_to(ds.root)),
        "classes": [{"index": c.index, "name": c.name, "taxon_ids": taxa[c.index].ids,
                     "taxon_names": taxa[c.index].names, "via": taxa[c.index].via,
                     "have": report.groups[c.group].have if c.group in report.groups else 0,
                     "exhausted": bool(journal.get_state(c.group, "exhausted"))} for c in classes],
        "complete": (not resolve_only) and not report.incomplete,
    }
    entry["jobs"] = jobs
    ds.record_provenance("collect.inat", entry)
