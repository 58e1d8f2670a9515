"""The planted-place world's fill helpers, shared by tests/test_collect_fill.py and benchmarks/fill.py:
a labelled folder from the world's truth, steered and unsteered fills and their hit rates, fills
ranked by a CLIP's background embedding, the risk ratio's interval, and the plan's predicted
half-width against the one measured after a fill."""
from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import numpy as np
from fake_inat import FakeINat

from curate.collect.fill import Place, fill_group, learn_steering
from curate.collect.http import RetryPolicy
from curate.collect.inat import INatClass, collect_inat, make_client
from curate.metrics.bootstrap import bootstrap_groups
from curate.runs.split import SplitClass, SplitRun
from curate.split.discovery import SplitRule
from curate.split.plan import Z95, make_plan
from curate.store import Dataset

FAST = RetryPolicy(max_attempts=2, backoff_base=0.01, backoff_max=0.02, jitter=0.0)
OSTRICH = 9


def client_for(server: FakeINat):
    """A collector client for the stand-in: no rate limits, fast retries."""
    return make_client(api_url=server.api_url, api_rate=None, download_rate=None, byte_rate=None, retry=FAST)


def labelled_world(server: FakeINat, root: Path, per_class: int = 150) -> Path:
    """The ``per_class`` newest ostrich photos, their backgrounds and groups set from the world's truth (what
    review and `curate split` would give)."""
    with client_for(server) as client:
        collect_inat(root, [INatClass(OSTRICH, "ostrich")], per_class=per_class, api_url=server.api_url,
                     client=client, concurrency=4, backgrounds=["grass", "snow", "water"])
    ds = Dataset.open(root)
    for background, group in (("snow", "hard"), ("grass", "easy"), ("water", None)):
        ids = [r["sample_id"] for r in ds.rows()
               if server.world.background_of(int(r["source_id"])) == background]
        ds.update(ids, {"background": background, "background_source": "human", "group": group,
                        "status": "accepted"}, actor="test", reason="planted truth")
    rows = ds.rows()
    n_easy, n_hard = (sum(r["group"] == g for r in rows) for g in ("easy", "hard"))
    row = SplitClass(OSTRICH, "ostrich", True, "planted", easy="grass", hard="snow", easy_acc=0.9, hard_acc=0.5,
                     drop=0.4, drop_ci=(0.2, 0.6), n_easy=n_easy, n_hard=n_hard)
    SplitRun(rule=SplitRule(), references=[], classes=[row]).write(root / "runs" / "split-planted")
    return root


def proposed_backgrounds(root: Path, server: FakeINat, steered: bool) -> list[str]:
    """The true backgrounds of the photos a steered (or unsteered) fill added to ``root``."""
    return [server.world.background_of(int(r["source_id"])) for r in Dataset.open(root).rows()
            if json.loads(r["extra"]).get("proposed_for", {}).get("steered") is steered]


def hit_rates(root: Path, server: FakeINat, n: int) -> dict[str, tuple[int, int]]:
    """Steered and unsteered fills of ``n`` photos each into ``root``: (landed in snow, fetched)."""
    with client_for(server) as client:
        for steer in (True, False):
            fill_group(root, {OSTRICH: n}, group="hard", steer=steer, api_url=server.api_url, client=client)
    fetched = {"steered": proposed_backgrounds(root, server, True),
               "unsteered": proposed_backgrounds(root, server, False)}
    return {name: (sum(b == "snow" for b in got), len(got)) for name, got in fetched.items()}


