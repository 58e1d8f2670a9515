"""``curate collect inat|coco|folder|composite|status``: the collectors' verbs (thin shells).

Each verb parses options, calls one library function of :mod:`curate.collect` with a progress
callback, and prints a per-class table. Ctrl-C stops cleanly: the job's journal keeps every
committed item and running the same command again resumes.
"""
from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import click
from rich.markup import escape
from rich.table import Table

from curate.cli import err, out, progress
from curate.cli.collect import collect
from curate.cli.options import (
    CLIP_ONLY,
    UserPath,
    creation_vocabulary,
    mask_trust_option,
    model_options,
    one_model_spec,
)

_RATE_HELP = "'none' for no limit"


@contextmanager
def _bar(description: str, total: int | None) -> Iterator[Callable[[str, int, int | None], None]]:
    """A rich progress bar; yields ``update(label, done, total)`` (the engine's progress signature).

    The bar opens on the first update: a request the library refuses before any work (a bad
    source, an unknown class) prints its one error line and no progress line. The current label
    (a class, a split) follows the description, dimmed on a terminal and as plain text where
    stderr is a log file or a pipe (no rich markup there)."""
    with ExitStack() as stack:
        opened: list[tuple[Any, Any]] = []
        state: dict[str, int] = {}

        def update(label: str, done: int, target: int | None) -> None:
            if not opened:
                bar = stack.enter_context(progress())
                opened.append((bar, bar.add_task(description, total=total)))
            bar, task = opened[0]
            if label == "importing":  # one overall count (folder imports)
                bar.update(task, completed=done, total=target)
                return
            state[label] = min(done, target) if target is not None else done
            shown = f"{description} {label}" if getattr(bar, "plain", True) else f"{description} [dim]{escape(label)}[/]"
            bar.update(task, completed=sum(state.values()), total=total, description=shown)

        yield update


@contextmanager
def _interruptible() -> Iterator[None]:
    try:
        yield
    except KeyboardInterrupt:
        err().print("[yellow]interrupted[/]: everything committed is kept; run the same command again to resume")
        sys.exit(130)


def _report_table(report: Any, extra_columns: dict[str, dict[str, str]] | None = None, *,
                  heading: str = "class") -> Table:
    """One row per group of the job; ``heading`` names what a group is (a class; a split for `collect hub`)."""
    table = Table(title=f"{report.kind} job {report.job_id}", title_justify="left", show_edge=False)
    table.add_column(heading)
    for name in (extra_columns or {}):
        table.add_column(name)
    table.add_column("have", justify="right")
    for outcome in ("added", "present", "duplicate", "quarantined", "failed", "skipped"):
        table.add_column(outcome, justify="right")
    table.add_column("note")
    for group in report.groups.values():
        have = f"{group.have}/{group.target}" if group.target is not None else str(group.have)
        note = "exhausted" if group.exhausted and group.target is not None and group.have < group.target else ""
        dup = group.outcomes.get("duplicate", 0) + group.outcomes.get("duplicate_source", 0)
        cells = [extra.get(group.group, "") for extra in (extra_columns or {}).values()]
        table.add_row(group.label, *cells, have, *(str(group.outcomes.get(k, 0) or "") for k in ("added", "present")),
                      str(dup or ""), *(str(group.outcomes.get(k, 0) or "") for k in ("quarantined", "failed", "skipped")),
                      note)
    return table


