"""``curate report DIR``: one Markdown and HTML report of a dataset folder, with PNG figures beside it.

Sections (each present when its inputs exist, otherwise a line saying what to run):

1. **Data layout** (papers/003 Fig. 3): easy and hard images per class, from the folder's
   current ``group`` column (``fig3_counts.png``), the per-class table, and the split's rule with
   curate's departures and the sources of its background labels.
2. **Per-class drops** (Fig. 4): from the split run recorded in ``dataset.yaml``
   (:class:`curate.runs.SplitRun`): the reference model's in-sample drop per kept class with its
   95% bootstrap interval, the cross-fitted (selection-corrected) drop beside it, the permutation
   p-value, the noise summary, and the classes the rule dropped with the reason.
3. **Evaluation** (Table 2): every evaluation run with easy/hard groups
   (:func:`curate.compare.load_rows`): easy, hard and drop with their bootstrap intervals and
   effective robustness fitted per model family and setup; the split reference's drop is flagged
   in-sample. Runs of the same model on the same setup count once, the newest; the others are
   listed. ``table2.csv`` holds the numbers.
4. **Easy vs hard** (Fig. 2): the scatter with one effective-robustness fit per family and setup,
   y = x (``fig2_scatter.png``), and each fit's scale, slope and intercept.
5. **Saliency** (SSS / RMA by group): every explain run (:meth:`curate.runs.ExplainRun.by_group`):
   per group the mean per-image SSS and RMA, the SSS a uniform map would get, n, NaN counts and why,
   and per run how many of its masks were human, exact (synthetic / COCO) and model-made, and how
   many were left out (unverified model proposals, masks marked bad; docs/design.md#masks).
6. **Fidelity** (papers/002): every fidelity run (:class:`curate.runs.FidelityRun`): the
   ranking by F-Fidelity AUC, each verdict against a random map (marginal ones marked), the
   masks the ``mask`` reference used by source, the degraded-series correlations and the curves
   (``fidelity_<run>.png``).
7. **Explanation quality** (papers/001): every vlm-quality run (:class:`curate.runs.VlmQualityRun`): Visual
   Fidelity, Contrastiveness and their combinations by group and by correct / wrong answer,
   Discriminability with its t-test, ECE, the background mentions and the reliability diagram.
8. **Who labelled** (issue 44): the newest annotator-spread run
   (:class:`curate.runs.annotator_spread.AnnotatorSpreadRun`): per model, each class's drop under
   the agreed labels, each annotator's and the disputed photos in either group, the spread, the
   classes whose easy/hard assignment flips, and a per-class figure (``spread_<run>_<k>.png``).
9. **Agreement** (issue 44): the newest agreement run, by :func:`curate.report_agreement.agreement_section`
   (alpha per class and overall, kappa per pair, annotators, confused backgrounds, photos by status,
   the disputed photos), or the command that makes one.
10. **Gallery**: a few easy and hard images per class (``gallery.png``), chosen deterministically.

Unreadable runs (unfinished, damaged, written by a newer curate) are listed as notes, never fatal.

:func:`build_report` writes ``report.md``, ``report.html`` (self-contained apart from the PNGs
next to it) and the figures to ``out_dir`` (default ``DIR/runs/report``) and returns the
Markdown path.
"""
from __future__ import annotations

import hashlib
import html
import logging
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from curate import __version__
from curate.formatting import num, pct, pct_ci
from curate.report_agreement import agreement_section
from curate.runs import RUNS_DIR, write_bytes
from curate.shell import suggest

log = logging.getLogger(__name__)

REPORT_MD = "report.md"
REPORT_HTML = "report.html"
DEFAULT_GALLERY = 3
THUMB = 96


