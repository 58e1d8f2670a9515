"""The report's agreement section (issue 44, curate/report_agreement.py) from the command line: a
simulated team on a small synthetic world, ``curate agreement``, ``curate report``; the section's
figures are the run's, and a folder without an agreement run gets the command that makes one."""
from __future__ import annotations

import re

from click.testing import CliRunner

from curate.cli import main
from curate.collect.synthetic import DEFAULT_CLASSES, WorldSpec, collect_synthetic
from curate.formatting import num
from curate.report_agreement import MAX_DISPUTED
from curate.runs.agreement import AgreementRun
from curate.runs.lookup import named_run
from curate.store import Dataset
from curate.store.annotations import current_annotations


def invoke(*args: str) -> str:
    result = CliRunner().invoke(main, list(args), terminal_width=200)
    assert result.exit_code == 0, result.output
    return result.output


def section(root) -> str:
    text = (root / "runs" / "report" / "report.md").read_text()
    start = text.index("## Agreement of the annotators")
    return text[start:text.index("\n## ", start + 1)]


def rows_of(text: str, first_header: str) -> list[list[str]]:
    """The body rows of the Markdown table whose header starts with ``first_header``."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {first_header} |"))
    out = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        out.append([c.strip() for c in line.strip("|").split(" | ")])
    return out


def test_the_report_shows_the_newest_agreement_run_and_its_disputes(tmp_path):
    root = tmp_path / "world"
    collect_synthetic(root, WorldSpec(classes=DEFAULT_CLASSES[:8], per_class=3, image_size=16, seed=5))
    invoke("report", str(root))
    before = section(root)
    assert before.strip().splitlines()[2:] == [f"No agreement run yet: `curate agreement {root}` measures it from "
                                               "the folder's annotations."]
    invoke("simulate-annotators", str(root), "--team", "careful:0.05,confuse:grass-tree:0.3,random:0.5", "--seed", "3",
           "--gold", "0.25")
    invoke("agreement", str(root), "--rule", "majority", "--replicates", "50", "--run-name", "old")
    invoke("agreement", str(root), "--rule", "majority", "--replicates", "60", "--run-name", "team")
    invoke("report", str(root))
    text = section(root)
    run = named_run(root, "team", AgreementRun)
    assert "`team`" in text and "`old`" not in text and "60 replicates" in text
    assert "docs/science.md#what-alpha-can-and-cannot-show" in text
    overall = run.alpha[-1]
    assert f"{overall.n_photos} photo(s) labelled by {overall.n_annotators} annotator(s)" in text
    assert rows_of(text, "class") == [[a.group, num(a.alpha), f"[{num(a.low)}, {num(a.high)}]", str(a.n_photos),
                                       str(a.n_pairable), str(a.n_annotators)] for a in run.alpha]
    assert rows_of(text, "annotator A") == [[k.a, k.b, str(k.n_common), num(k.kappa), num(k.set_agreement)]
                                            for k in run.kappa] and len(run.kappa) == 3
    who = {r[0]: r for r in rows_of(text, "annotator")}
    for a in run.annotators:
        assert who[a.annotator][1:3] == [str(a.answered), str(a.skipped)]
        assert who[a.annotator][3] == f"{num(a.gold_accuracy)} ({a.gold_correct}/{a.gold_n})" and a.gold_n > 0
        assert who[a.annotator][4] == f"{num(a.loo_agreement)} ({a.loo_agree}/{a.loo_n})"
    confused = ", ".join(f"{c.first}/{c.second} {c.count}" for c in run.confused[:10])
    assert run.confused and confused in text
    counts = run.status_counts
    statuses = re.search(r"Photos by status, labels by `majority` \(threshold 0\): ([^.]+)\.", text).group(1)
    assert statuses == ", ".join(f"{s} {counts.get(s, 0)}" for s in
                                 ("agreed", "adjudicated", "single", "disputed", "unlabelled"))
    assert 0 < counts["disputed"] <= MAX_DISPUTED
    disputed = rows_of(text, "sample id")
    assert [r[0] for r in disputed] == run.disputed
    answers: dict[str, list[str]] = {}
    for a in current_annotations(Dataset.open(root)):
        if a.role == "annotator" and a.sample_id in run.disputed:
            answers.setdefault(a.sample_id, []).append(f"{a.annotator}: {'/'.join(a.backgrounds)}")
    assert all(r[3] == "; ".join(sorted(answers[r[0]])) for r in disputed)
    assert "## Agreement of the annotators" in (root / "runs" / "report" / "report.md").read_text()
    assert "<h2>Agreement of the annotators</h2>" in (root / "runs" / "report" / "report.html").read_text()


def test_names_from_a_server_cannot_inject_html_into_the_report():
    """Annotator names come from Label Studio (any member of the organization picks theirs): a name written as a
    Markdown link must not open an attribute or a javascript: link in report.html."""
    from curate.report import Document

    doc = Document("t")
    doc.table(["annotator"], [['[a](x"onmouseover=alert//)'], ["[b](javascript:alert%281%29)"], ["<script>x</script>"]])
    doc.text("see [the science](docs/science.md#what-alpha-can-and-cannot-show) and [site](https://example.org/a)")
    page = doc.html()
    assert '"onmouseover' not in page and 'href="javascript:' not in page and "<script>x" not in page
    assert '<a href="docs/science.md#what-alpha-can-and-cannot-show">the science</a>' in page
    assert '<a href="https://example.org/a">site</a>' in page