def _print_report(report: Any, extra_columns: dict[str, dict[str, str]] | None = None, *,
                  heading: str = "class") -> None:
    out().print(_report_table(report, extra_columns, heading=heading))
    out().print(f"{report} in {report.seconds:.1f} s; journal {report.journal}")
    if report.added:
        from curate.store.validate import licence_warning

        note = licence_warning(report.dataset, report.added)
        if note:
            err().print("[yellow]warning:[/] ", end="")
            err().print(note, markup=False, highlight=False)
    if report.client:
        c = report.client
        out().print(f"HTTP: {c.get('api_calls', 0)} API calls, {c.get('downloads', 0)} downloads "
                    f"({c.get('bytes', 0) / 1e6:.1f} MB counted), {c.get('retries', 0)} retries, "
                    f"{c.get('throttled', 0)} throttled")
    if report.failures:
        err().print(f"[yellow]{len(report.failures)} item(s) failed or were quarantined[/] "
                    "(`curate collect status DIR --failures` lists them all):")
        for key, reason in report.failures[:8]:
            err().print(f"  {key}: {reason}")
    unfinished = [g for g in report.incomplete if not g.exhausted]
    if unfinished:
        err().print(f"[yellow]{len(unfinished)} class(es) are short of their target[/]; run the same command "
                    "again to retry what failed")


#: The helpers above under public names, for the other collect verbs' modules (collect_hub, ...).
collect_bar, interruptible, print_collect_report = _bar, _interruptible, _print_report


def _pairs(values: tuple[str, ...], option: str) -> dict[str, str]:
    parsed: dict[str, str] = {}
    for value in values:
        key, sep, rest = value.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"{value!r}: write KEY=VALUE", param_hint=option)
        parsed[key.strip()] = rest.strip()
    return parsed


def _timeout(seconds: float) -> tuple[float, float]:
    return (min(10.0, seconds), seconds)


# ------------------------------------------------------------------------------------------
# inat
# ------------------------------------------------------------------------------------------


@collect.command("inat")
@click.argument("directory", type=UserPath(path_type=Path))
@click.option("--classes", help="Comma-separated ImageNet-1K indices, names or WordNet ids (e.g. 9,10,ostrich).")
@click.option("--recipe", help="A recipe YAML (or its name in datasets/, e.g. counteranimal): classes and taxa.")
@click.option("--per-class", type=int, help="Photos per class (default: the recipe's per_class, else 300).")
@click.option("--taxon", "taxa", multiple=True, metavar="CLASS=TAXON",
              help="Override a class's iNaturalist taxon: 16=Pycnonotidae, 23=Aegypiinae+Cathartidae, 30=60813.")
@click.option("--quality-grade", type=click.Choice(["research", "needs_id", "casual", "any"]), default="research",
              show_default=True)
@click.option("--licenses", default="cc0,cc-by,cc-by-nc", show_default=True,
              help="Accepted photo licences, among iNaturalist's cc0, cc-by, cc-by-nc, cc-by-sa, cc-by-nc-sa (ND and "
                   "all-rights-reserved need the next flag; iNaturalist has no pd or us-gov).")
@click.option("--allow-restricted-licenses", is_flag=True,
              help="Allow cc-by-nd, cc-by-nc-nd and all-rights-reserved photos (only if you have the rights).")
@click.option("--photos-per-observation", type=int, default=1, show_default=True)
@click.option("--photo-size", type=click.Choice(["square", "small", "medium", "large", "original"]), default="medium",
              show_default=True)
@click.option("--api-url", default="https://api.inaturalist.org/v1", show_default=True)
@click.option("--photo-host", "photo_hosts", multiple=True,
              help="Another host photos may be downloaded from ('*' = any); iNaturalist's and the API's are allowed.")
@click.option("--param", "params", multiple=True, metavar="KEY=VALUE",
              help="Extra /observations filters, e.g. place_id=97394 or d1=2020-01-01.")
@click.option("--per-page", type=int, default=200, show_default=True, help="Observations per API request (max 200).")
@click.option("--order", type=click.Choice(["desc", "asc"]), default="desc", show_default=True,
              help="desc: the latest observations (pages with id_below); asc: the oldest (id_above).")
