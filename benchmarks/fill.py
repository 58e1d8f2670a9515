"""Measurement: the steered fill (``curate collect inat --fill``) against an unsteered fetch of the
same size, on the iNaturalist stand-in's planted-place world, where each photo's background is
known (tests/fake_inat.py:make_place_world: snow in the north in the cold months, water on a coast
band, grass elsewhere).

For each world (seeds 1-3): collect the ``--base`` newest photos of one taxon, label them with the
world's truth (snow = hard), fill ``--n`` photos steered and ``--n`` unsteered (the newest not yet in
the folder), and count the fetched photos that landed on snow. Then ``curate plan``'s predicted
half-width after adding the steered snow photos is set against the bootstrap half-width measured on
them (a simulated reference: 90% right on grass, 50% on snow). Prints each world's figures and the
pooled hit rates (95% Wilson) with their risk ratio (95% Katz). This is the table in docs/results.md
("Filling thin hard groups") and docs/science.md; it is a measurement of accuracy, not of speed, so it has
no peer tool (no tool in this field steers collection). CPU time is printed beside wall time.

With ``--model SPEC`` (a CLIP; ``curate-tiny-clip`` = random weights, seed 0) each world is also
filled with the candidates ranked by the CLIP's background embedding (``--fill --model``), with the
query steered and unsteered (each ``--n`` photos from ``3 * --n`` candidates, in a fresh copy of the
folder), and the unsteered candidate list is ranked both ways: the share of snow photos in its top k
(k = the snow photos it holds) by embedding and by place and month. The stand-in's photos are
tinted by their background (tests/fake_inat.py:photo_jpeg), so this measures the mechanism, not how
well a real CLIP sees real backgrounds::

    .venv/bin/python benchmarks/fill.py [--n 100] [--base 300] [--seeds 1,2,3] [--model curate-tiny-clip [--pretrained TAG]]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))

from fake_inat import FakeINat, make_place_world  # noqa: E402
from fill_helpers import embedding_hit_rates, hit_rates, labelled_world, plan_against_fetch, ratio_interval  # noqa: E402

from curate.split.plan import wilson  # noqa: E402
from curate.store import Dataset  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=100, help="photos fetched each way, per world")
    parser.add_argument("--base", type=int, default=300, help="labelled photos in the folder before the fill")
    parser.add_argument("--seeds", default="1,2,3", help="the worlds (comma-separated seeds)")
    parser.add_argument("--model", help="also rank by this CLIP's background embedding (curate-tiny-clip with no "
                                        "--pretrained: random weights, seed 0)")
    parser.add_argument("--pretrained", help="--model's tag or weights file, as `curate discover` takes it")
    args = parser.parse_args()
    model = None
    if args.model:
        from curate.models import load_model

        model = load_model(args.model, args.pretrained, seed=0)
    wall, cpu = time.perf_counter(), time.process_time()
    pooled = {"steered": [0, 0], "unsteered": [0, 0]}
    if model is not None:
        pooled.update({"embedding+steer": [0, 0], "embedding": [0, 0], "top-k by embedding": [0, 0],
                       "top-k by place-month": [0, 0]})
    for seed in (int(s) for s in args.seeds.split(",")):
        with FakeINat(make_place_world(n_per_taxon=4000, seed=seed)) as server, \
                tempfile.TemporaryDirectory() as tmp:
            root = labelled_world(server, Path(tmp) / "ds", per_class=args.base)
            n_hard = len(Dataset.open(root).ids(group="hard"))
            rates = hit_rates(root, server, args.n)
            for name, (hits, fetched) in rates.items():
                pooled[name][0] += hits
                pooled[name][1] += fetched
            if model is not None:
                ranked = embedding_hit_rates(root, server, args.n, model, Path(tmp))
                precision = ranked.pop("precision")
                ranked["top-k by embedding"], ranked["top-k by place-month"] = (precision["embedding"],
                                                                                precision["place-month"])
                for name, (hits, fetched) in ranked.items():
                    pooled[name][0] += hits
                    pooled[name][1] += fetched
                print(f"world {seed}, ranked by the background embedding: " + "; ".join(
                    f"{name} {hits} / {fetched}" for name, (hits, fetched) in ranked.items()), flush=True)
            low, predicted, high, measured = plan_against_fetch(root, server, seed)
            print(f"world {seed}: {n_hard} hard photos before; landed on snow: steered {rates['steered'][0]} / "
                  f"{rates['steered'][1]}, unsteered {rates['unsteered'][0]} / {rates['unsteered'][1]}; plan's "
                  f"half-width after the fill {100 * predicted:.2f} [{100 * low:.2f}, {100 * high:.2f}] points, "
                  f"measured {100 * measured:.2f}", flush=True)
    for name, (hits, fetched) in pooled.items():
        low, high = wilson(hits / fetched, fetched)
        what = ("of the unsteered list's snow photos ranked in its top k" if name.startswith("top-k")
                else "landed in the hard group")
        print(f"{name:20s} {hits} / {fetched} = {100 * hits / fetched:.1f}% [{100 * low:.1f}, {100 * high:.1f}] "
              f"{what} (95% Wilson)")
    ratio, low, high = ratio_interval(*pooled["steered"], *pooled["unsteered"])
    print(f"ratio     {ratio:.1f}x [{low:.1f}, {high:.1f}] (95% Katz); chance of landing on snow in this world "
          "is the unsteered rate")
    print(f"wall {time.perf_counter() - wall:.1f} s, CPU {time.process_time() - cpu:.1f} s (this process)")


if __name__ == "__main__":
    main()
