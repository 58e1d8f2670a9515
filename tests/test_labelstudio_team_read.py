"""One Label Studio annotation read for the team pull (curate.review.labelstudio_team.read_annotation),
no server: who answered is the server's e-mail for the user, never a bare id or ``None`` (issue 44)."""
from __future__ import annotations

from store_helpers import make_dataset

from curate.review.labelstudio_team import read_annotation

USERS = {1: "ann@example.com"}


def read(ds, completed_by):
    sid = ds.sample_ids()[0]
    raw = {"id": 5, "completed_by": completed_by, "created_at": "2026-01-01T00:00:00Z",
           "result": [{"type": "choices", "from_name": "background", "value": {"choices": [ds.backgrounds[0]]}}]}
    problems: list[str] = []
    row, _ = read_annotation(ds, 3, {"data": {"sample_id": sid}}, raw, USERS, role="annotator", is_gold=False,
                             problems=problems)
    return row, problems


def test_a_known_user_is_stored_by_email(tmp_path):
    ds = make_dataset(tmp_path / "d", n=1, masks=False)
    for who in (1, {"id": 1, "email": "ann@example.com"}):
        row, problems = read(ds, who)
        assert row is not None and row.annotator == "ann@example.com" and problems == []


def test_an_author_the_server_does_not_name_is_left_out_and_reported(tmp_path):
    ds = make_dataset(tmp_path / "d", n=1, masks=False)
    for who, said in ((99, "user id 99"), (None, "no author"), ({"id": 42}, "user id 42"), ("", "no author")):
        row, problems = read(ds, who)
        assert row is None, (who, row)
        assert len(problems) == 1 and said in problems[0] and "labelstudio:3:5" in problems[0], problems
        assert "not among the server's users" in problems[0] or "no author" in problems[0]


def test_the_team_pull_prints_annotator_names_as_written(tmp_path, monkeypatch):
    """The pull's summary names annotators as the server spells them: never read as console markup (a
    closing tag with nothing to close stopped the command after the table was written)."""
    from click.testing import CliRunner

    import curate.review.labelstudio_team as team
    from curate.cli import main
    from curate.review.team_report import TeamPullReport
    from curate.store.annotations import AnnotationUpsert

    ds = make_dataset(tmp_path / "d", n=1, masks=False)
    name = "ann[/b]@x.org"
    monkeypatch.setattr(team, "pushed_modes", lambda root, project=None: (True, False))
    monkeypatch.setattr(team, "pull_team", lambda root, **kw: TeamPullReport(AnnotationUpsert(), answered={name: 1}))
    result = CliRunner(env={"LABEL_STUDIO_API_KEY": "t", "COLUMNS": "200"}).invoke(
        main, ["review", "labelstudio", "pull", str(ds.root), "--url", "http://127.0.0.1:9"])
    assert result.exit_code == 0, result.output
    assert f"{name}: 1 answered, 0 skipped" in result.output
