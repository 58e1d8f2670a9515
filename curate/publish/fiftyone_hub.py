"""``curate publish --format fiftyone``: the FiftyOne view of the dataset, through FiftyOne's Hub integration.

For users who browse in FiftyOne: ``fiftyone.utils.huggingface.load_from_hub(repo)`` gives them
the samples with every curate field (class, background, group, mask, licence, attribution,
evaluation predictions) and the saved views. Steps of :func:`publish_fiftyone`:

1. the same selection and licence rules as the Hub layout (:func:`curate.publish.hub.select_rows`,
   :mod:`curate.licenses`): ND / all-rights-reserved / unlicensed images never leave;
2. ``builder(root, sample_ids, name)`` makes the FiftyOne collection to push. The default syncs
   the folder into its FiftyOne dataset (:func:`curate.review.fiftyone.push_fiftyone`, which needs
   MongoDB, see :mod:`curate.review.database`), selects the publishable samples and clones them
   into a temporary dataset (deleted afterwards);
3. ``pusher(collection, repo_name, ...)`` uploads it. The default is
   ``fiftyone.utils.huggingface.push_to_hub``, which publishes under the token's own user name
   (it calls ``whoami``), so ``--repo OWNER/NAME`` must name that user; the licence, tags (with
   ``non-commercial`` when any image is NC) and a description go with it.

``builder``, ``pusher`` and ``api_factory`` are injectable, so everything but FiftyOne and the
network is testable without MongoDB.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from curate.licenses import CardLicence, card_licence
from curate.publish.card import TAGS
from curate.publish.hub import ATTRIBUTION_FILE, PublishError, Selection, select_rows
from curate.publish.upload import (
    DEFAULT_TOKEN_ENV,
    check_repo_id,
    hub_url,
    read_token,
    scrub,
)

log = logging.getLogger(__name__)

Builder = Callable[[Path, Sequence[str], str], Any]
Pusher = Callable[..., Any]


@dataclass
class FiftyOnePublishResult:
    """What :func:`publish_fiftyone` did (``pushed`` False for a dry run)."""

    repo_id: str
    url: str
    samples: int
    licence: CardLicence
    excluded: dict[str, int]
    pushed: bool


def fiftyone_description(name: str, selection: Selection, licence: CardLicence) -> str:
    """The description pushed with the FiftyOne dataset (NC notice first when any image is NC)."""
    counts = selection.split_counts()
    parts = []
    if licence.non_commercial:
        parts.append("Non-commercial use only (some images are CC BY-NC).")
    parts.append(f"{name}: a CounterAnimal-style spurious-background benchmark built with curate; "
                 + ", ".join(f"{n} {s}" for s, n in counts.items()) + " images. Each sample's `license` and "
                 "`attribution` fields give its licence and author; the `group` field is easy/hard.")
    return " ".join(parts)


def default_builder(root: Path, sample_ids: Sequence[str], name: str) -> Any:
    """Sync the folder into FiftyOne, then clone the publishable samples into a temporary dataset."""
    from curate.review.fiftyone import dataset_name, import_fiftyone, push_fiftyone
    from curate.store import Dataset

    push_fiftyone(root, name=name)
    fo = import_fiftyone()
    source = fo.load_dataset(dataset_name(Dataset.open(root), name))
    view = source.select_by("sample_id", list(sample_ids))
    temporary = f"{source.name}-hub-publish"
    if temporary in fo.list_datasets():
        fo.delete_dataset(temporary)
    clone = view.clone(temporary)
    clone.persistent = False
    return clone


def default_pusher(collection: Any, repo_name: str, **kwargs: Any) -> Any:
    """``fiftyone.utils.huggingface.push_to_hub``."""
    from curate.review.fiftyone import import_fiftyone

    import_fiftyone()
    import fiftyone.utils.huggingface as fouh

    return fouh.push_to_hub(collection, repo_name, **kwargs)


def _cleanup(collection: Any) -> None:
    delete = getattr(collection, "delete", None)
    if callable(delete):
        try:
            delete()
        except Exception as exc:  # noqa: BLE001 - the temporary dataset is not worth failing for
            log.warning("could not delete the temporary FiftyOne dataset: %s", exc)


def _default_api(token: str) -> Any:
    from huggingface_hub import HfApi

    return HfApi(token=token)


def publish_fiftyone(
    root: str | Path,
    repo_id: str,
    *,
    private: bool = False,
    token_env: str = DEFAULT_TOKEN_ENV,
    dry_run: bool = False,
    include_unsplit: bool = False,
    name: str | None = None,
    builder: Builder | None = None,
    pusher: Pusher | None = None,
    api_factory: Callable[[str], Any] | None = None,
) -> FiftyOnePublishResult:
    """Publish the dataset's FiftyOne view to ``repo_id`` (see the module docstring).

    ``name`` is the FiftyOne dataset name (default: dataset.yaml's name). A dry run selects and
    reports without a token, MongoDB or the network.
    """
    from curate.store import Dataset

    check_repo_id(repo_id)
    owner, repo_name = repo_id.split("/", 1)
    ds = Dataset.open(root)
    selection = select_rows(ds, include_unsplit=include_unsplit)
    if not selection.rows:
        raise PublishError(f"{ds.root}: nothing to publish (run `curate split`, or pass --include-unsplit)")
    licence = card_licence(selection.rows, attribution_file=ATTRIBUTION_FILE)
    result = FiftyOnePublishResult(repo_id, hub_url(repo_id), len(selection.rows), licence, selection.excluded, False)
    if dry_run:
        return result
    token = read_token(token_env)
    api = (api_factory or _default_api)(token)
    try:
        user = api.whoami()["name"]
    except Exception as exc:  # noqa: BLE001
        raise PublishError(f"the Hub did not accept the token in ${token_env}: {scrub(str(exc), [token])}") from None
    if user != owner:
        raise PublishError(f"FiftyOne's push_to_hub publishes under the token's user {user!r}, not {owner!r}; "
                           f"use --repo {user}/{repo_name} (or --format hub, which can publish to an organisation)")
    tags = list(TAGS) + ["fiftyone"] + (["non-commercial"] if licence.non_commercial else [])
    extra = {} if licence.license != "other" else {"license_name": licence.license_name}
    collection = (builder or default_builder)(ds.root, [r["sample_id"] for r in selection.rows], name or ds.name)
    try:
        (pusher or default_pusher)(
            collection, repo_name, description=fiftyone_description(ds.name, selection, licence),
            license=licence.license, tags=tags, private=private, exist_ok=True, token=token, **extra,
        )
    except Exception as exc:  # noqa: BLE001 - the Hub boundary: one clear, token-free message
        raise PublishError(f"FiftyOne's push_to_hub to {repo_id} failed: {type(exc).__name__}: "
                           f"{scrub(str(exc), [token])}") from None
    finally:
        if builder is None:
            _cleanup(collection)
    log.info("published %d samples to %s through FiftyOne", len(selection.rows), result.url)
    result.pushed = True
    return result
