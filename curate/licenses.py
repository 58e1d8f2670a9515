"""Licences, in one place: the codes curate stores, how a source's licence string is read,
which licences a collection accepts, which images may be published, and what the dataset card
states. Collectors (:mod:`curate.collect`), the split export and the publisher
(:mod:`curate.publish`) all import from here.

**Codes.** Stored codes are lower-case Creative Commons short names as iNaturalist writes them:
``cc0``, ``cc-by``, ``cc-by-sa``, ``cc-by-nc``, ``cc-by-nc-sa``, ``cc-by-nd``, ``cc-by-nc-nd``,
plus ``all-rights-reserved`` (iNaturalist's null licence), ``pd`` (public domain / no known
copyright restrictions) and ``us-gov`` (a United States Government work). Unknown strings are
kept, lower-cased (:func:`normalize_license`).

**Stored ids** (:func:`stored_license`). A collector stores each image's licence as its SPDX id,
lower-cased as the Hugging Face Hub writes licence ids, *with its version*: ``cc-by-4.0``,
``cc-by-nc-sa-2.0``, ``cc0-1.0``, ``gpl-2.0``, ``gpl-3.0``; a CC licence stated without a version
stays its code (``cc-by``, as iNaturalist writes it). GPL-2.0 and GPL-3.0 oblige differently, so
they are never made one. Every rule below reads a stored id through :func:`normalize_license`,
so a versioned id is collected, published and combined as its code; the version is what the
card and ``ATTRIBUTION.csv`` state.

**Collecting** (:func:`license_policy`). A benchmark crops, masks, re-encodes and composites its
images, i.e. makes derivative works, and redistributes them. ``-nd`` licences forbid derivatives
and all-rights-reserved photos may not be redistributed at all (:data:`RESTRICTED`), so they are
excluded unless the user insists (``allow_restricted=True`` / ``--allow-restricted-licenses``).
The default set is CC0, CC-BY and CC-BY-NC (ShareAlike variants may be added: they oblige the
published set to share alike). A source may know fewer codes than curate (iNaturalist's
``photo_license`` filter has no ``pd`` or ``us-gov``): ``license_policy(..., source_codes=...)``
refuses the others instead of sending a filter the source rejects or silently ignores.

**Publishing** (issue 8; :func:`classify_licence`, :func:`card_licence`):

- Only images whose licence allows redistribution *and* derivative works are published:
  :data:`PUBLISHABLE` (CC0, public domain, US government works, CC BY, BY-SA, BY-NC, BY-NC-SA).
  ``-nd`` licences and all-rights-reserved photos (:data:`RESTRICTED`) are never published;
  neither are images with no licence (iNaturalist's null licence means all rights reserved) or
  with a licence string curate does not recognise. There is no override: whoever holds the
  rights to such an image can set its ``license`` in the folder (``Dataset.update``) and publish
  again.
- The card's ``license`` is the most restrictive licence present, when one licence present
  covers every other (CC0 < BY < BY-SA, BY < BY-NC < BY-NC-SA, BY-SA < BY-NC-SA); otherwise
  ``other`` with the per-image licence table in the card and every image's licence in the
  ``license`` column and ``ATTRIBUTION.csv``.
- Any non-commercial image (``-nc``) makes the whole card non-commercial: the card says so at
  the top and carries the ``non-commercial`` tag, whatever the ``license`` field says.
"""
from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

