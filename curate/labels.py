"""Label spaces: the list of classes a dataset's ``class_index`` points into.

ImageNet-1K is the default (papers/003 §2.1 queries iNaturalist by ImageNet-1K names and
scores 1-vs-1000, App. C.2). A dataset may declare another list (COCO categories, a user's
own). Classes are identified by index, never by name: two ImageNet names repeat
("missile" at 657 and 744, "sunglasses" at 836 and 837).

The ImageNet-1K table ships as ``datasets/imagenet1k.tsv``: index, WordNet id, the clean name
open_clip uses in prompts (``IMAGENET_CLASSNAMES``) and timm's WordNet lemmas.
"""
from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from curate.paths import data_file

IMAGENET1K = "imagenet1k"
#: Classes suggested for a name the label space does not hold (:meth:`LabelSpace.suggestions`).
SUGGESTIONS = 5


class UnknownClassError(KeyError):
    """A class name, WordNet id or index that the label space does not contain."""

    def __str__(self) -> str:  # KeyError quotes its message; we want it plain
        return str(self.args[0]) if self.args else "unknown class"


class AmbiguousClassError(UnknownClassError):
    """A name that matches several classes (e.g. ImageNet's two 'missile' labels)."""


@dataclass(frozen=True)
class LabelSpace:
    """An ordered list of class names; ``class_index`` values index into it.

    Attributes:
        name: ``"imagenet1k"`` for the built-in table, any other string for a custom list.
        names: the display/prompt name of each class (for ImageNet, open_clip's clean names).
        ids: an external id per class (WordNet ids for ImageNet), or empty strings.
        synonyms: extra names per class (ImageNet lemmas), used only to resolve user input.
    """

    name: str
    names: tuple[str, ...]
    ids: tuple[str, ...] = ()
    synonyms: tuple[tuple[str, ...], ...] = ()
    _lookup: dict[str, tuple[int, ...]] = field(default_factory=dict, compare=False, repr=False)
    #: Every name and synonym as written (not the ids) -> (its words read singular, the classes it names).
    _keys: dict[str, tuple[tuple[str, ...], tuple[int, ...]]] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not self.names:
            raise ValueError("a label space needs at least one class name")
        if self.ids and len(self.ids) != len(self.names):
            raise ValueError("label space ids and names differ in length")
        lookup: dict[str, list[int]] = {}
        for index, name in enumerate(self.names):
            keys = {name}
            if self.ids:
                keys.add(self.ids[index])
            if self.synonyms:
                keys.update(self.synonyms[index])
            for key in keys:
                if key:
                    lookup.setdefault(_norm(key), []).append(index)
        self._lookup.update({k: tuple(sorted(set(v))) for k, v in lookup.items()})
        written: dict[str, set[int]] = {}
        for index, name in enumerate(self.names):
            for key in (name, *(self.synonyms[index] if self.synonyms else ())):
                if key:
                    written.setdefault(key, set()).add(index)
        self._keys.update({k: (tuple(_stem(w) for w in _words(k)), tuple(sorted(v))) for k, v in written.items()})

    def __len__(self) -> int:
        return len(self.names)

    @property
    def is_builtin(self) -> bool:
        return self.name == IMAGENET1K

    def name_of(self, index: int) -> str:
        """The class name at ``index`` (raises :class:`UnknownClassError` when out of range)."""
        if not 0 <= int(index) < len(self.names):
            raise UnknownClassError(
                f"class index {index} is outside the label space '{self.name}' (0..{len(self) - 1})"
            )
        return self.names[int(index)]

    def resolve(self, key: int | str) -> int:
        """The class index for an index, a digit string, an external id (WordNet) or a name.

        Names match case-insensitively against the display name, the id and the synonyms
        (ImageNet lemmas such as "Struthio camelus"). A name shared by several classes raises
        :class:`AmbiguousClassError` listing their indices; an unknown one raises
        :class:`UnknownClassError` with the closest names as suggestions.
        """
        if isinstance(key, bool):
            raise UnknownClassError(f"{key!r} is not a class")
        if isinstance(key, int) or (isinstance(key, str) and key.strip().isdigit()):
            index = int(key)
            self.name_of(index)
            return index
        text = _norm(str(key))
        hits = self._lookup.get(text)
        if hits is None:
            hint = self.hint(str(key))
            raise UnknownClassError(
                f"unknown class {key!r} in label space '{self.name}'{'; ' + hint if hint else ''} "
                "(use an index, a WordNet id or a label name)"
            )
        if len(hits) > 1:
            raise AmbiguousClassError(
                f"class name {key!r} matches several classes {list(hits)} in '{self.name}'; "
                "give the index instead"
            )
        return hits[0]

    def suggestions(self, text: str, n: int = SUGGESTIONS) -> list[tuple[int, str]]:
        """Up to ``n`` classes to suggest for ``text`` that names none: ``(index, the name or synonym
        that matched)``, best first.

        By words first: the classes one of whose names or synonyms (for ImageNet, the WordNet
        lemmas of ``datasets/imagenet1k.tsv``) holds every word of ``text``, a plural read as its
        singular ("cats" -> cat). Ranked by (the last word of the name is the last word of
        ``text``, i.e. the name is a kind of it: "tabby cat" before "cat bear"; fewer other words;
        index). "cat" -> tabby cat, tiger cat, Persian cat, Siamese cat, Egyptian Mau (lemma
        "Egyptian cat"). Only when no name holds the words: the names spelled most alike
        (``difflib``, ratio >= 0.75), for typos ("ostrch" -> ostrich). WordNet itself (nltk) is not
        used: its data is a separate download an offline install lacks, and the lemmas shipped
        with the label space are WordNet's own for its synsets.
        """
        wanted = [_stem(w) for w in _words(text)]
        if not wanted:
            return []
        best: dict[int, tuple[tuple[int, int, int], str]] = {}
        for key, (words, indices) in self._keys.items():
            if not words or not set(wanted) <= set(words):
                continue
            rank = (0 if words[-1] == wanted[-1] else 1, len(words) - len(wanted))
            for index in indices:
                score = (*rank, index)
                if index not in best or score < best[index][0]:
                    best[index] = (score, key)
        if best:
            return [(index, key) for index, (_, key) in sorted(best.items(), key=lambda kv: kv[1][0])[:n]]
        found: list[tuple[int, str]] = []
        for close in difflib.get_close_matches(_norm(text), list(self._lookup), n=n, cutoff=0.75):
            for index in self._lookup[close]:
                if index not in {i for i, _ in found}:
                    found.append((index, next(k for k in self._keys if _norm(k) == close)))
        return found[:n]

    def hint(self, text: str) -> str:
        """``did you mean 'tabby cat' (281), 'Egyptian Mau' (285, as 'Egyptian cat'), ...?`` for an
        unknown ``text`` (:meth:`suggestions`), or "" when there is nothing to suggest. Every
        collector's unknown-class message says it (they all resolve through :meth:`resolve`)."""
        shown = []
        for index, key in self.suggestions(text):
            name = self.names[index]
            shown.append(f"{name!r} ({index})" if _norm(key) == _norm(name) else f"{name!r} ({index}, as {key!r})")
        return f"did you mean {', '.join(shown)}?" if shown else ""

    def resolve_many(self, keys: Iterable[int | str]) -> list[int]:
        return [self.resolve(k) for k in keys]

    def to_config(self) -> dict[str, Any]:
        """What ``dataset.yaml`` stores: the built-in name alone, or a custom list in full."""
        if self.is_builtin:
            return {"name": IMAGENET1K}
        config: dict[str, Any] = {"name": self.name, "names": list(self.names)}
        if self.ids:
            config["ids"] = list(self.ids)
        return config

    @classmethod
    def from_config(cls, config: dict[str, Any] | str | None) -> LabelSpace:
        """Inverse of :meth:`to_config`; ``None`` or ``"imagenet1k"`` gives ImageNet-1K."""
        if config is None or config == IMAGENET1K:
            return imagenet1k()
        if isinstance(config, str):
            raise ValueError(f"unknown built-in label space {config!r}; the built-in one is 'imagenet1k'")
        if not isinstance(config, dict) or "name" not in config:
            raise ValueError("label_space must be a mapping with a 'name' (and 'names' for a custom list)")
        if config["name"] == IMAGENET1K and "names" not in config:
            return imagenet1k()
        names = config.get("names")
        if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
            raise ValueError(f"label space {config['name']!r} needs 'names': a list of non-empty strings")
        ids = config.get("ids") or ()
        return cls(name=str(config["name"]), names=tuple(names), ids=tuple(str(i) for i in ids))

    @classmethod
    def from_names(cls, name: str, names: Sequence[str]) -> LabelSpace:
        return cls(name=name, names=tuple(names))


