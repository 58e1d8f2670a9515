"""Several annotators on the real Label Studio server (issue 44): users invited through the API,
each annotating with their own token; the team push (one project per annotator), the pull of
every annotation into the annotation table, re-pulls, changes and deletions, bad input, a server
that stops mid-pull, and the adjudicator's queue. Few photos (two classes x 4) to stay short.
"""
from __future__ import annotations

import hashlib
import secrets
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import numpy as np
import pytest
from review_helpers import review_world, square_mask

from curate.review import rle

pytestmark = [pytest.mark.labelstudio, pytest.mark.slow, pytest.mark.timeout(900)]

CLASSES = ("polar bear", "black swan")


def invite_user(url: str, admin_token: str, email: str) -> str:
    """Sign a new user up through the organization's invite link (as a person would) and return
    their own API token (``/api/current-user/token`` in their session)."""
    with httpx.Client(base_url=url, headers={"Authorization": f"Token {admin_token}"}, timeout=60) as admin:
        invite = admin.get("/api/invite")
        invite.raise_for_status()
        link = invite.json()["invite_url"]
    with httpx.Client(base_url=url, timeout=60) as browser:
        browser.get(link).raise_for_status()
        csrf = browser.cookies["csrftoken"]
        signup = browser.post(link, data={"email": email, "password": secrets.token_urlsafe(12),
                                          "csrfmiddlewaretoken": csrf}, headers={"Referer": url + link})
        assert signup.status_code == 302, signup.text[:300]
        token = browser.get("/api/current-user/token")
        token.raise_for_status()
        return token.json()["token"]


class Person:
    """One annotator with their own token."""

    def __init__(self, url: str, admin_token: str) -> None:
        self.email = f"ann-{uuid.uuid4().hex[:8]}@example.com"
        self.http = httpx.Client(base_url=url, headers={"Authorization": f"Token {invite_user(url, admin_token, self.email)}"},
                                 timeout=60)

    def tasks(self, project_id: int) -> list[dict[str, Any]]:
        response = self.http.get("/api/tasks", params={"project": project_id, "fields": "all", "page_size": 1000})
        response.raise_for_status()
        data = response.json()
        return data["tasks"] if isinstance(data, dict) else data

    def annotate(self, project_id: int, task: dict[str, Any], backgrounds: list[str], mask: np.ndarray | None = None,
                 *, cancelled: bool = False) -> int:
        result: list[dict[str, Any]] = []
        if backgrounds:
            result.append({"id": secrets.token_hex(5), "from_name": "background", "to_name": "image", "type": "choices",
                           "origin": "manual", "value": {"choices": backgrounds}})
        if mask is not None:
            height, width = mask.shape
            result.append({"id": secrets.token_hex(5), "from_name": "mask", "to_name": "image", "type": "brushlabels",
                           "origin": "manual", "original_width": width, "original_height": height, "image_rotation": 0,
                           "value": {"format": "rle", "rle": rle.encode_rgba(mask), "brushlabels": ["animal"]}})
        response = self.http.post(f"/api/tasks/{task['id']}/annotations/", params={"project": project_id},
                                  json={"result": result, "lead_time": 3.0, "project": project_id,
                                        "was_cancelled": cancelled})
        assert response.status_code == 201, response.text
        return int(response.json()["id"])


@pytest.fixture(scope="module")
def people(ls) -> list[Person]:
    return [Person(ls.url, ls.token) for _ in range(3)]


@pytest.fixture()
def world(ls):
    return review_world(ls.docroot / f"team-{uuid.uuid4().hex[:8]}", classes=CLASSES)


def _push(ls, world, people, **kwargs: Any):
    from curate.review.labelstudio import MediaSource
    from curate.review.labelstudio_team import push_team

    kwargs.setdefault("overlap", 2)
    return push_team(world.root, url=ls.url, token=ls.token, annotators=[p.email for p in people], all_samples=True,
                     media=MediaSource("local-files", document_root=ls.docroot), **kwargs)


def _pull(ls, world, url: str | None = None):
    from curate.review.labelstudio_team import pull_team

    return pull_team(world.root, url=url or ls.url, token=ls.token)


def _digest(world) -> str:
    return hashlib.sha256((world.root / "samples.parquet").read_bytes()).hexdigest()