@click.option("--api-rate", default="60/min,10000/day", show_default=True, help=f"API request limits; {_RATE_HELP}.")
@click.option("--download-rate", default="10/s", show_default=True, help=f"Photo request limits; {_RATE_HELP}.")
@click.option("--byte-rate", default="5GB/hour,24GB/day", show_default=True, help=f"Download volume limits; {_RATE_HELP}.")
@click.option("--concurrency", type=int, default=4, show_default=True, help="Parallel downloads.")
@click.option("--contact", help="An e-mail or URL put in the User-Agent (iNaturalist asks clients to identify).")
@click.option("--timeout", type=float, default=60.0, show_default=True, help="Read timeout per request (s).")
@click.option("--retries", type=int, default=6, show_default=True, help="Attempts per request.")
@click.option("--retry-backoff", type=float, default=1.0, show_default=True,
              help="First backoff (s); doubles per attempt, capped at 60 s.")
@click.option("--name", help="Dataset name when creating it (default: the folder's name).")
@click.option("--resolve-only", is_flag=True, help="Resolve and print the taxa, download nothing.")
@click.option("--fill", "fill_split", metavar="RUN",
              help="Fill the thin groups of split run RUN: photos steered to the group's places and months, proposed "
                   "for review (see `curate plan`).")
@click.option("--class", "fill_classes", multiple=True, type=int, help="With --fill: only these class indices.")
@click.option("--group", "fill_group_name", type=click.Choice(["hard", "easy"]), default="hard", show_default=True,
              help="With --fill: the group to fill.")
@click.option("--n", "fill_n", type=int, help="With --fill: photos per class (default: what `curate plan` says).")
@click.option("--half-width", "fill_half_width", type=float, default=5.0, show_default=True,
              help="With --fill and no --n: the plan's target half-width, in points.")
@click.option("--over-fetch", type=float, default=3.0, show_default=True,
              help="With --fill: candidates listed and scored per photo added.")
@click.option("--steer/--no-steer", default=True, show_default=True,
              help="With --fill: steer the query by the group's provenance (--no-steer: the newest photos).")
