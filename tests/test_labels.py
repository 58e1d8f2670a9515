"""Label spaces: ImageNet-1K lookup by index, WordNet id, name and lemma; custom lists."""
from __future__ import annotations

import pytest

from curate.labels import AmbiguousClassError, LabelSpace, UnknownClassError, imagenet1k


def test_imagenet_resolves_every_kind_of_key() -> None:
    space = imagenet1k()
    assert len(space) == 1000
    assert space.resolve(296) == space.resolve("296") == space.resolve("n02134084") == 296
    assert space.resolve("ice bear") == space.resolve("Ursus maritimus") == 296
    assert space.resolve("  OSTRICH ") == 9
    assert space.name_of(9) == "ostrich"


def test_repeated_names_are_ambiguous_and_unknown_names_suggest() -> None:
    space = imagenet1k()
    with pytest.raises(AmbiguousClassError, match=r"\[657, 744\]"):
        space.resolve("missile")
    with pytest.raises(UnknownClassError, match="did you mean 'ostrich'"):
        space.resolve("ostrch")
    with pytest.raises(UnknownClassError, match="outside"):
        space.resolve(1000)


def test_custom_label_space_round_trips_through_config() -> None:
    space = LabelSpace.from_names("coco", ["person", "bird", "cat"])
    again = LabelSpace.from_config(space.to_config())
    assert again == space and again.resolve("Cat") == 2
    assert LabelSpace.from_config(None) is imagenet1k()
    assert imagenet1k().to_config() == {"name": "imagenet1k"}
    with pytest.raises(ValueError, match="names"):
        LabelSpace.from_config({"name": "mine", "names": ["ok", ""]})


def test_an_unknown_word_suggests_the_classes_named_by_it() -> None:
    """'cat' suggests ImageNet's cats (by the words of names and WordNet lemmas), not 'crate' or 'coast'."""
    space = imagenet1k()
    assert [index for index, _ in space.suggestions("cat")] == [281, 282, 283, 284, 285]
    assert [index for index, _ in space.suggestions("cats")][:5] == [281, 282, 283, 284, 285]
    with pytest.raises(UnknownClassError) as info:
        space.resolve("cat")
    message = str(info.value)
    for shown in ("'tabby cat' (281)", "'tiger cat' (282)", "'Persian cat' (283)", "'Siamese cat' (284)",
                  "'Egyptian Mau' (285, as 'Egyptian cat')"):
        assert shown in message, message
    assert "crate" not in message and "coast" not in message
    # a typo still finds its class by spelling; a word no class carries suggests nothing
    assert space.suggestions("ostrch")[0][0] == 9
    assert space.suggestions("qwertyuiop") == []
    assert [i for i, _ in space.suggestions("polar bear")] == [296]