def test_each_annotator_gets_a_project_with_their_queue_and_unknown_users_are_refused(ls, world, people) -> None:
    from curate.review.labelstudio_team import Team
    from curate.review.sync import ReviewError

    with pytest.raises(ReviewError, match="unknown annotator.*nobody@example.com"):
        _push(ls, world, [people[0], type("P", (), {"email": "nobody@example.com"})()])
    result = _push(ls, world, people)
    team = Team.load(world.root, result.title)
    assert team is not None and set(team.projects) == {p.email for p in people}
    for person in people:
        tasks = person.tasks(result.projects[person.email])  # each reads their queue with their own token
        assert sorted(t["data"]["sample_id"] for t in tasks) == sorted(team.plan.queues[person.email])
        assert all(not t["predictions"] for t in tasks)  # no pre-label: independent answers
    assert sum(result.loads.values()) == 2 * len(world.rows())
    assert max(result.loads.values()) - min(result.loads.values()) <= 1
    again = _push(ls, world, people)
    assert again.projects == result.projects and not any(again.imported.values())


def test_pull_keeps_every_annotation_and_records_changes_and_deletions(ls, world, people) -> None:
    from curate.store.annotations import current_annotations, load_annotations

    a, b, _c = people
    result = _push(ls, world, people[:2])  # two annotators, overlap 2: both label every photo
    before = _digest(world)
    two = world.backgrounds[:2]
    rows = {r["sample_id"]: r for r in world.rows()}
    painted = square_mask(32, 32, 8, 8, 12)
    ids: dict[tuple[str, str], int] = {}
    skipped_by_b: set[str] = set()
    for person, answer in ((a, [two[0]]), (b, [two[1]])):
        for i, task in enumerate(person.tasks(result.projects[person.email])):
            sid = task["data"]["sample_id"]
            bg = two if (person is a and i == 0) else answer  # a photo that shows two backgrounds
            mask = painted if (person is b and i == 0) else None
            assert (rows[sid]["width"], rows[sid]["height"]) == (32, 32)
            if person is b and i == 1:
                skipped_by_b.add(sid)
            ids[(person.email, sid)] = person.annotate(result.projects[person.email], task, bg, mask,
                                                       cancelled=person is b and i == 1)
    report = _pull(ls, world)
    assert report.upsert.counts["added"] == 2 * len(rows) and not report.problems, report.problems
    assert _digest(world) == before  # the folder's background is never written by one person here
    stored = current_annotations(world)
    assert {s.annotator for s in stored} == {a.email, b.email} and len(stored) == 2 * len(rows)
    assert all(s.backend == "labelstudio" and s.role == "annotator" and s.updated_at for s in stored)
    assert sum(len(s.backgrounds) == 2 for s in stored) == 1 and sum(s.skipped for s in stored) == 1
    with_mask = [s for s in stored if s.mask]
    assert len(with_mask) == 1
    from PIL import Image

    assert np.array_equal(np.array(Image.open(world.root / with_mask[0].mask)) > 0, painted > 0)
    assert report.skipped == {b.email: 1}
    again = _pull(ls, world)  # idempotent
    assert again.upsert.counts == {"added": 0, "changed": 0, "deleted": 0, "unchanged": 2 * len(rows)}
    answered_by_b = sorted(sid for (email, sid) in ids if email == b.email and sid not in skipped_by_b)
    changed_sid, deleted_sid = answered_by_b[0], answered_by_b[1]
    patch = b.http.patch(f"/api/annotations/{ids[(b.email, changed_sid)]}", json={"result": [
        {"id": "x1", "from_name": "background", "to_name": "image", "type": "choices", "value": {"choices": [two[0]]}}]})
    assert patch.status_code == 200, patch.text
    assert a.http.delete(f"/api/annotations/{ids[(a.email, deleted_sid)]}").status_code == 204
    third = _pull(ls, world)
    assert (third.upsert.counts["changed"], third.upsert.counts["deleted"]) == (1, 1), (third.upsert.counts, third.problems)
    states = {(r.annotator, r.sample_id, r.version): r.state for r in load_annotations(world)}
    assert states[(b.email, changed_sid, 1)] == "changed" and states[(b.email, changed_sid, 2)] == "current"
    assert states[(a.email, deleted_sid, 1)] == "deleted"