@model_options(required=False, accepts=CLIP_ONLY)
def collect_inat_cmd(directory: Path, classes: str | None, recipe: str | None, per_class: int | None,
                     taxa: tuple[str, ...], quality_grade: str, licenses: str, allow_restricted_licenses: bool,
                     photos_per_observation: int, photo_size: str, api_url: str, photo_hosts: tuple[str, ...],
                     params: tuple[str, ...], per_page: int, order: str, api_rate: str, download_rate: str, byte_rate: str,
                     concurrency: int, contact: str | None, timeout: float, retries: int, retry_backoff: float,
                     name: str | None, resolve_only: bool, fill_split: str | None = None,
                     fill_classes: tuple[int, ...] = (), fill_group_name: str = "hard", fill_n: int | None = None,
                     fill_half_width: float = 5.0, over_fetch: float = 3.0, steer: bool = True,
                     model: str | None = None, pretrained: str | None = None) -> None:
    """Collect the latest iNaturalist photos of ImageNet-1K classes (resumable, rate-limited).

    With --fill, --model (a CLIP) ranks the over-fetched candidates by their background embedding
    instead of by place and month."""
    from dataclasses import replace

    from curate.collect.http import RetryPolicy
    from curate.collect.inat import (
        classes_from_text,
        collect_inat,
        load_recipe,
        make_client,
        parse_taxon_overrides,
    )

    if (model or pretrained) and not fill_split:
        raise click.UsageError("--model scores --fill candidates; give --fill RUN")
    if fill_split:
        scorer = one_model_spec(model, pretrained) if (model or pretrained) else None
        client = make_client(api_url=api_url, photo_hosts=photo_hosts, api_rate=api_rate, download_rate=download_rate,
                             byte_rate=byte_rate, contact=contact, timeout=_timeout(timeout),
                             retry=RetryPolicy(max_attempts=max(1, retries), backoff_base=retry_backoff))
        try:
            _fill(directory, fill_split, fill_classes, fill_group_name, fill_n, fill_half_width / 100, over_fetch,
                  steer, client=client, api_url=api_url, licenses=licenses,
                  allow_restricted_licenses=allow_restricted_licenses, photo_size=photo_size, per_page=per_page,
                  concurrency=concurrency, taxa=parse_taxon_overrides(taxa), model=scorer)
        finally:
            client.close()
        return
    if bool(classes) == bool(recipe):
        raise click.UsageError("give --classes or --recipe (one of them)")
    recipe_data: dict[str, Any] = {}
    if recipe:
        chosen, recipe_data = load_recipe(recipe)
    else:
        chosen = classes_from_text(classes or "")
    overrides = parse_taxon_overrides(taxa)
    unknown = sorted(set(overrides) - {c.index for c in chosen})
    if unknown:
        raise click.BadParameter(f"classes {unknown} are not being collected", param_hint="--taxon")
    chosen = [replace(c, taxon=overrides[c.index]) if c.index in overrides else c for c in chosen]
    collection = recipe_data.get("collection") or {}
    target = per_class if per_class is not None else int(collection.get("per_class", 300))
    if "api.inaturalist.org" in api_url and not contact:
        err().print("[dim]tip: pass --contact you@example.org so iNaturalist can reach you about your traffic[/]")
    client = make_client(api_url=api_url, photo_hosts=photo_hosts, api_rate=api_rate, download_rate=download_rate,
                         byte_rate=byte_rate, contact=contact, timeout=_timeout(timeout),
                         retry=RetryPolicy(max_attempts=max(1, retries), backoff_base=retry_backoff))
    backgrounds = recipe_data.get("backgrounds") if isinstance(recipe_data.get("backgrounds"), list) else None
    try:
        with _interruptible(), _bar("collecting", None if resolve_only else target * len(chosen)) as update:
            report = collect_inat(
                directory, chosen, per_class=target, quality_grade=quality_grade, licenses=licenses,
                allow_restricted_licenses=allow_restricted_licenses, photos_per_observation=photos_per_observation,
                photo_size=photo_size, api_url=api_url, params=_pairs(params, "--param"), per_page=per_page, order=order,
                client=client, concurrency=concurrency, name=name, recipe=recipe_data.get("name") if recipe else None,
                backgrounds=backgrounds, resolve_only=resolve_only, progress=update)
    finally:
        client.close()
    taxa_column = {}
    for cls in chosen:
        info = report.info["taxa"].get(str(cls.index)) or {}
        taxa_column[cls.group] = " + ".join(f"{n} ({i})" for n, i in zip(info.get("names", []), info.get("ids", [])))
    if resolve_only:
        table = Table(title="iNaturalist taxa", title_justify="left", show_edge=False)
        for column in ("class", "taxon (id)", "via", "tried"):
            table.add_column(column)
        for cls in chosen:
            info = report.info["taxa"][str(cls.index)]
            table.add_row(cls.label, taxa_column[cls.group], info["via"], ", ".join(info["queries"]))
        out().print(table)
        return
    _print_report(report, {"taxon": taxa_column})


def _fill(directory: Path, split: str, classes: tuple[int, ...], group: str, n: int | None, half_width: float,
          over_fetch: float, steer: bool, **kwargs: Any) -> None:
    """``collect inat --fill``: :func:`curate.collect.fill.fill_group` over what the plan says is missing."""
    from curate.collect.fill import fill_group, fill_table, wanted_from_split
    from curate.shell import suggest

    wanted = wanted_from_split(directory, split, group=group, classes=classes, n=n, half_width=half_width)
    if not wanted:
        out().print(f"no class of split {split} needs {group} photos for +-{100 * half_width:g} points")
        return
    with _interruptible(), _bar(f"filling {group}", sum(wanted.values())) as update:
        report = fill_group(directory, wanted, group=group, split=split, steer=steer, over_fetch=over_fetch,
                            progress=update, **kwargs)
    ranked = {"embedding": f"ranked by background embedding ({kwargs['model'].label})" if kwargs.get("model") else "",
              "place-month": "ranked by place and month (give --model to rank by background embedding)",
              "none": "newest first"}[report.scored_by]
    table = Table(title=f"proposed for {group} (split {split}; {'steered' if steer else 'unsteered'}; {ranked})",
                  title_justify="left", show_edge=False)
    columns, rows = fill_table(report)
    for column in columns:
        table.add_column(column, justify="left" if column in ("class", "places") else "right")
    for row in rows:
        table.add_row(*row)
    out().print(table)
    review = suggest("curate review fiftyone {dir} --launch", dir=directory)
    where = ('; the view "proposed for hard" (FiftyOne; Label Studio: --view "proposed for hard") lists them'
             if group == "hard" else "")
    out().print(f"the new photos are candidates tagged proposed:{group}: review their background as usual "
                f"(`{review}`){where}")


