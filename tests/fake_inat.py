"""A fake iNaturalist v1 API and photo server on 127.0.0.1 (stdlib http.server), for offline tests.

It serves a generated world (:func:`make_world`, or the planted-place world of :func:`make_place_world`,
where a photo's background follows its place and month, with ``month`` and ``swlat``/``swlng``/``nelat``/
``nelng`` filters) in the v1 schema (``/v1/taxa``, ``/v1/taxa/<id>``,
``/v1/observations`` with ``taxon_id``, ``photos``, ``quality_grade``, ``photo_license``,
``order_by=id``, ``order``, ``id_below``/``id_above``, ``per_page`` <= 200, and iNaturalist's
refusal of ``page`` past 10,000 results) and generated JPEGs under
``/photos/<id>/<size>.jpg``. Faults are injected on demand:

- ``api_429_every=k``: every k-th API request answers 429 with ``Retry-After: api_retry_after``;
- per photo (``photo_faults[photo_id]``): ``"500_once"``, ``"429_once"``, ``"slow_once"`` (sleeps
  ``slow_seconds`` before the first answer), ``"truncate_once"`` (first answer breaks off
  half-way through a body whose Content-Length is whole), ``"corrupt"`` (garbage bytes, always),
  ``"truncated_file"`` (a JPEG cut short, served whole, always), ``"404"``, ``"500_always"``;
- ``photo_delay``: seconds every photo answer waits (to make runs long enough to be killed).

The world (:func:`make_world`) holds duplicate photos across observations (the same photo id in
two observations, and two photo ids with identical bytes), a licence mix (cc0, cc-by, cc-by-nc,
cc-by-nd, cc-by-sa, null = all rights reserved), observations with several photos, and a few
``needs_id`` observations. :meth:`FakeINat.expected` computes what a correct collector must end
up with, independently of curate.

Run it by hand: ``python tests/fake_inat.py`` prints its URL and serves until Ctrl-C.
"""
from __future__ import annotations

import io
import json
import random
import re
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import numpy as np
from PIL import Image
from quiet_http import QuietHTTPServer

LICENSE_CYCLE = ["cc-by", "cc-by-nc", "cc0", "cc-by-nd", "cc-by-nc", None, "cc-by-sa", "cc-by"]
PHOTO_SIZES = {"square": 75, "small": 120, "medium": 160, "large": 256, "original": 320}


@dataclass
class FakeTaxon:
    id: int
    name: str
    rank: str
    common: str | None
    matched_terms: tuple[str, ...] = ()
    is_active: bool = True

    def as_json(self, matched: str | None = None) -> dict[str, Any]:
        data = {"id": self.id, "name": self.name, "rank": self.rank, "rank_level": 10 if self.rank == "species" else 20,
                "is_active": self.is_active, "preferred_common_name": self.common,
                "iconic_taxon_name": "Animalia", "observations_count": 1000 + self.id, "ancestor_ids": [1, self.id],
                "default_photo": None}
        if matched is not None:
            data["matched_term"] = matched
        return data


@dataclass
class FakePhoto:
    id: int
    license: str | None
    content_seed: int
    user: str
    background: str | None = None  # the planted-place world's photos show their background (photo_jpeg)

    def as_json(self, base: str) -> dict[str, Any]:
        code = self.license
        if code is None:
            attribution = f"(c) {self.user}, all rights reserved"
        elif code == "cc0":
            attribution = f"no rights reserved, uploaded by {self.user}"
        else:
            attribution = f"(c) {self.user}, some rights reserved ({code.upper().replace('-', ' ', 1)})"
        return {"id": self.id, "license_code": code, "attribution": attribution,
                "url": f"{base}/photos/{self.id}/square.jpg", "original_dimensions": {"width": 320, "height": 240},
                "flags": []}