def test_bad_input_is_reported_per_annotator_and_loses_nothing(ls, world, people) -> None:
    from curate.store import Dataset
    from curate.store.annotations import current_annotations, write_gold

    a, b, c = people
    gold_sid = world.rows()[-1]["sample_id"]
    truth = world.row(gold_sid)["background"] or world.backgrounds[0]
    write_gold(world, {gold_sid: truth}, actor="adjudicator@example.com")
    result = _push(ls, world, people, gold_share=0.2)
    wrong = next(bg for bg in world.backgrounds if bg != truth)
    outside = twice = None
    for person in people:
        for task in person.tasks(result.projects[person.email]):  # whatever the queue's order
            sid = task["data"]["sample_id"]
            if person is c:
                person.annotate(result.projects[c.email], task, [], cancelled=True)  # skips everything
            elif sid == gold_sid:
                person.annotate(result.projects[person.email], task, [wrong if person is a else truth])
            elif person is a and outside is None:
                outside = sid
                person.annotate(result.projects[a.email], task, ["lava"])  # not a background of the dataset
            elif person is b and twice is None:
                twice = sid
                person.annotate(result.projects[b.email], task, [world.backgrounds[0]])
                person.annotate(result.projects[b.email], task, [world.backgrounds[1]])  # twice on one photo
    report = _pull(ls, world)
    text = "\n".join(report.problems)
    assert "'lava' not in the dataset's vocabulary" in text and outside in text
    assert f"{b.email} answered" in text and "2 times: the latest" in text
    assert f"{c.email} skipped every task" in text
    assert f"{a.email} answered 1 of 1 gold photo(s) wrongly: {gold_sid}: said {wrong}, gold {truth}" in text
    assert b.email not in report.gold_wrong and report.gold_seen.get(b.email) == 1
    assert report.unlabelled  # photos nobody labelled are listed
    Dataset.open(world.root)  # the folder stays valid (open validates the table)
    stored = current_annotations(world)
    b_rows = [s for s in stored if s.annotator == b.email and not s.is_gold]
    assert len(b_rows) == 1 and b_rows[0].backgrounds == (world.backgrounds[1],)  # the latest kept
    assert not any(s.sample_id == outside and s.annotator == a.email for s in stored)


class _DyingProxy(ThreadingHTTPServer):
    """Forwards to the real server, then stops answering after ``budget`` requests (a server that
    goes away mid-pull)."""

    def __init__(self, target: str, budget: int, deny: str | None = None) -> None:
        self.target, self.budget, self.deny = target, budget, deny
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def _forward(self) -> None:
                proxy.budget -= 1
                if proxy.budget < 0:
                    self.connection.close()  # no answer at all
                    return
                if proxy.deny and self.path.startswith(proxy.deny):
                    self.send_error(403, "not for this token")
                    return
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length")}
                answer = httpx.request(self.command, proxy.target + self.path, headers=headers, content=body, timeout=60)
                self.send_response(answer.status_code)
                for key, value in answer.headers.items():
                    if key.lower() not in ("content-length", "transfer-encoding", "connection", "content-encoding"):
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(answer.content)))
                self.end_headers()
                self.wfile.write(answer.content)

            do_GET = do_POST = do_PATCH = do_DELETE = _forward

            def log_message(self, *args: Any) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)