# ------------------------------------------------------------------------------------------
# coco
# ------------------------------------------------------------------------------------------


@collect.command("coco")
@click.argument("directory", type=UserPath(path_type=Path))
@click.option("--annotations", required=True, type=UserPath(path_type=Path, exists=True, dir_okay=False),
              help="A COCO instances JSON (e.g. instances_val2017.json).")
@click.option("--images-root", type=UserPath(path_type=Path, exists=True, file_okay=False),
              help="Folder holding the images (file_name is joined to it).")
@click.option("--image-url-base", help="Fetch images from URL + file_name (e.g. http://images.cocodataset.org/val2017/).")
@click.option("--use-image-urls", is_flag=True, help="Fetch each image from its coco_url.")
@click.option("--categories", help="Comma-separated category names or ids (default: all).")
@click.option("--mapping", help="Map to ImageNet-1K with a mapping file (e.g. coco_to_imagenet from datasets/).")
@click.option("--include-crowd", is_flag=True, help="Put crowd regions into the union mask (excluded by default).")
@click.option("--no-instance-masks", is_flag=True, help="Do not write masks/instances/<sample_id>.png.")
@click.option("--per-category", type=int, help="At most this many images per category.")
@click.option("--multi", type=click.Choice(["largest", "skip"]), default="largest", show_default=True,
              help="An image with several chosen categories: take it for the largest one, or skip it.")
@click.option("--min-area", type=float, default=0.0, show_default=True,
              help="Skip images whose objects cover less than this fraction of the image.")
@click.option("--image-host", "image_hosts", multiple=True, help="Another host images may come from ('*' = any).")
@click.option("--download-rate", default="10/s", show_default=True, help=f"Image request limits; {_RATE_HELP}.")
@click.option("--byte-rate", default="5GB/hour,24GB/day", show_default=True, help=f"Download volume limits; {_RATE_HELP}.")
@click.option("--concurrency", type=int, default=4, show_default=True)
@click.option("--name", help="Dataset name when creating it.")
def collect_coco_cmd(directory: Path, annotations: Path, images_root: Path | None, image_url_base: str | None,
                     use_image_urls: bool, categories: str | None, mapping: str | None, include_crowd: bool,
                     no_instance_masks: bool, per_category: int | None, multi: str, min_area: float,
                     image_hosts: tuple[str, ...], download_rate: str, byte_rate: str, concurrency: int,
                     name: str | None) -> None:
    """Collect COCO images of chosen categories with union and per-instance masks."""
    from curate.collect.coco import collect_coco

    chosen = [c.strip() for c in categories.split(",") if c.strip()] if categories else None
    with _interruptible(), _bar("collecting", None) as update:
        report = collect_coco(directory, annotations, images_root=images_root, image_url_base=image_url_base,
                              use_image_urls=use_image_urls, categories=chosen, mapping=mapping,
                              include_crowd=include_crowd, write_instance_masks=not no_instance_masks,
                              per_category=per_category, multi=multi, min_area=min_area, image_hosts=image_hosts,
                              download_rate=download_rate, byte_rate=byte_rate, concurrency=concurrency, name=name,
                              progress=update)
    _print_report(report)


# ------------------------------------------------------------------------------------------
# folder
# ------------------------------------------------------------------------------------------