CC_CODES: tuple[str, ...] = ("cc0", "cc-by", "cc-by-sa", "cc-by-nc", "cc-by-nc-sa", "cc-by-nd", "cc-by-nc-nd")
ALL_RIGHTS_RESERVED = "all-rights-reserved"
KNOWN_CODES: tuple[str, ...] = CC_CODES + (ALL_RIGHTS_RESERVED, "pd", "us-gov")
DEFAULT_LICENSES: tuple[str, ...] = ("cc0", "cc-by", "cc-by-nc")
#: No derivatives, or no licence at all: only with allow_restricted, and never published.
RESTRICTED: frozenset[str] = frozenset({"cc-by-nd", "cc-by-nc-nd", ALL_RIGHTS_RESERVED})
#: Licence codes whose images are published (redistribution and derivatives allowed).
PUBLISHABLE: tuple[str, ...] = ("cc0", "pd", "us-gov", "cc-by", "cc-by-sa", "cc-by-nc", "cc-by-nc-sa")
#: Codes that forbid commercial use.
NON_COMMERCIAL: frozenset[str] = frozenset({"cc-by-nc", "cc-by-nc-sa", "cc-by-nc-nd"})
#: Codes with a share-alike clause.
SHARE_ALIKE: frozenset[str] = frozenset({"cc-by-sa", "cc-by-nc-sa"})
#: Public-domain-like codes (no conditions).
PUBLIC_DOMAIN: frozenset[str] = frozenset({"cc0", "pd", "us-gov"})

_ALIASES = {
    "cc-0": "cc0", "cc0-1.0": "cc0", "cc-zero": "cc0", "public domain": "pd", "public-domain": "pd", "pdm": "pd",
    "no known copyright restrictions": "pd", "united states government work": "us-gov",
    "all rights reserved": ALL_RIGHTS_RESERVED, "arr": ALL_RIGHTS_RESERVED, "c": ALL_RIGHTS_RESERVED,
    "none": ALL_RIGHTS_RESERVED, "copyright": ALL_RIGHTS_RESERVED,
}
_WORDS = {"attribution": "by", "noncommercial": "nc", "sharealike": "sa", "noderivs": "nd", "noderivatives": "nd"}


def normalize_license(value: object) -> str:
    """The stored code for a licence as a source writes it (iNaturalist code, CC URL, COCO name).

    ``None``/empty -> ``all-rights-reserved`` (iNaturalist's meaning of a null licence);
    ``"CC-BY-NC"``, ``"cc_by_nc"``, ``"CC BY-NC 4.0"`` -> ``cc-by-nc``;
    ``"http://creativecommons.org/licenses/by-nc-sa/2.0/"`` -> ``cc-by-nc-sa``;
    ``".../publicdomain/zero/1.0/"`` -> ``cc0``; ``"Attribution-NonCommercial License"`` -> ``cc-by-nc``.
    """
    if value is None:
        return ALL_RIGHTS_RESERVED
    text = str(value).strip().lower()
    if not text:
        return ALL_RIGHTS_RESERVED
    url = re.search(r"creativecommons\.org/(licenses|publicdomain)/([a-z\-]+)", text)
    if url:
        kind, code = url.groups()
        if kind == "publicdomain":
            return "cc0" if code == "zero" else "pd"
        return "cc-" + code
    if "flickr.com/commons/usage" in text:
        return "pd"
    if "usa.gov" in text or "government work" in text:
        return "us-gov"
    if text in _ALIASES:
        return _ALIASES[text]
    if "attribution" in text:
        words = re.findall(r"[a-z]+", text.replace("non-commercial", "noncommercial")
                           .replace("share-alike", "sharealike").replace("no-deriv", "noderiv"))
        parts = [_WORDS[w] for w in words if w in _WORDS]
        if parts and parts[0] == "by":
            return "cc-" + "-".join(dict.fromkeys(parts))
    text = re.sub(r"[\s_]+", "-", text)
    if re.fullmatch(r"cc-?0(-?1\.0)?|cc-?zero", text):
        return "cc0"
    text = re.sub(r"-?\d+(\.\d+)?$", "", text)  # version suffix: cc-by-4.0
    if text.startswith("cc-") or text == "cc0":
        return _ALIASES.get(text, text)
    return _ALIASES.get(text.replace("-", " "), text)


