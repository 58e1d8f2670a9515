"""Licence codes as collectors store them, and the policy of which ones a collection accepts.

Stored codes are lower-case Creative Commons short names as iNaturalist writes them:
``cc0``, ``cc-by``, ``cc-by-sa``, ``cc-by-nc``, ``cc-by-nc-sa``, ``cc-by-nd``, ``cc-by-nc-nd``,
plus ``all-rights-reserved`` (iNaturalist's null licence), ``pd`` (public domain / no known
copyright restrictions) and ``us-gov`` (a United States Government work). Unknown strings are
kept, lower-cased.

Policy: a benchmark crops, masks, re-encodes and composites its images, i.e. makes derivative
works, and redistributes them. ``-nd`` licences forbid derivatives and all-rights-reserved
photos may not be redistributed at all, so they are excluded unless the user insists
(``allow_restricted=True`` / ``--allow-restricted-licenses``). The default set is CC0, CC-BY
and CC-BY-NC (ShareAlike variants may be added: they oblige the published set to share alike).
"""
from __future__ import annotations

import re
from typing import Iterable

CC_CODES: tuple[str, ...] = ("cc0", "cc-by", "cc-by-sa", "cc-by-nc", "cc-by-nc-sa", "cc-by-nd", "cc-by-nc-nd")
ALL_RIGHTS_RESERVED = "all-rights-reserved"
KNOWN_CODES: tuple[str, ...] = CC_CODES + (ALL_RIGHTS_RESERVED, "pd", "us-gov")
DEFAULT_LICENSES: tuple[str, ...] = ("cc0", "cc-by", "cc-by-nc")
#: No derivatives, or no licence at all: only with allow_restricted.
RESTRICTED: frozenset[str] = frozenset({"cc-by-nd", "cc-by-nc-nd", ALL_RIGHTS_RESERVED})

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


def license_policy(licenses: Iterable[str] | str | None = None, *, allow_restricted: bool = False) -> tuple[str, ...]:
    """The accepted licence codes (normalised, in the given order); raises ValueError when a
    restricted licence is asked for without ``allow_restricted`` or a code is unknown."""
    if licenses is None:
        return DEFAULT_LICENSES
    if isinstance(licenses, str):
        licenses = [part for part in licenses.split(",")]
    wanted: list[str] = []
    for raw in licenses:
        if not str(raw).strip():
            continue
        if str(raw).strip().lower() == "all":
            codes = [c for c in KNOWN_CODES if c not in ("us-gov",)]
        else:
            codes = [normalize_license(raw)]
        for code in codes:
            if code not in KNOWN_CODES:
                raise ValueError(f"unknown licence {raw!r}; known codes: {', '.join(KNOWN_CODES)}")
            if code in RESTRICTED and not allow_restricted:
                why = "forbids derivative works" if code != ALL_RIGHTS_RESERVED else "gives no right to redistribute"
                raise ValueError(f"licence {code} {why}, and a benchmark crops, masks and republishes images; "
                                 "pass --allow-restricted-licenses (allow_restricted=True) if you have the right to use them")
            if code not in wanted:
                wanted.append(code)
    if not wanted:
        raise ValueError("no licence accepted; give at least one, e.g. cc0,cc-by,cc-by-nc")
    return tuple(wanted)