@collect.command("folder")
@click.argument("directory", type=UserPath(path_type=Path))
@click.argument("src", type=UserPath(path_type=Path, exists=True, file_okay=False))
@click.option("--layout", type=click.Choice(["imagefolder", "counteranimal"]), default="imagefolder", show_default=True)
@click.option("--licenses-csv", type=UserPath(path_type=Path, exists=True, dir_okay=False),
              help="CSV with columns path,license,attribution (paths relative to SRC).")
@click.option("--license", "license_", help="Licence of files the CSV does not list (e.g. cc-by).")
@click.option("--attribution", help="Attribution of files the CSV does not list.")
@click.option("--status", type=click.Choice(["candidate", "accepted", "rejected"]),
              help="Status of the new samples (default: accepted for counteranimal, else candidate).")
@click.option("--label-space", default="imagenet1k", show_default=True,
              help="When creating the dataset: 'imagenet1k' or a text file with one class name per line. An existing "
                   "dataset (e.g. from `curate create`) keeps its own; naming another is an error.")
@click.option("--backgrounds", help="When creating the dataset: comma-separated background vocabulary. An existing "
                                    "dataset keeps its own; naming backgrounds it lacks is an error.")
@click.option("--concurrency", type=int, default=4, show_default=True)
@click.option("--name", help="Dataset name when creating it.")
def collect_folder_cmd(directory: Path, src: Path, layout: str, licenses_csv: Path | None, license_: str | None,
                       attribution: str | None, status: str | None, label_space: str, backgrounds: str | None,
                       concurrency: int, name: str | None) -> None:
    """Import an ImageFolder or the released CounterAnimal layout (easy-/hard-<background>) into
    DIRECTORY: a new folder, or a dataset folder that exists (e.g. from `curate create`), which it adds to."""
    from curate.collect.folder import import_folder

    space, vocab = creation_vocabulary(label_space, backgrounds)
    with _interruptible(), _bar("importing", None) as update:
        report = import_folder(src, directory, layout, label_space=space, licenses_csv=licenses_csv,
                               license=license_, attribution=attribution, status=status, name=name,
                               backgrounds=vocab, concurrency=concurrency, progress=update)
    _print_report(report)
    skipped = report.info.get("skipped_files") or []
    if skipped:
        err().print(f"[yellow]{len(skipped)} file(s) left out[/]: " + "; ".join(skipped[:5])
                    + (" ..." if len(skipped) > 5 else ""))


# ------------------------------------------------------------------------------------------
# composite
# ------------------------------------------------------------------------------------------


@collect.command("composite")
@click.argument("directory", type=UserPath(path_type=Path))
@click.option("--objects", "objects_root", required=True, type=UserPath(path_type=Path, exists=True, file_okay=False),
              help="A dataset folder whose samples have masks (e.g. from `collect coco`).")
@click.option("--colors", help="Solid background colours: names or name=#rrggbb (default: ten ColoredCOCO-like colours).")
@click.option("--backgrounds-from", type=UserPath(path_type=Path, exists=True, file_okay=False),
              help="A dataset folder of background images with `background` labels (instead of colours).")
@click.option("--p", "p", type=float, default=0.8, show_default=True,
              help="Probability of a class's common background (the planted correlation).")
@click.option("--common", "common", multiple=True, metavar="CLASS=BACKGROUND",
              help="A class's common background (default: classes in index order take backgrounds in order).")