def stored_license(value: object) -> str | None:
    """The licence id a collector stores for ``value`` as a source or user writes it (None when empty).

    A licence curate knows keeps its stated version: ``"CC BY-NC 4.0"`` -> ``cc-by-nc-4.0``,
    ``".../licenses/by-nc-sa/2.0/"`` -> ``cc-by-nc-sa-2.0``, ``".../publicdomain/zero/1.0/"`` ->
    ``cc0-1.0``, ``"cc-by"`` -> ``cc-by``; ``pd``, ``us-gov`` and ``all-rights-reserved`` have none.
    Any other licence is kept whole, lower-cased, spaces and underscores as hyphens: ``"GPL-2.0"``
    -> ``gpl-2.0``, ``"Apache 2.0"`` -> ``apache-2.0``. ``normalize_license(stored_license(x))`` is
    ``normalize_license(x)``.
    """
    if value is None or not str(value).strip():
        return None
    text = str(value).strip()
    code = normalize_license(text)
    if code in CC_CODES:
        version = licence_version(text)
        return f"{code}-{version}" if version else code
    if code in KNOWN_CODES:
        return code
    return re.sub(r"[\s_]+", "-", text.lower())


def license_policy(licenses: Iterable[str] | str | None = None, *, allow_restricted: bool = False,
                   source_codes: Sequence[str] | None = None, source: str = "this source") -> tuple[str, ...]:
    """The accepted licence codes (normalised, in the given order); raises ValueError when a
    restricted licence is asked for without ``allow_restricted`` or a code is unknown.

    ``source_codes``: the only codes the source can filter on or hand out (``source`` names it in
    the error). A code outside them is refused, naming the allowed ones, rather than mapped: e.g.
    iNaturalist has no ``pd`` or ``us-gov``, and no licence it has means the same. ``"all"``
    then means every one of ``source_codes``.
    """
    if licenses is None:
        licenses = DEFAULT_LICENSES
    if isinstance(licenses, str):
        licenses = [part for part in licenses.split(",")]
    wanted: list[str] = []
    for raw in licenses:
        if not str(raw).strip():
            continue
        if str(raw).strip().lower() == "all":
            codes = list(source_codes) if source_codes is not None else [c for c in KNOWN_CODES if c not in ("us-gov",)]
        else:
            codes = [normalize_license(raw)]
        for code in codes:
            if code not in KNOWN_CODES:
                raise ValueError(f"unknown licence {raw!r}; known codes: {', '.join(KNOWN_CODES)}")
            if source_codes is not None and code not in source_codes:
                raise ValueError(f"{source} has no licence {code} (asked for as {str(raw).strip()!r}); "
                                 f"the codes it accepts: {', '.join(source_codes)}")
            if code in RESTRICTED and not allow_restricted:
                why = "forbids derivative works" if code != ALL_RIGHTS_RESERVED else "gives no right to redistribute"
                raise ValueError(f"licence {code} {why}, and a benchmark crops, masks and republishes images; "
                                 "pass --allow-restricted-licenses (allow_restricted=True) if you have the right to use them")
            if code not in wanted:
                wanted.append(code)
    if not wanted:
        raise ValueError("no licence accepted; give at least one, e.g. cc0,cc-by,cc-by-nc")
    return tuple(wanted)


# ---------------------------------------------------------------------------------------------
# publishing
# ---------------------------------------------------------------------------------------------

#: Why an image is not published (the card's "not published" table uses these words).
EXCLUSION_REASONS: dict[str, str] = {
    "no-derivatives": "licence forbids derivative works (ND)",
    "all-rights-reserved": "all rights reserved: no right to redistribute",
    "unlicensed": "no licence stated (treated as all rights reserved)",
    "unknown-licence": "licence not recognised, so the right to redistribute cannot be checked",
}