def embedding_hit_rates(root: Path, server: FakeINat, n: int, model: Any, work: Path,
                        over_fetch: float = 3.0) -> dict[str, Any]:
    """Fills of ``n`` photos ranked by ``model``'s background embedding, each into a fresh copy of
    ``root`` (under ``work``): steered query (``embedding+steer``) and unsteered (``embedding``),
    as (landed in snow, fetched); and, on the unsteered over-fetched list, the share of snow in the
    top k (k = the snow photos listed) when it is ranked by the embedding and by place and month
    (``precision``: {name: (hits, k)})."""
    out: dict[str, Any] = {}
    steering = learn_steering(Dataset.open(root).rows(), OSTRICH, "hard")
    where = {p.id: o for o in server.world.observations for p in o.photos}
    for name, steer in (("embedding+steer", True), ("embedding", False)):
        copy = work / name
        shutil.copytree(root, copy)
        with client_for(server) as client:
            report = fill_group(copy, {OSTRICH: n}, group="hard", steer=steer, over_fetch=over_fetch, model=model,
                                api_url=server.api_url, client=client)
        ranked = [int(sid) for sid, _ in report.classes[0].ranked]
        snow = [server.world.background_of(sid) == "snow" for sid in ranked]
        out[name] = (sum(snow[:n]), len(snow[:n]))
        if not steer:
            k = sum(snow)
            by_place = sorted(range(len(ranked)), key=lambda i: -steering.score(
                Place(where[ranked[i]].lat, where[ranked[i]].lng, where[ranked[i]].month)))
            out["precision"] = {"embedding": (sum(snow[:k]), k), "place-month": (sum(snow[i] for i in by_place[:k]), k)}
        shutil.rmtree(copy)
    return out


def ratio_interval(k1: int, n1: int, k2: int, n2: int) -> tuple[float, float, float]:
    """Risk ratio (k1/n1) / (k2/n2) and its 95% Katz log interval (a 0.5 correction when k2 is 0)."""
    k2c, n2c = (k2, n2) if k2 else (0.5, n2 + 0.5)
    ratio = (k1 / n1) / (k2c / n2c)
    se = math.sqrt(max(0.0, 1 / k1 - 1 / n1 + 1 / k2c - 1 / n2c))
    return ratio, ratio * math.exp(-Z95 * se), ratio * math.exp(Z95 * se)


REFERENCE_ACCURACY = {"grass": 0.9, "snow": 0.5, "water": 0.7}


def plan_against_fetch(root: Path, server: FakeINat, seed: int = 0) -> tuple[float, float, float, float]:
    """Plan from the labelled photos (a simulated reference's outcomes), then measure the bootstrap
    half-width once the steered photos that landed in snow join the hard group: (low, predicted,
    high, measured)."""
    rng = np.random.default_rng(seed)
    rows = Dataset.open(root).rows()

    def outcomes(selected: list[dict]) -> np.ndarray:
        backgrounds = [server.world.background_of(int(r["source_id"])) for r in selected]
        return np.array([rng.random() < REFERENCE_ACCURACY[b] for b in backgrounds], dtype=float)

    easy = outcomes([r for r in rows if r["group"] == "easy"])
    hard = outcomes([r for r in rows if r["group"] == "hard"])
    new = outcomes([r for r in rows if json.loads(r["extra"]).get("proposed_for", {}).get("steered") is True
                    and server.world.background_of(int(r["source_id"])) == "snow"])

    def drop_interval(hard_outcomes: np.ndarray) -> tuple[float, float]:
        correct = np.r_[easy, hard_outcomes]
        groups = np.array(["easy"] * easy.size + ["hard"] * hard_outcomes.size, dtype=object)
        boot = bootstrap_groups(correct, np.zeros(correct.size, int), groups, n_boot=4000, seed=seed)["drop"]
        return boot.low, boot.high

    row = SplitClass(OSTRICH, "ostrich", True, "planted", easy="grass", hard="snow", easy_acc=easy.mean(),
                     hard_acc=hard.mean(), drop=easy.mean() - hard.mean(), drop_ci=drop_interval(hard),
                     n_easy=easy.size, n_hard=hard.size)
    plan = make_plan(SplitRun(rule=SplitRule(), references=[], classes=[row]), [], half_width=0.05)
    low, predicted, high = plan.classes[0].predict(easy.size, hard.size + new.size)
    after = drop_interval(np.r_[hard, new])
    return low, predicted, high, (after[1] - after[0]) / 2