@click.option("--others", help="Comma-separated backgrounds the other (1 - p) composites use (default: all others).")
@click.option("--per-class", type=int, help="Composites per class (default: one per object).")
@click.option("--classes", help="Comma-separated class indices or names to use (default: all with masks).")
@click.option("--size", type=int, help="Square output size in pixels (default: each object's own size).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--binomial", is_flag=True, help="Draw each composite's background independently (default: exactly round(p*n) aligned).")
@click.option("--allow-restricted-licenses", is_flag=True, help="Allow objects whose licence forbids derivatives.")
@mask_trust_option
@click.option("--name", help="Dataset name when creating it.")
def collect_composite_cmd(directory: Path, objects_root: Path, colors: str | None, backgrounds_from: Path | None,
                          p: float, common: tuple[str, ...], others: str | None, per_class: int | None,
                          classes: str | None, size: int | None, seed: int, binomial: bool,
                          allow_restricted_licenses: bool, allow_model_masks: bool, name: str | None) -> None:
    """Paste masked objects onto colours or background images with a planted correlation p."""
    from curate.collect.composite import CompositeSpec, compose
    from curate.masks.sources import MaskCounts
    from curate.store import Dataset

    if colors and backgrounds_from:
        raise click.UsageError("give --colors or --backgrounds-from, not both")
    space = Dataset.open(objects_root).label_space
    common_map = tuple(sorted((space.resolve(k), v) for k, v in _pairs(common, "--common").items()))
    chosen = tuple(space.resolve(c.strip()) for c in classes.split(",") if c.strip()) if classes else None
    spec = CompositeSpec(
        p=p, colors=tuple(c.strip() for c in colors.split(",") if c.strip()) if colors else None,
        backgrounds_root=str(backgrounds_from) if backgrounds_from else None, common=common_map,
        others=tuple(o.strip() for o in others.split(",") if o.strip()) if others else None, per_class=per_class,
        classes=chosen, size=size, seed=seed, exact=not binomial, allow_restricted_licenses=allow_restricted_licenses,
        allow_model_masks=allow_model_masks)
    with _interruptible(), _bar("compositing", None) as update:
        report = compose(objects_root, directory, spec, name=name, progress=update)
    _print_report(report)
    for cls, info in sorted(report.info.get("aligned", {}).items(), key=lambda kv: int(kv[0])):
        out().print(f"class {cls}: {info['aligned']}/{info['total']} on its common background "
                    f"(p = {info['p']:.3f})")
    out().print(f"objects' {MaskCounts.from_dict(report.info.get('masks')).line()}"
                + ("; their composites keep mask_status model:<id>" if report.info.get("masks", {}).get("model") else ""))


# ------------------------------------------------------------------------------------------
# status
# ------------------------------------------------------------------------------------------


@collect.command("status")
@click.argument("directory", type=UserPath(path_type=Path, exists=True, file_okay=False))
@click.option("--failures", "show_failures", is_flag=True, help="List every failed or quarantined item.")
def collect_status_cmd(directory: Path, show_failures: bool) -> None:
    """The collection jobs of a dataset: outcomes per job, and (with --failures) what failed and why."""
    from collections import Counter

    from curate.collect.journal import collection_failures, read_journals

    journals = read_journals(directory)
    if not journals:
        out().print(f"{directory}: no collection jobs")
        return
    table = Table(title="collection jobs", title_justify="left", show_edge=False)
    for column in ("journal", "classes", "added", "present", "duplicate", "quarantined", "failed", "skipped"):
        table.add_column(column, justify="left" if column == "journal" else "right")
    for name, records in journals.items():
        last: dict[str, dict[str, Any]] = {}
        for record in records:
            if record.get("t") == "item":
                last[str(record.get("key"))] = record
        counts = Counter(r.get("outcome") for r in last.values())
        groups = {str(r.get("group")) for r in last.values()}
        dup = counts.get("duplicate", 0) + counts.get("duplicate_source", 0)
        table.add_row(name, str(len(groups)), *(str(counts.get(k, 0)) for k in ("added", "present")), str(dup),
                      *(str(counts.get(k, 0)) for k in ("quarantined", "failed", "skipped")))
    out().print(table)
    failures = collection_failures(directory)
    if show_failures:
        for record in failures:
            retry = " (retried on the next run)" if record.get("retryable") else ""
            out().print(f"{record['job']} {record['key']}: {record.get('outcome')} {record.get('reason')}"
                        f"{': ' + record['detail'] if record.get('detail') else ''}{retry}")
    elif failures:
        out().print(f"{len(failures)} failed or quarantined item(s); --failures lists them")
