"""Issue 28: the clarity check ranked two scales as one.

A masked sample's score is ``1 - mask share``; a maskless one's is ``1 - GradCAM proxy share``
(the share of the image where GradCAM >= 0.5 of its max). The two shares are not on one scale:
a proxy region is typically much smaller than an object's mask, so in a mixed world the maskless
samples took the top of the ranking (16 of the top 18 in the report) whatever their real clarity.
The check now ranks each source on its own scale (a within-source rank percentile,
curate/audit/clarity.py), records which scale each sample's score came from, and leaves a
one-source world's ranking exactly as it was.

The mixed world here fabricates the raw shares through the check's own code path: masks are
real PNG files read by ``mask_array``; the proxy's shares come from a stand-in for
:func:`curate.audit.clarity.saliency_shares` (the GradCAM pass, which needs a model), built so the
two scales differ by construction: mask shares in [0.25, 0.75] (raw score 0.25-0.75), proxy
shares in [0.02, 0.30] (raw score 0.70-0.98).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from curate.audit import clarity as clarity_module
from curate.audit.base import AuditInputs
from curate.audit.clarity import clarity_check
from curate.audit.combine import ranks, top_candidates

MASK_PIXELS = 20 * 20
N_MASK, N_PROXY = 120, 80


def _write_mask(path: Path, share: float) -> float:
    """A 20 x 20 mask with round(share x 400) object pixels; returns its exact share."""
    count = int(round(share * MASK_PIXELS))
    flat = np.zeros(MASK_PIXELS, np.uint8)
    flat[:count] = 255
    Image.fromarray(flat.reshape(20, 20), mode="L").save(path)
    return count / MASK_PIXELS


def _world(tmp_path: Path, n_mask: int, n_proxy: int, *, seed: int = 0, ties: bool = False
           ) -> tuple[AuditInputs, dict[str, float], np.ndarray]:
    """Inputs of ``n_mask + n_proxy`` samples in shuffled order; the proxy's fabricated shares by
    image path; which samples have a mask. ``ties``: shares on a coarse grid (many equal scores)."""
    rng = np.random.default_rng(seed)
    has_mask = np.array([True] * n_mask + [False] * n_proxy)
    rng.shuffle(has_mask)
    pixels = iter(rng.choice(np.arange(100, 301), n_mask, replace=False))  # distinct mask shares in [0.25, 0.75]
    ids, images, masks, proxy = [], [], [], {}
    for i, masked in enumerate(has_mask):
        ids.append(f"s{i:04d}")
        image = tmp_path / f"s{i:04d}.png"  # never opened: the proxy is fabricated
        images.append(image)
        if masked:
            share = int(next(pixels)) / MASK_PIXELS
            share = round(share * 10) / 10 if ties else share
            path = tmp_path / f"m{i:04d}.png"
            _write_mask(path, share)
            masks.append(path)
        else:
            share = rng.uniform(0.02, 0.30)
            proxy[str(image)] = round(share * 20) / 20 if ties else share
            masks.append(None)
    inputs = AuditInputs(ids=ids, classes=np.zeros(len(ids), np.int64), image_paths=images, mask_paths=masks,
                         label_columns=np.array([0]), model=object(), classifier=object())
    return inputs, proxy, has_mask


@pytest.fixture()
def fake_proxy(monkeypatch):
    """Replace the GradCAM pass with fabricated shares (the rest of the check runs as in an audit)."""
    table: dict[str, float] = {}

    def saliency_shares(model, paths, labels, classifier, columns, *, batch_size=32):
        return np.array([table[str(p)] for p in paths], dtype=np.float64), {}

    monkeypatch.setattr(clarity_module, "saliency_shares", saliency_shares)
    return table


def _run(inputs, proxy, table):
    table.clear()
    table.update(proxy)
    return clarity_check(inputs, None)


def test_a_mixed_world_holds_both_sources_in_proportion(tmp_path, fake_proxy) -> None:
    inputs, proxy, has_mask = _world(tmp_path, N_MASK, N_PROXY)
    result = _run(inputs, proxy, fake_proxy)
    n = N_MASK + N_PROXY
    assert np.isfinite(result.scores).all()
    share = result.detail["columns"]["object_share"]
    old = 1.0 - share  # the old score: every source's raw 1 - share on one scale
    # by construction the old ranking is dominated by the maskless samples
    old_top = np.argsort(-old, kind="stable")[:20]
    assert (~has_mask[old_top]).sum() >= 16

    # the precise claim: for EVERY k, the top k (by the check's score, the order ranks() and
    # the tags use) holds each source within half a sample of its share of the scored samples,
    # |#mask in top k - k x 120/200| <= 1/2 (so the same for the proxy)
    order = np.argsort(ranks(result.scores))
    for k in range(1, n + 1):
        masked = int(has_mask[order[:k]].sum())
        assert abs(masked - k * N_MASK / n) <= 0.5, (k, masked)
    # the pre-tags (top 10%): exactly 12 by mask share and 8 by the proxy
    tagged = top_candidates(result.scores, 0.1)
    assert len(tagged) == 20 and has_mask[tagged].sum() == 12 and (~has_mask[tagged]).sum() == 8
    # and within each source the order is the raw score's (the most suspect of each still first)
    for source in (has_mask, ~has_mask):
        within = np.flatnonzero(source)
        assert np.array_equal(np.argsort(-result.scores[within], kind="stable"),
                              np.argsort(-old[within], kind="stable"))

    # which scale each sample's score came from is recorded, per sample and in total
    cols = result.detail["columns"]
    assert np.array_equal(np.isfinite(cols["mask_share"]), has_mask)
    assert np.array_equal(np.isfinite(cols["proxy_share"]), ~has_mask)
    np.testing.assert_allclose(cols["mask_share"][has_mask], share[has_mask])
    np.testing.assert_allclose(cols["proxy_share"][~has_mask], share[~has_mask])
    assert result.detail["scales"] == {"mask share": N_MASK, "GradCAM proxy": N_PROXY}
    assert result.detail["ranking"] == "within-source rank percentile"
    assert any("120 by mask share, 80 by GradCAM proxy, each ranked within its own scale" in note
               for note in result.notes)


@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("which", ["mask", "proxy"])
def test_a_one_source_world_ranks_exactly_as_before(tmp_path, fake_proxy, which, ties) -> None:
    n_mask, n_proxy = (60, 0) if which == "mask" else (0, 60)
    inputs, proxy, has_mask = _world(tmp_path, n_mask, n_proxy, seed=1, ties=ties)
    result = _run(inputs, proxy, fake_proxy)
    old = 1.0 - result.detail["columns"]["object_share"]  # the old score, formula unchanged
    if ties:
        assert len(np.unique(old)) < len(old) // 2  # many ties: they must break as before (sample order)
    assert np.array_equal(ranks(result.scores), ranks(old))
    for fraction in (0.05, 0.1, 0.2, 0.5):
        assert np.array_equal(top_candidates(result.scores, fraction), top_candidates(old, fraction))
    assert result.detail["scales"] == ({"mask share": 60, "GradCAM proxy": 0} if which == "mask"
                                       else {"mask share": 0, "GradCAM proxy": 60})
    assert not any("each ranked within its own scale" in note for note in result.notes)  # nothing mixed to say


def test_unscored_samples_stay_unscored_and_do_not_count_in_their_source(tmp_path, fake_proxy) -> None:
    inputs, proxy, has_mask = _world(tmp_path, 10, 10, seed=2)
    lost = str(inputs.image_paths[int(np.flatnonzero(~has_mask)[0])])
    proxy[lost] = float("nan")  # e.g. a flat saliency map
    result = _run(inputs, proxy, fake_proxy)
    assert np.isnan(result.scores).sum() == 1 and result.detail["scales"] == {"mask share": 10, "GradCAM proxy": 9}
    proxied = np.isfinite(result.detail["columns"]["proxy_share"])
    # each source's percentiles span its own scale: (r - 0.5) / n_source
    np.testing.assert_allclose(np.sort(result.scores[has_mask]), (np.arange(1, 11) - 0.5) / 10)
    np.testing.assert_allclose(np.sort(result.scores[proxied]), (np.arange(1, 10) - 0.5) / 9)


@pytest.mark.usefixtures("one_thread")
def test_an_audit_of_a_half_masked_world_records_each_samples_scale(tmp_path) -> None:
    """End to end: a synthetic world whose odd samples lost their mask, the real GradCAM proxy of a
    tiny random CLIP; the run's table says which scale each score came from, the tags hold both."""
    from curate.collect.synthetic import DEFAULT_CLASSES, WorldSpec, generate_world, png_bytes
    from curate.models import load_model
    from curate.runs import AuditRun
    from curate.stages.audit import AuditSettings, audit
    from curate.store import Dataset, NewSample

    samples = list(generate_world(WorldSpec(classes=DEFAULT_CLASSES[:2], per_class=10, image_size=32, seed=5)))
    ds = Dataset.create(tmp_path / "half", name="half", backgrounds=["snow", "water"])
    ds.add_samples([NewSample(image=png_bytes(s.image), class_index=s.cls.imagenet_index, source="folder",
                              source_id=str(s.index), license="CC0-1.0", mask=s.mask if n % 2 == 0 else None)
                    for n, s in enumerate(samples)], actor="test")
    vit = load_model("curate-tiny-vit", None, device="cpu", seed=0)
    run = AuditRun.load(audit(ds.root, vit, AuditSettings(checks=("clarity",), device="cpu", tag_fraction=0.2),
                              run_name="half").run_dir)
    summary = run.summary("clarity")
    masked = np.isfinite(run.column("clarity", "mask_share"))
    proxied = np.isfinite(run.column("clarity", "proxy_share"))
    has_mask = np.array([Dataset.open(ds.root).row(sid)["mask_path"] is not None for sid in run.sample_ids])
    assert np.array_equal(masked, has_mask) and not (masked & proxied).any()
    assert summary.detail["scales"] == {"mask share": 10, "GradCAM proxy": int(proxied.sum())} and proxied.sum() >= 8
    assert summary.detail["ranking"] == "within-source rank percentile"
    assert any("10 by mask share" in n and "each ranked within its own scale" in n for n in summary.notes)
    tagged = np.array([sid in run.tagged("clarity") for sid in run.sample_ids])
    n = int(masked.sum() + proxied.sum())
    assert tagged.sum() == int(np.ceil(0.2 * n))
    assert abs((tagged & masked).sum() - tagged.sum() * masked.sum() / n) <= 0.5