#: Licence identifiers the Hugging Face Hub knows, by (curate code, version).
HUB_LICENSE_IDS: dict[tuple[str, str], str] = {
    ("cc0", "1.0"): "cc0-1.0",
    ("cc-by", "2.0"): "cc-by-2.0", ("cc-by", "2.5"): "cc-by-2.5", ("cc-by", "3.0"): "cc-by-3.0",
    ("cc-by", "4.0"): "cc-by-4.0",
    ("cc-by-sa", "3.0"): "cc-by-sa-3.0", ("cc-by-sa", "4.0"): "cc-by-sa-4.0",
    ("cc-by-nc", "2.0"): "cc-by-nc-2.0", ("cc-by-nc", "3.0"): "cc-by-nc-3.0", ("cc-by-nc", "4.0"): "cc-by-nc-4.0",
    ("cc-by-nc-sa", "2.0"): "cc-by-nc-sa-2.0", ("cc-by-nc-sa", "3.0"): "cc-by-nc-sa-3.0",
    ("cc-by-nc-sa", "4.0"): "cc-by-nc-sa-4.0",
}
#: The version assumed for the card when the sources do not state one (iNaturalist uses 4.0).
DEFAULT_CC_VERSION = "4.0"

_VERSION = re.compile(r"(\d)\.(\d)")


@dataclass(frozen=True)
class LicenceVerdict:
    """One image's licence: the normalised code, whether it is published, and why not."""

    code: str
    publishable: bool
    reason: str | None = None


def classify_licence(raw: Any) -> LicenceVerdict:
    """The verdict for a stored ``license`` value (see the module docstring for the policy).

    >>> classify_licence("CC BY-NC 4.0")
    LicenceVerdict(code='cc-by-nc', publishable=True, reason=None)
    >>> classify_licence(None).reason
    'unlicensed'
    """
    if raw is None or not str(raw).strip():
        return LicenceVerdict(ALL_RIGHTS_RESERVED, False, "unlicensed")
    code = normalize_license(raw)
    if code in RESTRICTED:
        return LicenceVerdict(code, False, "all-rights-reserved" if code == ALL_RIGHTS_RESERVED else "no-derivatives")
    if code not in PUBLISHABLE:  # kept whole (gpl-2.0 and gpl-3.0 are two licences)
        return LicenceVerdict(stored_license(raw) or code, False, "unknown-licence")
    return LicenceVerdict(code, True)


def licence_terms(code: str) -> frozenset[str]:
    """The conditions of a licence code: a subset of {"by", "nc", "sa", "nd"} (empty for PD/CC0)."""
    if code in PUBLIC_DOMAIN:
        return frozenset()
    if not code.startswith("cc-"):
        raise ValueError(f"licence {code!r} has no known terms")
    return frozenset(code[3:].split("-"))


def licence_version(raw: Any) -> str | None:
    """The licence version a source states ("CC BY-NC 4.0", ".../by/2.0/" -> "4.0", "2.0"), or None."""
    if raw is None:
        return None
    match = _VERSION.search(str(raw))
    return f"{match.group(1)}.{match.group(2)}" if match else None


@dataclass
class CardLicence:
    """What the dataset card says about licences (see :func:`card_licence`)."""

    #: The card's ``license`` field: a Hub licence id or ``other``.
    license: str
    #: For ``other``: a short name and where the terms are (``license_name`` / ``license_link``).
    license_name: str | None
    license_link: str | None
    #: The most restrictive curate code present when one covers the others, else None.
    most_restrictive: str | None
    non_commercial: bool
    share_alike: bool
    #: Published images per licence code.
    counts: dict[str, int] = field(default_factory=dict)
    #: A sentence for the card when the version in ``license`` was assumed, not stated.
    note: str | None = None

    def metadata(self) -> dict[str, Any]:
        """The card metadata fields: ``license`` (+ ``license_name``/``license_link`` for other)."""
        meta: dict[str, Any] = {"license": self.license}
        if self.license == "other":
            meta["license_name"] = self.license_name
            meta["license_link"] = self.license_link
        return meta