@dataclass
class FakeObservation:
    id: int
    taxon: FakeTaxon
    photos: list[FakePhoto]
    quality_grade: str = "research"
    user: str = "observer"
    #: the planted-place world (:func:`make_place_world`): where and when, and the background that follows
    lat: float | None = None
    lng: float | None = None
    month: int | None = None
    background: str | None = None

    @property
    def where(self) -> tuple[float, float]:
        """(latitude, longitude): the planted place, else the default world's made-up one."""
        if self.lat is not None and self.lng is not None:
            return self.lat, self.lng
        return 10 + self.id % 50 + 0.5, 20 + self.id % 30 + 0.25

    def as_json(self, base: str) -> dict[str, Any]:
        day = 1 + self.id % 28
        month = self.month or 5
        lat, lng = self.where
        return {
            "id": self.id, "uuid": f"00000000-0000-4000-8000-{self.id:012d}", "quality_grade": self.quality_grade,
            "observed_on": f"2023-{month:02d}-{day:02d}",
            "time_observed_at": f"2023-{month:02d}-{day:02d}T10:{self.id % 60:02d}:00+00:00",
            "observed_on_details": {"date": f"2023-{month:02d}-{day:02d}", "year": 2023, "month": month, "day": day},
            "created_at": f"2023-{month:02d}-{day:02d}T12:00:00+00:00",
            "updated_at": f"2023-{month:02d}-{day:02d}T12:00:00+00:00",
            "place_guess": f"Test Place {self.id % 7}, Testland", "location": f"{lat},{lng}",
            "geojson": {"type": "Point", "coordinates": [lng, lat]},
            "geoprivacy": None, "obscured": False, "captive": False, "license_code": "cc-by-nc",
            "uri": f"https://www.inaturalist.org/observations/{self.id}",
            "species_guess": self.taxon.common, "taxon": self.taxon.as_json(),
            "user": {"id": 500 + sum(map(ord, self.user)) % 100, "login": self.user, "name": self.user.title(),
                     "icon_url": None},
            "photos": [p.as_json(base) for p in self.photos],
            "observation_photos": [{"id": 9000 + p.id, "position": i, "uuid": f"op-{p.id}", "photo": p.as_json(base)}
                                   for i, p in enumerate(self.photos)],
            "identifications_count": 2, "comments_count": 0, "faves_count": 0, "num_identification_agreements": 2,
            "num_identification_disagreements": 0, "tags": [], "sounds": [], "project_ids": [], "place_ids": [1, 2],
        }


@dataclass
class World:
    taxa: list[FakeTaxon]
    observations: list[FakeObservation]
    photos: dict[int, FakePhoto] = field(default_factory=dict)

    def background_of(self, photo_id: int) -> str | None:
        """The planted background of a photo (None outside the planted-place world)."""
        return next((o.background for o in self.observations if any(p.id == photo_id for p in o.photos)), None)


def make_world(n_per_taxon: int = 12, seed: int = 0) -> World:
    """Three taxa (ostrich, brambling as species; bulbuls as a family reachable by a recipe
    override), ``n_per_taxon`` observations each, with the duplicates and licence mix above."""
    rng = random.Random(seed)
    taxa = [
        FakeTaxon(20001, "Struthio camelus", "species", "Common Ostrich"),
        FakeTaxon(20002, "Fringilla montifringilla", "species", "Brambling"),
        FakeTaxon(20003, "Pycnonotidae", "family", "Bulbuls", matched_terms=("bulbul",)),
        FakeTaxon(20004, "Struthio camelus camelus", "subspecies", "North African Ostrich"),
        FakeTaxon(20005, "Rana catesbeiana", "species", "American Bullfrog", is_active=False),
    ]
    photos: dict[int, FakePhoto] = {}
    observations: list[FakeObservation] = []
    obs_id, photo_id, license_i = 1000, 50000, 0
    for taxon in taxa[:3]:
        for k in range(n_per_taxon):
            obs_id += rng.randint(1, 9)
            n_photos = 1 + (k % 4 == 1) + (k % 6 == 3)
            obs_photos: list[FakePhoto] = []
            for _ in range(n_photos):
                photo_id += rng.randint(1, 5)
                code = LICENSE_CYCLE[license_i % len(LICENSE_CYCLE)]
                license_i += 1
                photo = FakePhoto(photo_id, code, content_seed=photo_id, user=f"user{k % 5}")
                photos[photo_id] = photo
                obs_photos.append(photo)
            grade = "needs_id" if k % 9 == 5 else "research"
            observations.append(FakeObservation(obs_id, taxon, obs_photos, grade, user=f"user{k % 5}"))
    # duplicates: the same photo in a second observation; a second photo id with the same bytes
    by_taxon = [o for o in observations if o.taxon.id == 20001 and o.quality_grade == "research"]
    if len(by_taxon) >= 4:
        shared = by_taxon[-2].photos[0]
        shared.license = "cc-by"
        obs_id += 3
        observations.append(FakeObservation(obs_id, taxa[0], [shared], "research", user="copycat"))
        twin_src = by_taxon[-3].photos[0]
        twin_src.license = "cc0"
        photo_id += 7
        twin = FakePhoto(photo_id, "cc-by", content_seed=twin_src.content_seed, user="twin")
        photos[photo_id] = twin
        obs_id += 2
        observations.append(FakeObservation(obs_id, taxa[0], [twin], "research", user="twin"))
    return World(taxa=taxa, observations=observations, photos=photos)


