"""The dataset card (``README.md``): YAML metadata through huggingface_hub's ``DatasetCard`` and a
body that says what the set is, how to load it, its licences, how it was built and how to cite it.

Metadata: ``license`` (:mod:`curate.licenses`; ``license_name`` / ``license_link`` for
``other``), ``pretty_name``, ``task_categories``, ``size_categories``, ``tags`` (with
``non-commercial`` when any image is NC), ``configs`` (the ``default`` config, one split per
group: :mod:`curate.publish.layout`) and ``dataset_info`` (features, splits, sizes), as ``datasets``'
own ``push_to_hub`` writes them.

Body: summary and loading snippet; licences (NC notice, per-licence table, what was left out
and why, the attribution file); fields; the per-class table (published counts, easy and hard
backgrounds, the reference model's accuracies and drop with its interval); how it was built
(collection query, curation rules and counts, the split rule, reference model and numbers, the
tool version, the provenance recorded in ``dataset.yaml``); the CounterAnimal citation.
Local absolute paths in the provenance (weights files, work folders) are reduced to file names.
"""
from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from curate import __version__
from curate.formatting import md_table
from curate.licenses import EXCLUSION_REASONS, CardLicence
from curate.publish.layout import ATTRIBUTION_FILE, COLUMN_DOCS
from curate.store.mask_sources import mask_source

if TYPE_CHECKING:  # pragma: no cover
    from datasets import Features
    from huggingface_hub import DatasetCard

    from curate.publish.layout import Selection, Shard
    from curate.store import Dataset

log = logging.getLogger(__name__)

COUNTERANIMAL_BIBTEX = """@inproceedings{wang2024sober,
  title     = {A Sober Look at the Robustness of {CLIP}s to Spurious Features},
  author    = {Wang, Qizhou and Lin, Yong and Chen, Yongqiang and Schmidt, Ludwig and Han, Bo and Zhang, Tong},
  booktitle = {Advances in Neural Information Processing Systems (NeurIPS)},
  year      = {2024},
  url       = {https://counteranimal.github.io/}
}"""

TAGS: tuple[str, ...] = ("curate", "counteranimal", "spurious-correlations", "robustness", "clip", "zero-shot")
COLLECTION_STAGES: tuple[str, ...] = ("collect.inat", "collect.coco", "collect.folder", "collect.composite", "synthetic")


def size_category(n: int) -> str:
    """The Hub's ``size_categories`` bucket for ``n`` rows."""
    for limit, name in ((1_000, "n<1K"), (10_000, "1K<n<10K"), (100_000, "10K<n<100K"), (1_000_000, "100K<n<1M")):
        if n < limit:
            return name
    return "n>1M"