def most_restrictive(codes: Iterable[str]) -> str | None:
    """The code present whose terms include every other code's terms, or None when none does.

    Public-domain codes tie at the bottom; among them CC0 wins only when all are CC0.
    """
    present = sorted(set(codes))
    if not present:
        return None
    terms = {c: licence_terms(c) for c in present}
    union = frozenset().union(*terms.values())
    covering = [c for c in present if terms[c] == union]
    if len(covering) == 1:
        return covering[0]
    return None  # several public-domain codes (cc0 + pd), or no single code covers the others


def card_licence(rows: Iterable[Mapping[str, Any]], *, attribution_file: str = "ATTRIBUTION.csv") -> CardLicence:
    """The card's licence fields for the published rows (each with ``license_code`` and the
    stated ``license``), following the policy of the module docstring."""
    counts: Counter[str] = Counter()
    versions: dict[str, set[str | None]] = {}
    for row in rows:
        code = row["license_code"]
        counts[code] += 1
        versions.setdefault(code, set()).add(licence_version(row.get("license")))
    top = most_restrictive(counts)
    non_commercial = any(c in NON_COMMERCIAL for c in counts)
    share_alike = any(c in SHARE_ALIKE for c in counts)
    note = None
    license_id: str | None = None
    if top is not None and top not in ("pd", "us-gov"):
        stated = {v for v in versions[top] if v is not None}
        default = "1.0" if top == "cc0" else DEFAULT_CC_VERSION
        if len(stated) == 1 and None not in versions[top] and (top, next(iter(stated))) in HUB_LICENSE_IDS:
            version = next(iter(stated))
        else:
            version = default
            if top != "cc0":
                note = (f"The sources do not state one {top.upper()} version for every image; the card's `license` "
                        f"field names version {version}. Each image's own licence, as its source states it, is in the "
                        f"`license_as_stated` column and in `{attribution_file}`.")
        license_id = HUB_LICENSE_IDS.get((top, version))
    if license_id is not None:
        return CardLicence(license_id, None, None, top, non_commercial, share_alike, dict(counts), note)
    if counts and set(counts) <= PUBLIC_DOMAIN:
        name = "public-domain"
    else:
        name = "mixed-per-image" + ("-non-commercial" if non_commercial else "")
    return CardLicence("other", name, attribution_file, top, non_commercial, share_alike, dict(counts), note)


def derivative_licence(codes: Iterable[str]) -> str | None:
    """The licence of one image made from several (a pasted object on another photo's background),
    or None when no single licence may carry them all (curate then does not combine them).

    - one code (or one repeated): that code;
    - only public-domain codes (CC0, PD, US government): ``pd`` (no conditions either way);
    - otherwise the code whose terms cover every other's (:func:`most_restrictive`: CC BY + BY-NC
      -> BY-NC), except that a share-alike parent obliges the result to be its own licence
      (BY-SA + BY-NC-SA is refused: BY-SA material may only be adapted under BY-SA);
    - no covering code (BY-SA + BY-NC), or a code without known terms: None.

    Stored ids with versions (:func:`stored_license`) are combined as their codes; the result
    keeps the version its parents of that code state when they state one (``cc-by-4.0`` +
    ``cc-by-nc-4.0`` -> ``cc-by-nc-4.0``), else it is the code alone.
    """
    stated = sorted({str(c) for c in codes})
    if not stated:
        return None
    if len(stated) == 1:
        return stated[0]
    by_code: dict[str, set[str | None]] = {}
    for raw in stated:
        code = normalize_license(raw)
        by_code.setdefault(code, set()).add(licence_version(raw) if code in CC_CODES else None)
    present = sorted(by_code)
    if set(present) <= PUBLIC_DOMAIN:
        return "pd"
    try:
        top = most_restrictive(present)
    except ValueError:  # a code whose terms curate does not know
        return None
    if top is None or any(c in SHARE_ALIKE and c != top for c in present):
        return None
    versions = by_code[top]
    return f"{top}-{next(iter(versions))}" if len(versions) == 1 and None not in versions else top
