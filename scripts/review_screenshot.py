"""Make docs/fiftyone-app.png: the FiftyOne App, launched by curate, on a demo-like dataset.

    .venv/bin/python scripts/review_screenshot.py [--out docs/fiftyone-app.png]

Builds the demo's evaluation world (6 classes, 48 px, uncorrelated backgrounds), puts it in a
review state (a few candidates, missing and low-confidence model backgrounds, groups from the
ground truth) and applies some review tags as a reviewer would, starts curate's offline
MongoDB on a free port (nothing else of the machine is touched), pushes with
``curate.review.fiftyone.push_fiftyone``, launches the App on 127.0.0.1 and captures it with
headless Chromium (curate.review.browser). About 40 s.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "fiftyone-app.png")
    parser.add_argument("--per-class", type=int, default=6)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    for noisy in ("fiftyone", "httpx", "curate.store"):
        logging.getLogger(noisy).setLevel(logging.WARNING)

    from curate.collect.synthetic import (
        DEFAULT_CLASSES,
        WorldSpec,
        assign_truth_groups,
        collect_synthetic,
    )
    from curate.review.browser import HeadlessChromium
    from curate.review.database import free_port, start_mongod
    from curate.review.provision import provision_mongod

    work = Path(tempfile.mkdtemp(prefix="curate-screenshot-"))
    server = start_mongod(work / "db", binaries=provision_mongod())
    os.environ.update(FIFTYONE_DATABASE_URI=server.uri, FIFTYONE_DATABASE_VALIDATION="false", FIFTYONE_DO_NOT_TRACK="true")
    session = None
    try:
        base = WorldSpec(classes=DEFAULT_CLASSES[:6], per_class=args.per_class, image_size=48, seed=1000)
        ds = collect_synthetic(work / "demo-eval", replace(base, p=base.uncorrelated_p), name="demo-eval")
        assign_truth_groups(ds)
        rows = ds.rows()
        per_sample = {}
        for i, row in enumerate(rows):
            k = i % args.per_class
            if k == 0:
                per_sample[row["sample_id"]] = {"status": "candidate"}
            elif k == 1:
                per_sample[row["sample_id"]] = {"background": None, "background_source": None, "background_score": None}
            elif k == 2:
                per_sample[row["sample_id"]] = {"background_source": "model", "background_score": 0.3 + 0.02 * i}
        ds.update(list(per_sample), per_sample=per_sample, actor="screenshot", reason="review-like state")

        from curate.review.fiftyone import app_url, import_fiftyone, push_fiftyone

        result = push_fiftyone(ds.root, name="demo-eval")
        fo = import_fiftyone()
        dataset = fo.load_dataset(result.name)
        ids = [r["sample_id"] for r in rows]
        # what a reviewer does in the App: tag decisions (pulled back by `curate review pull`)
        reviewer_tags = {0: ["reject:clarity"], 1: ["bg:water"], 6: ["accept", "mask:ok"], 7: ["bg:sand"],
                         12: ["reject:obscurity"], 13: ["bg:grass"], 18: ["accept"], 19: ["bg:snow"]}
        for index, tags in reviewer_tags.items():
            if index < len(ids):
                dataset.select_by("sample_id", [ids[index]]).tag_samples(tags)
        port = free_port()
        session = fo.launch_app(dataset, port=port, address="127.0.0.1", remote=True)
        url = app_url("127.0.0.1", port, result.name)
        with HeadlessChromium(size=(1440, 900), install=False) as browser:
            page = browser.open()
            page.before_load("localStorage.setItem('fiftyone-enterprise-tooltip-seen', 'true');")
            page.navigate(url)
            page.wait_for(f"document.body && document.body.innerText.includes('{len(rows)} samples')", timeout=120)
            page.wait_for("!!document.querySelector('[data-cy=\"checkbox-tags\"]')", timeout=30)
            page.click('[data-cy="checkbox-tags"]')  # show the sample tags on the tiles
            page.wait_for("""(() => { const cs = Array.from(document.querySelectorAll('canvas')).filter(c => c.width > 50);
                return cs.length >= 12 && cs.every(c => { const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
                  const s = new Set(); for (let i = 0; i < d.length; i += 64) s.add(d[i] + ',' + d[i+1]); return s.size > 20; }); })()""",
                          timeout=60)
            import time

            time.sleep(2)  # let the tag badges settle
            shot = page.screenshot(args.out)
        print(f"wrote {shot} ({shot.stat().st_size} bytes)")
    finally:
        if session is not None:
            try:
                session.close()
            except Exception:  # noqa: BLE001
                pass
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