def public_value(value: Any) -> Any:
    """``value`` with absolute local paths reduced to their file names (recursively)."""
    if isinstance(value, str):
        if value.startswith(("/", "~")) or (len(value) > 2 and value[1] == ":" and value[2] in "\\/"):
            return Path(value.replace("\\", "/")).name
        return value
    if isinstance(value, Mapping):
        return {k: public_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [public_value(v) for v in value]
    return value


def _pct(x: Any) -> str:
    try:
        value = float(x)
    except (TypeError, ValueError):
        return "—"
    return "—" if not math.isfinite(value) else f"{100 * value:.1f}"


def _yaml_block(value: Any) -> str:
    text = yaml.safe_dump(public_value(value), sort_keys=False, allow_unicode=True, width=100).rstrip()
    return f"```yaml\n{text}\n```"


def _details(summary: str, body: str) -> str:
    return f"<details>\n<summary>{summary}</summary>\n\n{body}\n\n</details>"


def split_classes(ds: Dataset) -> dict[int, dict[str, Any]]:
    """The split run's per-class decisions (:class:`curate.runs.SplitRun` rows as dicts: ``easy``,
    ``hard``, ``easy_acc``, ``hard_acc``, ``drop``, ``drop_ci``, ``crossfit_drop``, ``p_value``, ...),
    by class index; empty when no readable split run is recorded."""
    from curate.runs import RUNS_DIR, RunError
    from curate.runs.split import SplitRun

    run = (ds.provenance.get("split") or {}).get("run")
    if not run:
        return {}
    try:
        record = SplitRun.load(ds.root / RUNS_DIR / str(run))
    except RunError as exc:
        log.warning("cannot read the split run %s (%s); the card's per-class table has no accuracies", run, exc)
        return {}
    return {c.class_index: c.to_dict() for c in record.classes}


def per_class_rows(ds: Dataset, selection: Selection, labels: Sequence[str]) -> tuple[list[str], list[list[Any]]]:
    """The per-class table: label, label-space index, easy/hard backgrounds, published counts,
    and the reference model's easy/hard accuracy and drop (with its interval) from the split."""
    decisions = split_classes(ds)
    counts: Counter[tuple[int, str]] = Counter()
    backgrounds: dict[tuple[int, str], Counter[str]] = {}
    for r in selection.rows:
        key = (int(r["class_index"]), r["split"])
        counts[key] += 1
        backgrounds.setdefault(key, Counter())[r["background"] or "—"] += 1
    indices = sorted({int(r["class_index"]) for r in selection.rows})
    with_other = any(r["split"] == "other" for r in selection.rows)
    header = ["label", "class (index)", "easy background", "hard background", "easy images", "hard images"]
    header += ["other images"] if with_other else []
    header += ["reference easy acc. (%)", "reference hard acc. (%)", "drop (points) [95% CI]"]
    def bkg(decision: Mapping[str, Any], c: int, group: str) -> str:
        if decision.get(group):
            return str(decision[group])
        seen = backgrounds.get((c, group))
        return ", ".join(sorted(seen)) if seen else "—"

    rows = []
    for k, c in enumerate(indices):
        d = decisions.get(c, {})
        ci = d.get("drop_ci") or [None, None]
        drop = f"{_pct(d.get('drop'))} [{_pct(ci[0])}, {_pct(ci[1])}]" if d else "—"
        row = [f"{k}: {labels[k]}", f"{ds.label_space.names[c]} ({c})", bkg(d, c, "easy"), bkg(d, c, "hard"),
               counts[(c, "easy")], counts[(c, "hard")]]
        row += [counts[(c, "other")]] if with_other else []
        row += [_pct(d.get("easy_acc")) if d else "—", _pct(d.get("hard_acc")) if d else "—", drop]
        rows.append(row)
    return header, rows


# ----------------------------------------------------------------------------- sections
def _summary(ds: Dataset, selection: Selection, repo_id: str | None, licence: CardLicence, classes: int) -> str:
    counts = selection.split_counts()
    repo = repo_id or f"<owner>/{ds.name}"
    splits = " + ".join(f"{n} {s}" for s, n in counts.items())
    lines = [f"# {ds.name}", ""]
    if licence.non_commercial:
        lines += ["> **Non-commercial use only.** Some images are licensed CC BY-NC or BY-NC-SA, so the dataset as a "
                  "whole may be used for non-commercial purposes only. Each image's licence is in its `license` column.",
                  ""]
    lines += [
        f"A CounterAnimal-style benchmark of spurious background features (Wang et al., NeurIPS 2024), built with "
        f"curate {__version__}: {classes} classes, {sum(counts.values())} images "
        f"({splits}). For each class, the **easy** group shows the animal on the background where a reference CLIP "
        f"classifies it well and the **hard** group on the background where it fails; the accuracy drop from easy "
        f"to hard measures how much a model relies on the background.",
        "",
        "## Loading",
        "",
        "```python",
        "from datasets import load_dataset",
        "",
        f'ds = load_dataset("{repo}")                          # DatasetDict: ' + ", ".join(counts),
        f'hard = load_dataset("{repo}", split="hard")          # one group',
        f'both = load_dataset("{repo}", split="easy+hard")     # the whole benchmark as one Dataset',
        'names = ds["easy"].features["label"].names               # class names; `class_index` indexes the label space',
        "```",
        "",
        "One config (`default`); its splits are the groups: `easy` and `hard`"
        + (" and `other` (accepted images outside the split)." if "other" in counts else "."),
        f"`label` is a `ClassLabel` over the published classes; `class_index` is the class's index in the label space "
        f"`{ds.label_space.name}` ({len(ds.label_space)} classes), the candidate set of the paper's 1-vs-1000 "
        "evaluation when that is ImageNet-1K. `mask` holds the object mask when there is one.",
    ]
    return "\n".join(lines)


def _licences(selection: Selection, licence: CardLicence, attribution_file: str) -> str:
    total = sum(licence.counts.values())
    lines = ["## Licences", ""]
    if licence.license == "other":
        what = ("public domain" if licence.license_name == "public-domain" else
                "several licences, none of which covers all the others, so the card's licence is `other`")
        lines.append(f"The images carry {what}; each image's licence is in its `license` column and in "
                     f"`{attribution_file}`.")
    else:
        lines.append(f"The card's licence, `{licence.license}`, is the most restrictive licence present "
                     f"(`{licence.most_restrictive}`); every image keeps its own licence, in its `license` column and in "
                     f"`{attribution_file}`.")
    if licence.non_commercial:
        lines.append("Because some images are non-commercial (NC), **the whole dataset is for non-commercial use only**.")
    if licence.share_alike:
        lines.append("Some images are share-alike (SA): adaptations of them must be shared under the same licence.")
    if licence.note:
        lines.append(licence.note)
    lines += ["", md_table(["licence", "images", "share"],
                           [[code, n, f"{100 * n / total:.1f}%"] for code, n in sorted(licence.counts.items(),
                                                                                         key=lambda kv: -kv[1])])]
    licence_reasons = {k: v for k, v in selection.excluded.items() if k in EXCLUSION_REASONS}
    lines += ["", f"**Attribution.** `{attribution_file}` credits every image: sample id, split, file, class, licence "
                  "(normalised and as stated), author, source, source id and URL."]
    if licence_reasons:
        lines += ["", "**Not published.** Images whose licence does not allow redistribution of derivative works are "
                      "never published:", "",
                  md_table(["reason", "images"], [[EXCLUSION_REASONS[k], n] for k, n in sorted(licence_reasons.items())])]
        if selection.excluded_licences:
            lines += ["", "By licence: " + ", ".join(f"{c} {n}" for c, n in sorted(selection.excluded_licences.items())) + "."]
    return "\n".join(lines)


def _fields(features: Features) -> str:
    rows = []
    for name, feature in features.items():
        kind = type(feature).__name__
        if kind == "Value":
            kind = f"Value({feature.dtype})"
        elif kind == "ClassLabel":
            kind = f"ClassLabel({feature.num_classes})"
        elif kind == "List":
            kind = "List(string)"
        rows.append([f"`{name}`", kind, COLUMN_DOCS.get(name, "")])
    return "## Fields\n\n" + md_table(["column", "type", "meaning"], rows)


def _structure(shards: Sequence[Shard], split_counts: Mapping[str, int], download_bytes: Mapping[str, int]) -> str:
    rows = []
    for split, n in split_counts.items():
        files = [s for s in shards if s.split == split]
        size = sum(download_bytes.get(s.path, 0) for s in files)
        rows.append([f"`{split}`", n, len(files), f"{size / 1e6:.1f} MB", f"`data/{split}-*.parquet`"])
    return "## Splits\n\n" + md_table(["split", "images", "parquet files", "size", "files"], rows)


def _built(ds: Dataset, selection: Selection) -> str:
    provenance = ds.provenance
    lines = ["## How it was built", ""]
    # collection
    sources = Counter(r["source"] for r in selection.rows)
    lines += ["### Collection", "",
              "Published images by source: " + ", ".join(f"{s} {n}" for s, n in sources.most_common()) + "."]
    stages = [s for s in COLLECTION_STAGES if s in provenance]
    stages += [s for s in provenance if s.startswith("collect.") and s not in stages]
    if ds.config.get("recipe"):
        lines.append(f"Recipe: `{public_value(ds.config['recipe'])}`.")
    for stage in stages:
        lines += ["", _details(f"collection query and settings (<code>{stage}</code>)", _yaml_block(provenance[stage]))]
    if not stages:
        lines.append("No collection settings were recorded in `dataset.yaml`.")
    # curation
    everything = ds.rows()
    statuses = Counter(r["status"] for r in everything)
    reasons = Counter(r["reject_reason"] or "unspecified" for r in everything if r["status"] == "rejected")
    bkg_sources = Counter(r["background_source"] or "none" for r in selection.rows)
    lines += ["", "### Curation", "",
              "Reviewers accept or reject each candidate image; only **accepted** images with a class are published. "
              "Rejections follow the CounterAnimal curation (papers/003 §2.1): label noise (wrong species), feature "
              "noise (pixels disrupted or missing), obscurity (more than one object class) and "
              "clarity (the animal largely occluded, or not filling most of the photo). Backgrounds come from the vocabulary "
              + ", ".join(f"`{b}`" for b in ds.backgrounds) + ".",
              "",
              "In the dataset folder: " + ", ".join(f"{n} {s}" for s, n in sorted(statuses.items())) + "."
              + (" Rejected by reason: " + ", ".join(f"{r} {n}" for r, n in reasons.most_common()) + "." if reasons else ""),
              "Background labels of the published images by source: "
              + ", ".join(f"{s} {n}" for s, n in bkg_sources.most_common()) + "."]
    mask_sources = Counter(mask_source(r) for r in selection.rows)
    if any(mask_sources[k] for k in ("human", "exact", "model", "rejected")):
        names = {"human": "drawn or verified by people", "exact": "exact (synthetic / COCO / composites)",
                 "model": "**unverified model proposals** (`mask_status = model:<id>`, curate propose-masks)",
                 "rejected": "marked bad by reviewers", None: "no mask"}
        lines += ["", "Object masks of the published images by source: "
                  + ", ".join(f"{mask_sources[k]} {names[k]}" for k in ("human", "exact", "model", "rejected", None)
                              if mask_sources[k]) + "."
                  + (" Mask-based numbers (SSS, RMA) should use only the people-made and exact ones; each row's "
                     "`mask_status` says which." if mask_sources["model"] else "")]
    if "label_backgrounds" in provenance:
        lines += ["", _details("background pre-labels (<code>label_backgrounds</code>)",
                               _yaml_block(provenance["label_backgrounds"]))]
    if "propose_masks" in provenance:
        lines += ["", _details("mask proposals (<code>propose_masks</code>)", _yaml_block(provenance["propose_masks"]))]
    other_reasons = {k: v for k, v in selection.excluded.items() if k not in EXCLUSION_REASONS}
    if other_reasons:
        lines += ["", "Not published for other reasons: "
                  + ", ".join(f"{n} {k.replace(':', ' ')}" for k, n in sorted(other_reasons.items())) + "."]
    # split
    split = provenance.get("split")
    lines += ["", "### Split (spurious discovery)", ""]
    if split:
        rule = split.get("rule") or {}
        reference = split.get("reference") or {}
        lines += [
            "For each class and each background with at least "
            f"{rule.get('min_per_background', '?')} accepted images, the reference model's zero-shot accuracy "
            f"(prompt \"{split.get('prompt', 'A photo of {}.')}\"; 1 vs the label space); easy = the background with "
            f"the highest accuracy, hard = the lowest; a class is kept when the drop exceeds "
            f"{rule.get('min_drop', '?')} points"
            + (" and is significant (95% bootstrap interval above 0 and a permutation test of the max-min gap)"
               if rule.get("require_significant") else "") + " (papers/003 §2.1).",
            "",
            md_table(["setting", "value"], [
                ["reference model", f"{public_value(reference.get('name'))} / {public_value(reference.get('pretrained'))}"
                 + (f" (`{reference.get('model_id')}`)" if reference.get("model_id") else "")],
                ["rule", ", ".join(f"{k}={v}" for k, v in rule.items())],
                ["classes kept / dropped", f"{split.get('kept_classes', '?')} / {split.get('dropped_classes', '?')}"],
                ["easy / hard images at split time", f"{split.get('easy_samples', '?')} / {split.get('hard_samples', '?')}"],
                ["pinned classes", len(split.get("pins") or {})],
                ["split run", split.get("run", "—")],
            ]),
        ]
    else:
        lines.append("No split is recorded in `dataset.yaml`.")
    # tool
    stages_run = [f"`{k}`" + (f" (curate {v.get('curate_version')}, {v.get('recorded_at', '')[:10]})"
                              if isinstance(v, Mapping) and v.get("curate_version") else "")
                  for k, v in provenance.items()]
    lines += ["", "### Tool", "",
              f"Published with curate {__version__} (dataset schema version {ds.config.get('schema_version')}, "
              f"folder created with curate {ds.config.get('curate_version', '?')}). Stages recorded: "
              + (", ".join(stages_run) if stages_run else "none") + "."]
    rest = {k: v for k, v in provenance.items() if k not in stages and k not in ("label_backgrounds",)}
    if rest:
        lines += ["", _details("all other provenance recorded in <code>dataset.yaml</code>", _yaml_block(rest))]
    return "\n".join(lines)


def _citation() -> str:
    return "\n".join([
        "## Citation", "",
        "This dataset follows the CounterAnimal benchmark; please cite the paper:", "",
        "```bibtex", COUNTERANIMAL_BIBTEX, "```",
    ])


def card_body(ds: Dataset, selection: Selection, *, licence: CardLicence, features: Features,
              labels: Sequence[str], shards: Sequence[Shard], download_bytes: Mapping[str, int],
              repo_id: str | None, attribution_file: str = ATTRIBUTION_FILE) -> str:
    """The card's Markdown body (see the module docstring)."""
    header, rows = per_class_rows(ds, selection, labels)
    sections = [
        _summary(ds, selection, repo_id, licence, len(labels)),
        _licences(selection, licence, attribution_file),
        _structure(shards, selection.split_counts(), download_bytes),
        _fields(features),
        "## Classes\n\n" + md_table(header, rows),
        _built(ds, selection),
        _citation(),
    ]
    return "\n\n".join(sections) + "\n"


def build_card(ds: Dataset, selection: Selection, *, licence: CardLicence, features: Features,
               labels: Sequence[str], shards: Sequence[Shard], split_bytes: Mapping[str, int],
               download_bytes: Mapping[str, int], repo_id: str | None) -> DatasetCard:
    """The dataset card: metadata (licence, configs, dataset_info, tags) and :func:`card_body`."""
    from datasets.info import DatasetInfo, DatasetInfosDict
    from datasets.splits import SplitDict, SplitInfo
    from datasets.utils.metadata import MetadataConfigs
    from huggingface_hub import DatasetCard, DatasetCardData

    counts = selection.split_counts()
    tags = list(TAGS)
    if licence.non_commercial:
        tags.append("non-commercial")
    if {r["source"] for r in selection.rows} == {"synthetic"}:
        tags.append("synthetic")
    data = DatasetCardData(
        pretty_name=ds.name,
        task_categories=["image-classification"],
        task_ids=["multi-class-image-classification"],
        size_categories=[size_category(sum(counts.values()))],
        tags=tags,
        **licence.metadata(),
    )
    splits = SplitDict()
    for split, n in counts.items():
        splits.add(SplitInfo(name=split, num_bytes=int(split_bytes.get(split, 0)), num_examples=n))
    info = DatasetInfo(features=features, splits=splits, download_size=int(sum(download_bytes.values())),
                       dataset_size=int(sum(split_bytes.values())))
    DatasetInfosDict({"default": info}).to_dataset_card_data(data)
    MetadataConfigs({"default": {
        "data_files": [{"split": s, "path": f"data/{s}-*"} for s in counts], "default": True,
    }}).to_dataset_card_data(data)
    body = card_body(ds, selection, licence=licence, features=features, labels=labels, shards=shards,
                     download_bytes=download_bytes, repo_id=repo_id)
    return DatasetCard(f"---\n{data.to_yaml()}\n---\n\n{body}")