# ----------------------------------------------------------------------------- a tiny document model
@dataclass
class Document:
    """Blocks rendered both to Markdown and to HTML (inline: `code`, **bold**, [text](url))."""

    title: str
    blocks: list[tuple[str, Any]] = field(default_factory=list)

    def heading(self, text: str, level: int = 2) -> None:
        self.blocks.append(("heading", (level, text)))

    def text(self, text: str) -> None:
        self.blocks.append(("text", text))

    def table(self, header: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
        self.blocks.append(("table", ([str(h) for h in header], [["" if c is None else str(c) for c in r] for r in rows])))

    def image(self, path: str, alt: str) -> None:
        self.blocks.append(("image", (path, alt)))

    def code(self, text: str) -> None:
        self.blocks.append(("code", text))

    def markdown(self) -> str:
        out = [f"# {self.title}", ""]
        for kind, value in self.blocks:
            if kind == "heading":
                out += ["#" * value[0] + " " + value[1], ""]
            elif kind == "text":
                out += [value, ""]
            elif kind == "table":
                header, rows = value
                esc = lambda c: c.replace("|", "\\|").replace("\n", " ")  # noqa: E731
                out.append("| " + " | ".join(esc(h) for h in header) + " |")
                out.append("|" + "---|" * len(header))
                out += ["| " + " | ".join(esc(c) for c in row) + " |" for row in rows]
                out.append("")
            elif kind == "image":
                out += [f"![{value[1]}]({value[0]})", ""]
            elif kind == "code":
                out += ["```", value, "```", ""]
        return "\n".join(out).rstrip() + "\n"

    def html(self) -> str:
        body = []
        for kind, value in self.blocks:
            if kind == "heading":
                body.append(f"<h{value[0]}>{_inline(value[1])}</h{value[0]}>")
            elif kind == "text":
                body.append(f"<p>{_inline(value)}</p>")
            elif kind == "table":
                header, rows = value
                head = "".join(f"<th>{_inline(h)}</th>" for h in header)
                cells = "".join("<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in row) + "</tr>" for row in rows)
                body.append(f"<table><thead><tr>{head}</tr></thead><tbody>{cells}</tbody></table>")
            elif kind == "image":
                body.append(f'<figure><img src="{html.escape(value[0])}" alt="{html.escape(value[1])}">'
                            f"<figcaption>{html.escape(value[1])}</figcaption></figure>")
            elif kind == "code":
                body.append(f"<pre><code>{html.escape(value)}</code></pre>")
        return (
            "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{html.escape(self.title)}</title><style>{_CSS}</style></head>\n<body>\n"
            f"<h1>{html.escape(self.title)}</h1>\n" + "\n".join(body) + "\n</body></html>\n"
        )


_CSS = ("body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}"
        "table{border-collapse:collapse;margin:1em 0;font-size:0.9em}th,td{border:1px solid #ccc;padding:3px 8px;"
        "text-align:right}th{background:#f3f3f3}td:first-child,th:first-child{text-align:left}"
        "img{max-width:100%}figure{margin:1em 0}figcaption{color:#666;font-size:0.85em}"
        "code{background:#f3f3f3;padding:0 3px}pre{background:#f6f6f6;padding:0.8em;overflow:auto}")


def _inline(text: str) -> str:
    """Escaped HTML of one line; quotes are escaped too and a link is one only to http(s) or a path without
    a scheme, since cells carry names from review servers (annotators)."""
    escaped = html.escape(text, quote=True)
    escaped = re.sub(r"`([^`]+)`", r"<code>\1</code>", escaped)
    escaped = re.sub(r"\*\*([^*]+)\*\*", r"<strong>\1</strong>", escaped)
    return re.sub(r"\[([^\]]+)\]\(((?:https?://|(?![\w+.-]*:))[^)\s]+)\)",
                  lambda m: f'<a href="{m.group(2)}">{m.group(1)}</a>', escaped)


# ----------------------------------------------------------------------------- helpers
def _pct(x: Any, digits: int = 1) -> str:
    """A fraction as a percentage (the shared formatter)."""
    return pct(x, digits)


def _ci(interval: Any) -> str:
    return pct_ci(interval)


def _num(x: Any, digits: int = 3, scale: float = 1.0) -> str:
    return num(x, digits, scale)


# ----------------------------------------------------------------------------- sections
def _split_run(ds: Any, notes: list[str]) -> Any:
    """The split run recorded in ``dataset.yaml`` (a :class:`curate.runs.SplitRun`), or ``None``."""
    from curate.runs import RunError, SplitRun

    name = (ds.provenance.get("split") or {}).get("run")
    if not name:
        return None
    try:
        return SplitRun.load(ds.root / RUNS_DIR / str(name))
    except RunError as error:
        log.warning("the split run %s cannot be read (%s); Fig. 4 is left out", name, error)
        notes.append(f"the split run `{name}` cannot be read ({error})")
        return None


def _layout_section(doc: Document, ds: Any, out: Path, split: Any) -> list[int]:
    """Fig. 3 and the per-class table; returns the classes that have a group."""
    from curate.split.tables import counts_figure, rule_text

    doc.heading("Data layout (Fig. 3)")
    rows = ds.rows()
    statuses = Counter(r["status"] for r in rows)
    grouped = [r for r in rows if r["group"] in ("easy", "hard") and r["class_index"] is not None]
    doc.text(f"{len(rows)} images in the folder (" + ", ".join(f"{n} {s}" for s, n in sorted(statuses.items()))
             + f"); label space `{ds.label_space.name}` ({len(ds.label_space)} classes); backgrounds "
             + ", ".join(f"`{b}`" for b in ds.backgrounds) + ".")
    if not grouped:
        doc.text("No image has an easy/hard group yet: run `curate split DIR --reference MODEL` first.")
        return []
    counts: Counter[tuple[int, str]] = Counter((int(r["class_index"]), r["group"]) for r in grouped)
    bkgs: dict[tuple[int, str], Counter[str]] = {}
    for r in grouped:
        bkgs.setdefault((int(r["class_index"]), r["group"]), Counter())[r["background"] or "—"] += 1
    indices = sorted({c for c, _ in counts})
    names = ds.label_space.names
    write_bytes(out / "fig3_counts.png", counts_figure(
        [_Counts(c, counts[(c, "easy")], counts[(c, "hard")]) for c in indices], names))
    doc.image("fig3_counts.png", "Fig. 3: easy and hard images per class")
    if split is not None:
        doc.text(rule_text(split.rule) + f" Reference model(s): {', '.join(f'`{x}`' for x in split.reference_labels)}; "
                 f"split run `{split.name}`; {len(split.kept)} classes kept, {len(split.dropped)} dropped. "
                 + (split.label_sources.text + "." if split.label_sources is not None else ""))
    def bk(c: int, group: str) -> str:
        return ", ".join(sorted(bkgs.get((c, group), {}))) or "—"

    table = [[f"{names[c]} ({c})", bk(c, "easy"), counts[(c, "easy")], bk(c, "hard"), counts[(c, "hard")]]
             for c in indices]
    table.append(["**total**", "", sum(counts[(c, "easy")] for c in indices), "",
                  sum(counts[(c, "hard")] for c in indices)])
    doc.table(["class", "easy background", "easy images", "hard background", "hard images"], table)
    return indices


def _drops_section(doc: Document, ds: Any, out: Path, split: Any, notes: Sequence[str] = ()) -> None:
    from curate.split.tables import drops_figure

    doc.heading("Per-class drops (Fig. 4)")
    if split is None:
        doc.text("No readable split run is recorded in `dataset.yaml`; run `curate split`."
                 + "".join(f" Note: {n}." for n in notes))
        return
    names = ds.label_space.names
    kept = split.kept
    if kept:
        write_bytes(out / "fig4_drops.png", drops_figure(kept, names))
        doc.image("fig4_drops.png", "Fig. 4: the reference model's accuracy drop per class (bars: in-sample, 95% "
                                    "bootstrap interval; diamonds: cross-fitted)")
    doc.text(f"Reference drop over the kept classes: {split.reference_drop_text()}. {split.in_sample_note} "
             f"{split.noise_summary.text}.")
    rows = []
    for c in sorted(kept, key=lambda c: -c.drop):
        rows.append([f"{names[c.class_index]} ({c.class_index})" + (" (pinned)" if c.pinned else ""),
                     c.easy + (" (tie)" if c.easy_ties else ""), _pct(c.easy_acc),
                     c.hard + (" (tie)" if c.hard_ties else ""), _pct(c.hard_acc), _pct(c.drop) + _ci(c.drop_ci),
                     _pct(c.crossfit_drop), _num(c.p_value, 3), c.n_easy, c.n_hard])
    doc.table(["class", "easy bkg", "easy acc. (%)", "hard bkg", "hard acc. (%)", "drop in-sample (points) [95% CI]",
               "drop cross-fitted", "p (permutation)", "n easy", "n hard"], rows)
    ties = [note for c in sorted(kept, key=lambda c: c.class_index) for note in c.tie_notes]
    if ties:
        doc.text("Ties (the rule breaks them by more images, then name order; `(tie)` above): " + " ".join(ties))
    if split.dropped:
        doc.text("Classes the rule dropped:")
        doc.table(["class", "reason"], [[f"{names[c.class_index]} ({c.class_index})", c.reason] for c in split.dropped])


def _plan_section(doc: Document, ds: Any, out: Path, split: Any, half_width: float = 0.05) -> None:
    """The collection plan (``curate plan`` at +-5 points): photos each class still needs."""
    from curate.split.plan import make_plan, plan_figure

    if split is None or not any(c.n_easy and c.n_hard for c in split.kept):
        return
    plan = make_plan(split, ds.table().column("status").to_pylist(), half_width=half_width)
    doc.heading("Collection plan")
    write_bytes(out / "plan.png", plan_figure(plan))
    doc.image("plan.png", f"drop half-width per class now (the formula the plan uses; the bootstrap as a dot) and "
                          f"after the plan (predicted), target +-{100 * half_width:g} points")
    cost = f"{plan.review_cost:.2f} photos reviewed per accepted photo" if plan.accepted else "unknown (no review yet)"
    doc.text(f"Photos each class still needs for a drop interval of +-{100 * half_width:g} points (`curate plan`; "
             f"it {plan.assumption}). Review cost: {cost}. Mean drop: half-width {_num(plan.overall_now, 1, 100)} "
             f"now, {_num(plan.overall_after, 1, 100)} after the mean's own plan ({plan.need_easy} easy + "
             f"{plan.need_hard} hard photos over all classes). `"
             f"{suggest('curate collect inat DIR --fill {run}', run=split.name)}` fetches them, steered to the hard "
             "background.")
    names = ds.label_space.names
    doc.table(["class", "n easy", "n hard", "half-width now (bootstrap), points", "need easy", "need hard",
               "after [range]", "photos to review"],
              [[f"{names[c.class_index]} ({c.class_index})", c.n_easy, c.n_hard,
                f"{_num(c.half_width_now, 1, 100)} ({_num(c.half_width_bootstrap, 1, 100)})",
                c.need_easy, c.need_hard, f"{_num(c.half_width_after, 1, 100)} [{_num(c.half_width_after_range[0], 1, 100)}"
                f", {_num(c.half_width_after_range[1], 1, 100)}]", _num(c.review_photos, 0)] for c in plan.classes])


@dataclass(frozen=True)
class _Counts:
    """A class's easy and hard image counts (what Fig. 3 plots)."""

    class_index: int
    n_easy: int
    n_hard: int


def _float(x: Any) -> float:
    try:
        return float(x)
    except (TypeError, ValueError):
        return float("nan")


def evaluation_rows(root: Path, runs: Sequence[str] | None = None) -> tuple[list[Any], list[tuple[str, str]]]:
    """Table 2 rows (:class:`curate.compare.RunRow`) and the (omitted run, kept run) duplicates.

    With ``runs`` None, one run per (model id, label space, prompts): the newest
    (:func:`curate.compare.newest_runs`, the rule ``curate compare`` uses); effective robustness
    is computed over the rows kept.
    """
    from curate.compare import Repeat, load_rows

    omitted: list[Repeat] = []
    rows = load_rows(root, runs, repeats=omitted)
    return rows, omitted


def _evaluation_section(doc: Document, root: Path, out: Path, runs: Sequence[str] | None) -> None:
    from curate.compare import drop_text, fit_groups, repeats_note, scatter_png, to_csv
    from curate.metrics.robustness import MIN_MODELS

    doc.heading("Evaluation (Table 2)")
    rows, omitted = evaluation_rows(root, runs)
    if not rows:
        doc.text("No evaluation run with easy/hard groups yet: run `curate evaluate DIR --model ...` after the split.")
        return
    scale = rows[0].er_scale
    doc.text("Balanced top-1 accuracy (%) on the easy and hard groups, the drop (mean over classes of easy - hard, "
             "points; papers/003 App. C.3) with 95% bootstrap intervals, and effective robustness: points above the "
             f"least-squares fit of hard on easy accuracy ({scale} scale) over the models of the same family "
             "(CLIP, classifier, LVLM: fitted separately, as papers/003 Fig. 2 does) and setup (label space, prompts).")
    table = []
    for r in sorted(rows, key=lambda r: (r.setup, -r.easy)):
        table.append([r.model, r.family, r.label_space, r.prompts, _pct(r.easy) + _ci(r.easy_ci),
                      _pct(r.hard) + _ci(r.hard_ci), drop_text(r, 1) + _ci(r.drop_ci), _pct(r.effective_robustness),
                      r.n_easy, r.n_hard, f"`{r.run}`"])
    doc.table(["model", "family", "label space", "prompts", "easy", "hard", "drop", "effective robustness", "n easy",
               "n hard", "run"], table)
    if any(r.in_sample for r in rows):
        doc.text("**In-sample**: the split's reference model chose easy and hard to maximise its own drop, so its drop "
                 "on this split is inflated by that selection (papers/003 reports it the same way). `corrected` is the "
                 "split's cross-fitted drop: easy/hard chosen on one fold of the images and measured on the other.")
    write_bytes(out / "table2.csv", to_csv(rows).encode())
    if omitted:
        doc.text(repeats_note(omitted))
    doc.heading("Easy vs hard (Fig. 2)")
    write_bytes(out / "fig2_scatter.png", scatter_png(rows))
    doc.image("fig2_scatter.png", "Fig. 2: easy vs hard accuracy, effective-robustness fit per family and y = x")
    fits = [[setup[0], setup[1], setup[2], fit.n_models, fit.scale, _num(fit.slope), _num(fit.intercept)]
            for setup, fit in fit_groups(rows, scale).items()]
    doc.table(["family", "label space", "prompts", "models", "scale", "slope", "intercept"], fits)
    if any(f[3] < MIN_MODELS for f in fits):
        doc.text(f"A fit needs at least {MIN_MODELS} models of one family and setup; below that effective robustness is "
                 "undefined (—), since a line through two points fits every model exactly.")


def explain_summaries(root: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """Per explain run: the compact by-group entry (:meth:`curate.runs.ExplainRun.by_group`), and
    notes for runs that cannot be read (unfinished, damaged, written by a newer curate)."""
    from curate.runs import RunError, iter_runs

    entries, notes = [], []
    for run_dir, run in iter_runs(root, "explain"):
        if isinstance(run, RunError):
            notes.append(f"`{run_dir.name}` cannot be read ({run})")
        else:
            entries.append(run.by_group())
    return entries, notes


def _saliency_section(doc: Document, root: Path) -> None:
    entries, notes = explain_summaries(root)
    if not entries and not notes:
        return
    doc.heading("Saliency: SSS and RMA by group")
    doc.text("Per image, the mean over its predictions of the Semantic Spuriousity Score (SSS, papers/004 §3.1: "
             "higher = more saliency outside the object, i.e. on the background) and of the Relevance Mass Accuracy "
             "(RMA = sum(H*M) / sum(H), papers/000: the saliency mass inside the object mask); then the mean over "
             "images of each group. `SSS uniform` is what a uniform map scores (1 - mask area): the chance level.")
    rows = []
    for e in entries:
        label = f"`{e['run']}`"
        what = " / ".join(str(x) for x in (e["model"], e["method"], e["layer"], e["target"]) if x)
        parts = list(e["groups"].items()) + [("all", e["overall"])]
        for part, g in parts:
            reasons = g.get("nan_reasons") if part != "all" else e.get("nan_reasons")
            why = ", ".join(f"{k} {v}" for k, v in (reasons or {}).items() if v)
            rows.append([label, what, part, _num(g.get("sss")), _num(g.get("rma")), _num(g.get("sss_uniform")),
                         g.get("n", ""), g.get("n_nan", ""), why])
    if rows:
        doc.table(["run", "model / method / layer / target", "group", "SSS", "RMA", "SSS uniform", "n",
                   "NaN images", "NaN maps (why)"], rows)
        doc.text("NaN: an image whose maps are all undefined (a constant map, an empty mask) has no score; it is "
                 "counted here, never silently dropped or scored 0.")
        doc.text("Masks per run (a model's unverified proposals are used only with `--allow-model-masks`; masks "
                 "reviewers marked bad never): "
                 + "; ".join(f"`{e['run']}`: {e.get('mask_line') or 'masks: sources not recorded'}" for e in entries)
                 + ".")
    for note in notes:
        doc.text("Skipped: " + note + ".")


def fidelity_summaries(root: Path) -> tuple[list[Any], list[str]]:
    """Every fidelity run (:class:`curate.runs.FidelityRun`), oldest first, and notes for runs that
    cannot be read."""
    from curate.runs import RunError, iter_runs

    runs, notes = [], []
    for run_dir, run in iter_runs(root, "fidelity"):
        if isinstance(run, RunError):
            notes.append(f"`{run_dir.name}` cannot be read ({run})")
        else:
            runs.append(run)
    return runs, notes


def _fidelity_section(doc: Document, root: Path, out: Path) -> None:
    runs, notes = fidelity_summaries(root)
    if not runs and not notes:
        return
    doc.heading("Fidelity: which saliency maps deserve trust")
    doc.text("SSS and RMA read a saliency map; they describe the model only if the map is faithful. Per method, "
             "the AUC over sparsity of Fid+ (remove the method's most important pixels: the score should drop) and "
             "Fid- (keep only them: it should not), papers/002; F-Fid uses a model fine-tuned on random masks of at "
             "most beta of the input and removes at most beta. `vs random` is the paired difference to a random map "
             "(MoRF / LeRF, with a 95% interval); `faithful` = both above 0; `(marginal)` = an interval whose lower "
             "bound nearly touches 0, so another fine-tuning seed could change the verdict.")
    for run in runs:
        c = run.config
        masks = f" The mask reference's {run.mask_line}." if run.mask_line else ""
        skipped = (" Skipped samples: " + ", ".join(f"{k} {v}" for k, v in sorted(c.skipped.items())) + "."
                   if c.skipped else "")
        doc.text(f"`{run.name}`: {c.model}, {c.images} images, score {c.score}, {len(c.sparsities)} sparsities, "
                 f"alpha {c.alpha:g}, beta {c.beta:g}, {c.samples} samples, {c.n_seeds or 1} fine-tuning seed(s); "
                 f"intervals: {run.interval_note}.{masks}{skipped}")
        metrics = run.metrics
        rows = []
        for r in run.ranking:
            vs = f"{r.vs_random_text('morf')} / {r.vs_random_text('lerf')}" if r.morf is not None else ""
            rows.append([r.rank, r.method, *(_num(r.aucs.get(m), 4) for m in metrics), vs, r.verdict])
        doc.table(["rank", "method", *metrics, "vs random (MoRF / LeRF)", "verdict"], rows)
        if run.plot_path is not None:
            write_bytes(out / f"fidelity_{run.name}.png", run.plot_path.read_bytes())
            doc.image(f"fidelity_{run.name}.png", f"Fidelity curves over sparsity, run {run.name}")
        for base in run.correlations:
            corr = run.macro_correlations(base)
            doc.text(f"Degraded series `{base}`: macro Spearman of each AUC with the noise ratio: "
                     + ", ".join(f"{m} {v:+.2f}" for m, v in corr.items()) + ".")
    for note in notes:
        doc.text("Skipped: " + note + ".")


def _attribution_section(doc: Document, root: Path, out: Path) -> None:
    """``curate attribution`` runs of an intervention folder: D split into the background part and
    the rest per model and class, the anchors' numbers, and the decomposition figure."""
    from curate.interventions.figures import decomposition_png
    from curate.masks.sources import MaskCounts
    from curate.runs import RunError, iter_runs
    from curate.runs.attribution import CLASS_COLUMNS, DECOMPOSITION_COLUMNS, DECOMPOSITION_NOTE, GHOST_NOTE

    found = list(iter_runs(root, "attribution"))
    if not found:
        return
    doc.heading("Does the background cause the drop?")
    doc.text(DECOMPOSITION_NOTE)
    for run_dir, run in found:
        if isinstance(run, RunError):
            doc.text(f"Skipped: `{run_dir.name}` cannot be read ({run}).")
            continue
        source = run.intervention
        truth = " These are exact counterfactuals from the synthetic world's generator (nothing pasted)." \
            if source.get("truth") else ""
        doc.text(f"`{run.name}`: intervention `{source.get('run')}` of `{source.get('source_name')}`, "
                 f"{run.settings.get('n_boot')} paired bootstrap replicates; "
                 f"{MaskCounts.from_dict(source.get('masks')).line()}.{truth} A class is flagged when its paste "
                 f"control loses, or its ghost or fill control or its fill effect moves B by, more than "
                 f"{100 * run.threshold:.0f} points.")
        doc.table(list(DECOMPOSITION_COLUMNS), run.decomposition_rows())
        doc.text("The anchors' numbers (Xiao et al. 2020; Moayeri et al. 2022): accuracy in %, RFS in [-1, 1], "
                 "chance = one guess among the candidate labels.")
        doc.table(["model", "only-FG", "no-FG", "only-BG", "mixed-same", "mixed-rand", "BG-gap", "RFS", "adversarial",
                   "ghost", "ghost-neutral", "chance"], run.anchor_rows())
        doc.text(GHOST_NOTE + (" " + run.ghost_advice() + "." if run.ghost_advice() else ""))
        figure = f"decomposition_{run.name}.png"
        write_bytes(out / figure, decomposition_png(run.models))
        doc.image(figure, f"Per class: observed drop D, background part B and the rest (points), run {run.name}")
        for model in run.models:
            doc.text(f"Per class, {model.model} ({model.label_space}):")
            doc.table(list(CLASS_COLUMNS), run.class_rows(model))


def _spread_section(doc: Document, root: Path, out: Path) -> None:
    """The newest annotator-spread run: drops by labelling, spread, flips, and the per-class figure."""
    from curate.compare import annotator_spread_run
    from curate.split.spread_figure import spread_png

    run = annotator_spread_run(root)
    if run is None:
        return
    doc.heading("How much the drop depends on who labelled")
    doc.text(f"`{run.name}`: split `{run.split_run}`'s rule re-derives easy and hard under each labelling; "
             f"`{run.spread.base}` = the aggregated labels ({run.spread.disputed} disputed photo(s) left out, then put "
             "in either group where an annotator's answer puts them); spread = max - min over the labellings that "
             "keep the class. Every drop here is in-sample and per model, and spans only the labellings there are "
             "(docs/science.md#annotator-spread).")
    for k, m in enumerate(run.models):
        figure = f"spread_{run.name}_{k}.png"
        write_bytes(out / figure, spread_png(run, m.model))
        doc.image(figure, f"Drop by labelling per class, {m.model}")
        doc.table(["class", *run.columns, "spread", "flag"],
                  [[f"{r.class_index} {r.class_name}", *(pct(r.drops.get(n, float("nan")), 1) for n in run.columns),
                    pct(r.spread, 1), run.flag_text(r.class_index)] for r in run.rows() if r.model == m.model])


def vlm_quality_summaries(root: Path) -> tuple[list[Any], list[str]]:
    """Every vlm-quality run (:class:`curate.runs.VlmQualityRun`), oldest first, and notes for runs
    that cannot be read."""
    from curate.runs import RunError, iter_runs

    runs, notes = [], []
    for run_dir, run in iter_runs(root, "vlm-quality"):
        if isinstance(run, RunError):
            notes.append(f"`{run_dir.name}` cannot be read ({run})")
        else:
            runs.append(run)
    return runs, notes


def _vlm_quality_section(doc: Document, root: Path, out: Path) -> None:
    runs, notes = vlm_quality_summaries(root)
    if not runs and not notes:
        return
    from curate.runs.vlm_quality import SCORE_LABELS, SCORES

    doc.heading("Explanation quality (papers/001)")
    doc.text("A VLM answered among the candidates and explained its answer (`curate vlm-explain`). Visual Fidelity "
             "(VF) = share of the explanation's yes/no verification questions that a verifier seeing the image "
             "confirms; Contrastiveness (Contr) = entailment probability of the given answer's hypothesis over the "
             "sum over all candidates, with every candidate masked out of the explanation (1/#candidates = favours "
             "none). Means over the run's samples (in-sample). Discriminability = mean on correct answers minus mean "
             "on wrong ones (unpaired t-test: * p < .05, ** p < .01, *** p < .001); ECE = calibration error of the "
             "score read as P(correct), equal-width bins (0 = calibrated).")
    for run in runs:
        doc.text(f"`{run.name}`: explanations of `{run.source_run}` by {run.explainer}, {run.n} samples, accuracy "
                 f"{_pct(run.accuracy)}%; judges: " + ", ".join(f"{k} `{v.get('spec')}`" for k, v in run.judges.items())
                 + ".")
        rows = []
        for s in SCORES:
            means, d, e = run.group_means(s), run.discriminability[s], run.ece[s]
            stars = "***" if d["p"] < 0.001 else "**" if d["p"] < 0.01 else "*" if d["p"] < 0.05 else ""
            rows.append([SCORE_LABELS[s], *(_num((means.get(p) or {}).get("mean")) for p in ("easy", "hard", "correct",
                                                                                                "wrong", "all")),
                         _num(d["disc"]) + stars, _num(d["p"], 4), _num(e["ece"]),
                         ", ".join(f"{k} {v}" for k, v in run.nan_reasons(s).items())])
        doc.table(["score", "easy", "hard", "correct", "wrong", "all", "Discriminability", "p", "ECE", "NaN (why)"], rows)
        background = run.background.get("rows") or []
        if background:
            doc.text("Share of explanations that name the sample's own background, its class's hard background, or "
                     "any background of the vocabulary (whole word, case-insensitive):")
            doc.table(["samples", "n", "own %", "hard background %", "any %"],
                      [[r["part"], r["n"], _pct(r["own"]), _pct(r["hard"]), _pct(r["any"])] for r in background])
        if run.plot_path is not None:
            write_bytes(out / f"reliability_{run.name}.png", run.plot_path.read_bytes())
            doc.image(f"reliability_{run.name}.png", f"Reliability diagram of the scores, run {run.name}")
    for note in notes:
        doc.text("Skipped: " + note + ".")


def _thumbnail(path: Path, size: int) -> Any:
    from PIL import Image

    with Image.open(path) as img:
        img = img.convert("RGB")
        scale = size / max(img.width, img.height)  # small images are enlarged, large ones reduced
        img = img.resize((max(1, round(img.width * scale)), max(1, round(img.height * scale))), Image.BICUBIC)
        canvas = Image.new("RGB", (size, size), (255, 255, 255))
        canvas.paste(img, ((size - img.width) // 2, (size - img.height) // 2))
        return canvas


def gallery_png(ds: Any, per_group: int = DEFAULT_GALLERY, thumb: int = THUMB) -> tuple[bytes | None, list[list[Any]]]:
    """A grid: one row per class with a group, ``per_group`` easy then hard thumbnails, the class
    and backgrounds on the left. The images are the first by a hash of their sample id (a stable,
    unbiased pick). Returns the PNG and the table of sample ids shown."""
    from PIL import Image, ImageDraw

    rows = [r for r in ds.rows(group=["easy", "hard"]) if r["class_index"] is not None]
    if not rows or per_group <= 0:
        return None, []
    by_cell: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for r in rows:
        by_cell.setdefault((int(r["class_index"]), r["group"]), []).append(r)
    key = lambda r: hashlib.sha256(r["sample_id"].encode()).hexdigest()  # noqa: E731
    classes = sorted({c for c, _ in by_cell})
    label_w, header_h, pad = 190, 22, 4
    width = label_w + 2 * per_group * (thumb + pad) + pad * 3
    height = header_h + len(classes) * (thumb + pad) + pad
    grid = Image.new("RGB", (width, height), (255, 255, 255))
    draw = ImageDraw.Draw(grid)
    x_easy, x_hard = label_w, label_w + per_group * (thumb + pad) + pad * 3
    draw.text((x_easy, 5), "easy", fill=(0, 90, 0))
    draw.text((x_hard, 5), "hard", fill=(150, 0, 0))
    names = ds.label_space.names
    table = []
    for k, c in enumerate(classes):
        y = header_h + k * (thumb + pad)
        picks = {g: sorted(by_cell.get((c, g), []), key=key)[:per_group] for g in ("easy", "hard")}
        bkg = {g: ", ".join(sorted({r["background"] or "—" for r in by_cell.get((c, g), [])})) or "—"
               for g in ("easy", "hard")}
        draw.text((pad, y + 6), names[c][:28], fill=(0, 0, 0))
        draw.text((pad, y + 24), f"easy: {bkg['easy']}"[:30], fill=(0, 90, 0))
        draw.text((pad, y + 40), f"hard: {bkg['hard']}"[:30], fill=(150, 0, 0))
        for g, x0 in (("easy", x_easy), ("hard", x_hard)):
            for j, r in enumerate(picks[g]):
                try:
                    grid.paste(_thumbnail(ds.image_path(r), thumb), (x0 + j * (thumb + pad), y))
                except OSError as exc:
                    log.warning("gallery: cannot read %s (%s)", r["sample_id"], exc)
        table.append([f"{names[c]} ({c})", ", ".join(f"`{r['sample_id']}`" for r in picks["easy"]),
                      ", ".join(f"`{r['sample_id']}`" for r in picks["hard"])])
    import io

    buffer = io.BytesIO()
    grid.save(buffer, "PNG", optimize=True)
    return buffer.getvalue(), table


# ----------------------------------------------------------------------------- the report
def build_report(
    root: str | Path,
    out_dir: str | Path | None = None,
    *,
    runs: Sequence[str] | None = None,
    gallery_per_group: int = DEFAULT_GALLERY,
    title: str | None = None,
) -> Path:
    """Write ``report.md``, ``report.html`` and the PNG figures for the dataset at ``root``.

    ``out_dir`` defaults to ``DIR/runs/report``; ``runs`` restricts Table 2 / Fig. 2 to those
    evaluation runs (default: all, one per model and setup). Returns the Markdown file's path.
    """
    from curate.store import Dataset

    ds = Dataset.open(root)
    out = Path(out_dir) if out_dir is not None else ds.root / RUNS_DIR / "report"
    out.mkdir(parents=True, exist_ok=True)
    for stale in ("fig2_scatter.png", "fig3_counts.png", "fig4_drops.png", "gallery.png", "table2.csv", "plan.png"):
        (out / stale).unlink(missing_ok=True)  # a figure whose inputs are gone must not linger
    for stale in [*out.glob("fidelity_*.png"), *out.glob("reliability_*.png"), *out.glob("decomposition_*.png"),
                  *out.glob("spread_*.png")]:
        stale.unlink(missing_ok=True)
    doc = Document(title or f"curate report: {ds.name}")
    doc.text(f"Dataset folder `{ds.root.name}`, written by curate {__version__}. Figures are PNG files beside "
             f"this report; accuracies are %, drops are points, intervals are 95% bootstrap intervals.")
    notes: list[str] = []
    split = _split_run(ds, notes)
    _layout_section(doc, ds, out, split)
    _drops_section(doc, ds, out, split, notes)
    _plan_section(doc, ds, out, split)
    _evaluation_section(doc, ds.root, out, runs)
    _saliency_section(doc, ds.root)
    _fidelity_section(doc, ds.root, out)
    _vlm_quality_section(doc, ds.root, out)
    _attribution_section(doc, ds.root, out)
    _spread_section(doc, ds.root, out)
    agreement_section(doc, ds)
    doc.heading("Gallery")
    png, table = gallery_png(ds, gallery_per_group)
    if png is None:
        doc.text("No easy/hard images to show yet.")
    else:
        write_bytes(out / "gallery.png", png)
        doc.image("gallery.png", f"{gallery_per_group} easy and {gallery_per_group} hard images per class")
        doc.table(["class", "easy (sample ids)", "hard (sample ids)"], table)
    md_path = out / REPORT_MD
    write_bytes(md_path, doc.markdown().encode("utf-8"))
    write_bytes(out / REPORT_HTML, doc.html().encode("utf-8"))
    log.info("wrote the report %s (and %s)", md_path, REPORT_HTML)
    return md_path