@contextmanager
def _serving(proxy: ThreadingHTTPServer) -> Iterator[str]:
    """``proxy`` served on a daemon thread for the block; yields its base URL, then shuts it down."""
    thread = threading.Thread(target=proxy.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{proxy.server_address[1]}"
    finally:
        proxy.shutdown()
        proxy.server_close()



def test_a_server_that_stops_mid_pull_writes_nothing_and_the_next_pull_completes(ls, world, people) -> None:
    from curate.review.sync import ReviewError
    from curate.store import Dataset
    from curate.store.annotations import load_annotations

    result = _push(ls, world, people)
    for person in people:
        for task in person.tasks(result.projects[person.email]):
            person.annotate(result.projects[person.email], task, [world.backgrounds[0]])
    with _serving(_DyingProxy(ls.url, budget=3)) as url:  # users + the first export's calls, then silence
        with pytest.raises(ReviewError, match="nothing was written: pull again"):
            _pull(ls, world, url=url)
    assert load_annotations(world) == [] and not (world.root / "annotations.parquet").exists()
    Dataset.open(world.root)
    # a token that may not list users: refused, never stored under the server's numeric user ids
    with _serving(_DyingProxy(ls.url, budget=1000, deny="/api/users")) as url:
        with pytest.raises(ReviewError, match="cannot list the organization's users.*nothing was written"):
            _pull(ls, world, url=url)
    assert not (world.root / "annotations.parquet").exists()
    report = _pull(ls, world)
    assert report.upsert.counts["added"] == sum(len(result.loads) and v for v in result.loads.values())


def test_disputes_go_to_the_adjudicator_whose_answer_is_stored_as_gold(ls, world, people) -> None:
    from curate.review.labelstudio import MediaSource
    from curate.review.labelstudio_team import push_adjudication
    from curate.store.annotations import current_annotations, gold_answers

    a, b, judge = people
    result = _push(ls, world, [a, b])
    first, second = world.backgrounds[:2]
    for person, answer in ((a, first), (b, second)):
        for task in person.tasks(result.projects[person.email]):
            person.annotate(result.projects[person.email], task, [answer])
    _pull(ls, world)
    from curate.review.labelstudio_team import disputed_photos

    # two people, two different answers on every photo: a tie everywhere, so every photo is disputed
    assert disputed_photos(world.root, "majority") == sorted(r["sample_id"] for r in world.rows())
    disputed = disputed_photos(world.root, "majority")[:2]
    project_id, imported = push_adjudication(world.root, url=ls.url, token=ls.token, adjudicator=judge.email,
                                             disputed=disputed, media=MediaSource("local-files", document_root=ls.docroot))
    assert imported == 2
    tasks = judge.tasks(project_id)
    assert {t["data"]["sample_id"] for t in tasks} == set(disputed)
    assert all(a.email in t["data"]["answers"] and second in t["data"]["answers"] for t in tasks)
    for task in tasks:
        judge.annotate(project_id, task, [second])
    report = _pull(ls, world)
    assert report.adjudicated == 2 and report.upsert.counts["added"] == 2
    rows = [s for s in current_annotations(world) if s.role == "adjudicator"]
    assert {s.annotator for s in rows} == {judge.email} and all(s.is_gold for s in rows)
    assert gold_answers(current_annotations(world)) == {sid: (second,) for sid in disputed}
    # the community edition shows every project to every member: an answer in someone else's queue
    # is stored under who gave it, and reported
    stray = judge.tasks(result.projects[a.email])[0]
    judge.annotate(result.projects[a.email], stray, [first])
    report = _pull(ls, world)
    assert report.upsert.counts["added"] == 1
    assert any(f"{judge.email} answered {stray['data']['sample_id']} in {a.email}'s queue" in p for p in report.problems)
    assert any(s.annotator == judge.email and s.role == "annotator" for s in current_annotations(world))


def test_the_cli_pushes_a_team_refuses_strangers_and_pulls_every_answer(ls, world, people, monkeypatch) -> None:
    from click.testing import CliRunner

    from curate.cli import main
    from curate.store.annotations import current_annotations

    monkeypatch.setenv("CURATE_LS_TOKEN", ls.token)
    runner = CliRunner(env={"COLUMNS": "200"})
    common = ["--url", ls.url, "--token-env", "CURATE_LS_TOKEN"]
    push = ["review", "labelstudio", str(world.root), *common, "--document-root", str(ls.docroot), "--all"]
    stranger = runner.invoke(main, [*push, "--annotators", f"{people[0].email},stranger@example.com"])
    assert stranger.exit_code == 1 and "unknown annotator(s)" in stranger.output and "stranger@example.com" in stranger.output
    assert not (world.root / ".review").exists() or not list((world.root / ".review").glob("labelstudio-team-*"))
    misuse = runner.invoke(main, [*push, "--gold-share", "0.1"])
    assert misuse.exit_code == 2 and "go with --annotators" in misuse.output
    result = runner.invoke(main, [*push, "--annotators", ",".join(p.email for p in people[:2]), "--overlap", "1",
                                  "--seed", "7"])
    assert result.exit_code == 0, result.output
    assert f"{people[0].email}: project" in result.output and "team file:" in result.output
    from curate.review.labelstudio_team import Team

    team = Team.load(world.root, f"curate: {world.name}")
    assert team is not None and team.plan.seed == 7 and team.plan.overlap == 1
    for person in people[:2]:
        for task in person.tasks(team.projects[person.email]):
            person.annotate(team.projects[person.email], task, [world.backgrounds[0]])
    dry = runner.invoke(main, ["review", "labelstudio", "pull", str(world.root), *common, "--dry-run"])
    assert dry.exit_code == 0 and "dry run: nothing was written" in dry.output, dry.output
    assert not (world.root / "annotations.parquet").exists()
    pulled = runner.invoke(main, ["review", "labelstudio", "pull", str(world.root), *common])
    assert pulled.exit_code == 0, pulled.output
    assert f"annotations: {len(world.rows())} added" in pulled.output
    assert len(current_annotations(world)) == len(world.rows())