def _norm(text: str) -> str:
    return " ".join(text.replace("_", " ").split()).casefold()


def _words(text: str) -> list[str]:
    return re.findall(r"[^\W_]+", text.casefold())


def _stem(word: str) -> str:
    """A plural read as its singular, roughly (cats -> cat, foxes -> fox, puppies -> puppy); other words as they are."""
    if len(word) > 4 and word.endswith("ies"):
        return word[:-3] + "y"
    if len(word) > 4 and word.endswith(("ches", "shes", "xes", "ses", "zes")):
        return word[:-2]
    if len(word) > 3 and word.endswith("s") and not word.endswith(("ss", "us", "is")):
        return word[:-1]
    return word


def unknown_labels_message(unknown: dict[str, str], field: str, space: str, rows: str, own_space_flag: str) -> str:
    """The importers' one refusal for labels outside the label space (``collect hub`` and ``collect
    fiftyone`` refuse alike unless told ``--skip-unknown``): how many, the first five with why, and
    the two ways on (``rows``: what is left out, e.g. "rows"; ``own_space_flag``: the option that keeps
    the source's own class names)."""
    shown = "; ".join(f"{label!r}: {why}" for label, why in list(unknown.items())[:5])
    return (f"{len(unknown)} label(s) of {field!r} are not in the label space {space!r} "
            f"({shown}{' ...' if len(unknown) > 5 else ''}); pass --skip-unknown to leave their {rows} out, "
            f"or collect into a new folder with {own_space_flag}")


@lru_cache(maxsize=1)
def imagenet1k() -> LabelSpace:
    """The ImageNet-1K label space from ``datasets/imagenet1k.tsv`` (1000 classes)."""
    names: list[str] = []
    ids: list[str] = []
    synonyms: list[tuple[str, ...]] = []
    with data_file("imagenet1k.tsv").open(encoding="utf-8") as handle:
        for line in handle:
            if line.startswith("#") or not line.strip():
                continue
            index, wnid, name, lemmas = line.rstrip("\n").split("\t")
            if int(index) != len(names):
                raise ValueError(f"imagenet1k.tsv is out of order at index {index}")
            names.append(name)
            ids.append(wnid)
            synonyms.append(tuple(s.strip() for s in lemmas.split(",") if s.strip()))
    if len(names) != 1000:
        raise ValueError(f"imagenet1k.tsv holds {len(names)} classes, expected 1000")
    return LabelSpace(name=IMAGENET1K, names=tuple(names), ids=tuple(ids), synonyms=tuple(synonyms))