#: The planted-place world's rule: snow in the north in the cold months, water on the coast band, else grass.
PLACE_COLD_MONTHS = (11, 12, 1, 2, 3)
PLACE_COAST = (-12.0, 12.0)  # the longitudes of the coast band


def planted_background(lat: float, lng: float, month: int) -> str:
    """The background a photo taken at (lat, lng) in ``month`` has in the planted-place world."""
    if lat > 45 and month in PLACE_COLD_MONTHS:
        return "snow"
    if PLACE_COAST[0] <= lng <= PLACE_COAST[1]:
        return "water"
    return "grass"


def make_place_world(n_per_taxon: int = 3000, seed: int = 0, taxa: tuple[int, ...] = (20001,)) -> World:
    """A world where the truth is known: ``n_per_taxon`` research-grade observations of each taxon
    (one CC-BY photo each) spread uniformly over latitudes -60..70, longitudes -180..180 and the
    twelve months; each photo's background follows :func:`planted_background` (about 8% snow, 7%
    water, the rest grass). ``World.background_of(photo_id)`` is the truth."""
    rng = random.Random(seed)
    base = make_world(n_per_taxon=1, seed=seed)
    chosen = [t for t in base.taxa if t.id in taxa]
    photos: dict[int, FakePhoto] = {}
    observations: list[FakeObservation] = []
    obs_id, photo_id = 100000, 500000
    for taxon in chosen:
        for k in range(n_per_taxon):
            obs_id += 1
            photo_id += 1
            lat, lng, month = round(rng.uniform(-60, 70), 3), round(rng.uniform(-180, 180), 3), rng.randint(1, 12)
            background = planted_background(lat, lng, month)
            photo = FakePhoto(photo_id, "cc-by", content_seed=photo_id, user=f"user{k % 40}", background=background)
            photos[photo_id] = photo
            observations.append(FakeObservation(obs_id, taxon, [photo], "research", user=f"user{k % 40}", lat=lat,
                                                lng=lng, month=month, background=background))
    return World(taxa=base.taxa, observations=observations, photos=photos)


#: The two-region world's snowy places: (swlat, swlng, nelat, nelng) and their cold months.
TWO_REGIONS = {"north": ((50.0, 0.0, 70.0, 40.0), (12, 1, 2)), "south": ((-55.0, -75.0, -40.0, -55.0), (6, 7, 8))}


def two_region_background(lat: float, lng: float, month: int) -> str:
    """Snow in either region of :data:`TWO_REGIONS` in its own cold months, water on the coast band, else grass."""
    for (swlat, swlng, nelat, nelng), months in TWO_REGIONS.values():
        if swlat <= lat <= nelat and swlng <= lng <= nelng and month in months:
            return "snow"
    if PLACE_COAST[0] <= lng <= PLACE_COAST[1]:
        return "water"
    return "grass"


def make_two_region_world(n_per_taxon: int = 3000, seed: int = 0) -> World:
    """Ostriches whose snow (the hard group) lies in two regions at opposite ends of the globe, each
    with its own season (:data:`TWO_REGIONS`): a third of the observations in each region, a third
    anywhere (latitudes -60..70, longitudes -180..180), months uniform. Between the regions there is
    no snow at all, so a fill that lands there lands outside the group. Every tenth observation shows
    a CC-BY-ND photo before its CC-BY one (a licence the fill skips)."""
    rng = random.Random(seed)
    base = make_world(n_per_taxon=1, seed=seed)
    taxon = next(t for t in base.taxa if t.id == 20001)
    photos: dict[int, FakePhoto] = {}
    observations: list[FakeObservation] = []
    boxes = [box for box, _ in TWO_REGIONS.values()] + [(-60.0, -180.0, 70.0, 180.0)]
    for k in range(n_per_taxon):
        swlat, swlng, nelat, nelng = boxes[k % 3]
        lat, lng = round(rng.uniform(swlat, nelat), 3), round(rng.uniform(swlng, nelng), 3)
        month = rng.randint(1, 12)
        background = two_region_background(lat, lng, month)
        shown = [FakePhoto(700000 + 2 * k, "cc-by", content_seed=700000 + 2 * k, user=f"user{k % 40}",
                           background=background)]
        if k % 10 == 0:  # a first photo whose licence (no derivatives) a fill does not accept
            shown.insert(0, FakePhoto(700001 + 2 * k, "cc-by-nd", content_seed=700001 + 2 * k, user=f"user{k % 40}",
                                      background=background))
        photos.update((p.id, p) for p in shown)
        observations.append(FakeObservation(300000 + k, taxon, shown, "research", user=f"user{k % 40}", lat=lat,
                                            lng=lng, month=month, background=background))
    return World(taxa=base.taxa, observations=observations, photos=photos)


#: The colour a planted background tints its photos with (photo_jpeg), so a CLIP can tell them apart.
BACKGROUND_COLOURS = {"snow": (235, 240, 250), "grass": (60, 150, 50), "water": (40, 90, 190)}


def photo_jpeg(content_seed: int, size: str = "medium", background: str | None = None) -> bytes:
    """A deterministic JPEG for a photo (noise + blocks, so every seed differs). With a ``background``
    (the planted-place world), the blocks around a central object (2 x 2 noise blocks) are its
    colour with some noise, as a photo shows its background around the animal."""
    side = PHOTO_SIZES.get(size, 160)
    rng = np.random.default_rng(content_seed)
    base = rng.integers(0, 256, (6, 8, 3), dtype=np.uint8)
    if background is not None:
        tint = np.array(BACKGROUND_COLOURS[background], dtype=np.int16)
        around = np.clip(tint + rng.integers(-30, 31, (6, 8, 3)), 0, 255).astype(np.uint8)
        around[2:4, 3:5] = base[2:4, 3:5]
        base = around
    img = Image.fromarray(base).resize((side, side * 3 // 4), Image.NEAREST)
    buffer = io.BytesIO()
    img.save(buffer, "JPEG", quality=90)
    return buffer.getvalue()


class FakeINat:
    """The server (see the module docstring). Use as a context manager; ``api_url`` is the v1 base."""

    def __init__(self, world: World | None = None, *, api_429_every: int | None = None, api_retry_after: str = "1",
                 photo_faults: dict[int, str] | None = None, photo_delay: float = 0.0, slow_seconds: float = 1.5,
                 api_delay: float = 0.0) -> None:
        self.world = world or make_world()
        self.api_429_every = api_429_every
        self.api_retry_after = api_retry_after
        self.photo_faults = dict(photo_faults or {})
        self.photo_delay = photo_delay
        self.slow_seconds = slow_seconds
        self.api_delay = api_delay
        self.lock = threading.Lock()
        self.api_requests: list[str] = []
        self.photo_requests: Counter[int] = Counter()
        self.photo_complete: Counter[int] = Counter()
        self.user_agents: set[str] = set()
        self._api_count = 0
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._jpegs: dict[tuple[int, str, str | None], bytes] = {}

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self) -> FakeINat:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def start(self) -> None:
        handler = type("Handler", (_Handler,), {"fake": self})
        self._server = QuietHTTPServer(("127.0.0.1", 0), handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    @property
    def base_url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    @property
    def api_url(self) -> str:
        return f"{self.base_url}/v1"

    # ------------------------------------------------------------------ ground truth
    def expected(self, taxon_id: int, per_class: int, licenses: tuple[str, ...] = ("cc0", "cc-by", "cc-by-nc"),
                 photos_per_observation: int = 1, taken: set[int] | None = None,
                 taken_content: set[int] | None = None) -> list[int]:
        """Photo ids a correct collector keeps for a taxon: newest observations first, research
        grade, the first accepted photos, no repeated photo id or content, no permanently broken
        photo; stop at ``per_class``. ``taken``/``taken_content`` carry across classes."""
        taken = set() if taken is None else taken
        taken_content = set() if taken_content is None else taken_content
        out: list[int] = []
        for obs in sorted(self.world.observations, key=lambda o: -o.id):
            if obs.taxon.id != taxon_id or obs.quality_grade != "research":
                continue
            used = 0
            for photo in obs.photos:
                if (photo.license or "all-rights-reserved") not in licenses:
                    continue
                if used >= photos_per_observation:
                    break
                used += 1
                if len(out) >= per_class:
                    return out
                if photo.id in taken or photo.content_seed in taken_content:
                    continue
                if self.photo_faults.get(photo.id) in ("corrupt", "truncated_file", "404", "500_always"):
                    continue
                taken.add(photo.id)
                taken_content.add(photo.content_seed)
                out.append(photo.id)
        return out

    def jpeg(self, photo: FakePhoto, size: str) -> bytes:
        key = (photo.content_seed, size, photo.background)
        with self.lock:
            data = self._jpegs.get(key)
        if data is None:
            data = photo_jpeg(photo.content_seed, size, photo.background)
            with self.lock:
                self._jpegs[key] = data
        return data

    # ------------------------------------------------------------------ API logic
    def api(self, path: str, query: dict[str, list[str]]) -> tuple[int, dict[str, Any], dict[str, str]]:
        with self.lock:
            self._api_count += 1
            count = self._api_count
            self.api_requests.append(path + "?" + "&".join(f"{k}={v[0]}" for k, v in sorted(query.items())))
        if self.api_429_every and count % self.api_429_every == 0:
            return 429, {"error": "Too Many Requests", "status": 429}, {"Retry-After": self.api_retry_after}
        if self.api_delay:
            time.sleep(self.api_delay)
        q = {k: v[0] for k, v in query.items()}
        if path == "/v1/taxa":
            text = q.get("q", "").casefold()
            hits = []
            for taxon in self.world.taxa:
                if q.get("is_active") == "true" and not taxon.is_active:
                    continue
                terms = [taxon.name, taxon.common or "", *taxon.matched_terms]
                matched = next((t for t in terms if text and text in t.casefold()), None)
                if matched is not None:
                    hits.append(taxon.as_json(matched))
            return 200, {"total_results": len(hits), "page": 1, "per_page": 30, "results": hits}, {}
        match = re.fullmatch(r"/v1/taxa/(\d+)", path)
        if match:
            hits = [t.as_json() for t in self.world.taxa if t.id == int(match.group(1))]
            if not hits:
                return 404, {"error": "Not found", "status": 404}, {}
            return 200, {"total_results": 1, "page": 1, "per_page": 1, "results": hits}, {}
        if path == "/v1/observations":
            return self._observations(q)
        return 404, {"error": f"unknown endpoint {path}", "status": 404}, {}

    def _observations(self, q: dict[str, str]) -> tuple[int, dict[str, Any], dict[str, str]]:
        per_page = min(int(q.get("per_page", 30)), 200)
        page = int(q.get("page", 1))
        if page * per_page > 10000:
            return 403, {"error": "You reached 10,000 results; use id_above or id_below to page further",
                         "status": 403}, {}
        taxon_ids = {int(t) for t in q["taxon_id"].split(",")} if q.get("taxon_id") else None
        licenses = set(q["photo_license"].lower().split(",")) if q.get("photo_license") else None
        rows = []
        for obs in self.world.observations:
            if taxon_ids is not None and obs.taxon.id not in taxon_ids:
                continue
            if q.get("quality_grade") and obs.quality_grade not in q["quality_grade"].split(","):
                continue
            if q.get("photos") == "true" and not obs.photos:
                continue
            if licenses is not None and not any((p.license or "") in licenses for p in obs.photos):
                continue
            if q.get("id_below") and obs.id >= int(q["id_below"]):
                continue
            if q.get("id_above") and obs.id <= int(q["id_above"]):
                continue
            if q.get("month") and (obs.month or 5) not in {int(m) for m in q["month"].split(",")}:
                continue
            if not _in_box(obs.where, q):
                continue
            rows.append(obs)
        rows.sort(key=lambda o: o.id, reverse=q.get("order", "desc") == "desc")
        chunk = rows[(page - 1) * per_page: page * per_page]
        return 200, {"total_results": len(rows), "page": page, "per_page": per_page,
                     "results": [o.as_json(self.base_url) for o in chunk]}, {}


def _in_box(where: tuple[float, float], q: dict[str, str]) -> bool:
    """iNaturalist's bounding-box filter (``swlat``, ``swlng``, ``nelat``, ``nelng``; any may be absent)."""
    lat, lng = where
    return (float(q.get("swlat", -90)) <= lat <= float(q.get("nelat", 90))
            and float(q.get("swlng", -180)) <= lng <= float(q.get("nelng", 180)))


class _Handler(BaseHTTPRequestHandler):
    fake: FakeINat
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:  # quiet
        pass

    def _send(self, status: int, body: bytes, content_type: str, headers: dict[str, str] | None = None,
              declared: int | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body) if declared is None else declared))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)
        self.wfile.flush()

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        fake = self.fake
        parts = urlsplit(self.path)
        with fake.lock:
            fake.user_agents.add(self.headers.get("User-Agent", ""))
        if parts.path.startswith("/v1/"):
            status, payload, headers = fake.api(parts.path, parse_qs(parts.query))
            self._send(status, json.dumps(payload).encode(), "application/json", headers)
            return
        match = re.fullmatch(r"/photos/(\d+)/(\w+)\.jpg", parts.path)
        if not match or int(match.group(1)) not in fake.world.photos:
            self._send(404, b"not found", "text/plain")
            return
        photo = fake.world.photos[int(match.group(1))]
        size = match.group(2)
        with fake.lock:
            fake.photo_requests[photo.id] += 1
            nth = fake.photo_requests[photo.id]
        fault = fake.photo_faults.get(photo.id)
        if fake.photo_delay:
            time.sleep(fake.photo_delay)
        if fault == "404":
            self._send(404, b"gone", "text/plain")
            return
        if fault == "500_always" or (fault == "500_once" and nth == 1):
            self._send(500, b"internal error", "text/plain")
            return
        if fault == "429_once" and nth == 1:
            self._send(429, b"slow down", "text/plain", {"Retry-After": "0"})
            return
        if fault == "slow_once" and nth == 1:
            time.sleep(fake.slow_seconds)
        body = fake.jpeg(photo, size)
        if fault == "corrupt":
            body = b"\xff\xd8\xff\xe0" + bytes(random.Random(photo.id).getrandbits(8) for _ in range(600))
        elif fault == "truncated_file":
            body = body[: len(body) // 2]
        elif fault == "truncate_once" and nth == 1:
            try:
                self._send(200, body[: len(body) // 2], "image/jpeg", declared=len(body))
            finally:
                self.close_connection = True
            return
        try:
            self._send(200, body, "image/jpeg")
        except (BrokenPipeError, ConnectionResetError):
            return
        with fake.lock:
            fake.photo_complete[photo.id] += 1


class FileServer:
    """A static server on 127.0.0.1: ``files[path] = bytes`` with the same per-path faults as
    the photo server (``faults[path]``: 500_once, 500_always, 429_once, slow_once,
    truncate_once, 404), plus ``redirects[path] = location``. ``requests[path]`` counts hits."""

    def __init__(self, files: dict[str, bytes] | None = None, faults: dict[str, str] | None = None,
                 redirects: dict[str, str] | None = None, slow_seconds: float = 1.0,
                 retry_after: str = "0") -> None:
        self.files = dict(files or {})
        self.faults = dict(faults or {})
        self.redirects = dict(redirects or {})
        self.slow_seconds = slow_seconds
        self.retry_after = retry_after
        self.requests: Counter[str] = Counter()
        self.headers: list[dict[str, str]] = []
        self.lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    def __enter__(self) -> FileServer:
        handler = type("FileHandler", (_FileHandler,), {"server_state": self})
        self._server = QuietHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"


class _FileHandler(_Handler):
    server_state: FileServer

    def do_GET(self) -> None:  # noqa: N802
        state = self.server_state
        path = urlsplit(self.path).path
        with state.lock:
            state.requests[path] += 1
            nth = state.requests[path]
            state.headers.append(dict(self.headers))
        if path in state.redirects:
            self.send_response(302)
            self.send_header("Location", state.redirects[path])
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        fault = state.faults.get(path)
        if path not in state.files or fault == "404":
            self._send(404, b"not found", "text/plain")
            return
        if fault == "500_always" or (fault == "500_once" and nth == 1):
            self._send(500, b"internal error", "text/plain")
            return
        if fault == "503_retry_after" and nth == 1:
            self._send(503, b"busy", "text/plain", {"Retry-After": state.retry_after})
            return
        if fault == "429_once" and nth == 1:
            self._send(429, b"slow down", "text/plain", {"Retry-After": state.retry_after})
            return
        if fault == "429_always":
            self._send(429, b"slow down", "text/plain", {"Retry-After": state.retry_after})
            return
        if fault == "slow_once" and nth == 1:
            time.sleep(state.slow_seconds)
        body = state.files[path]
        if fault == "truncate_once" and nth == 1:
            self.close_connection = True
            self._send(200, body[: len(body) // 2], "application/octet-stream", declared=len(body))
            return
        try:
            self._send(200, body, "application/octet-stream")
        except (BrokenPipeError, ConnectionResetError):
            pass


if __name__ == "__main__":  # pragma: no cover - manual use
    with FakeINat() as server:
        print(f"fake iNaturalist API at {server.api_url} (Ctrl-C to stop)")
        try:
            while True:
                time.sleep(1)
        except KeyboardInterrupt:
            pass


# ------------------------------------------------------------------------------------------
# Helpers for comparing collected datasets
# ------------------------------------------------------------------------------------------

_PORT = re.compile(r"127\.0\.0\.1:\d+")
_VOLATILE_EXTRA = {"inat_job", "composite_job"}


def dataset_signature(root) -> dict[str, Any]:
    """What two runs of the same job must agree on: rows (without times, ports, job ids), the
    quarantine (source, reason) set, and that media/ holds exactly the rows' files."""
    from pathlib import Path

    import pyarrow.parquet as pq

    root = Path(root)
    rows = []
    for row in pq.read_table(root / "samples.parquet").to_pylist():
        row.pop("added_at")
        extra = json.loads(row.pop("extra") or "{}")
        row["extra"] = {k: v for k, v in extra.items() if k not in _VOLATILE_EXTRA}
        row["source_url"] = _PORT.sub("HOST", row["source_url"] or "")
        rows.append(json.dumps(row, sort_keys=True))
    quarantine = set()
    qfile = root / "quarantine.jsonl"
    if qfile.exists():
        for line in qfile.read_text().splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            quarantine.add((record.get("source"), record.get("reason")))
    media = sorted(p.relative_to(root).as_posix() for p in (root / "media").rglob("*") if p.is_file())
    return {"rows": sorted(rows), "quarantine": sorted(quarantine), "media": media}
