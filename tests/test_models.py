"""curate.models: loading by name, offline weights resolution, encode functions, ids, zoo.

Fast and offline: tiny configs (curate-tiny-vit / -rn / -clip) and timm's tiny test models,
CPU only. Every test runs with sockets disabled and with empty, private caches (HOME,
HF_HUB_CACHE, CURATE_WEIGHTS_DIR, TORCH_HOME point into tmp_path), so nothing can be
downloaded and a cached file on the developer's machine cannot make a test pass.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import pytest
import torch
from PIL import Image

import curate.models as cm
from curate.models import (
    LoadedModel,
    ModelError,
    ModelNotFoundError,
    QuickGELUWarning,
    WeightsNotFoundError,
    load_model,
    resolve_zoo_name,
)
from curate.models.weights import Checkpoint, hub_offline

REPO = Path(__file__).resolve().parents[1]
TINY_CLIPS = ["curate-tiny-vit", "curate-tiny-rn"]
TIMM_TINY = "timm:test_resnet"  # 160 px, 1000 classes, builds in milliseconds


# ----------------------------------------------------------------------------- fixtures
@pytest.fixture(autouse=True)
def offline_and_isolated(monkeypatch, tmp_path):
    """No sockets; empty private weight caches; HF_HUB_OFFLINE deliberately *unset*."""

    def refuse(*args, **kwargs):
        raise AssertionError("network access attempted")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setenv("CURATE_WEIGHTS_DIR", str(tmp_path / "curate-weights"))
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch-home"))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    yield


@pytest.fixture(scope="module")
def images() -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return torch.rand(3, 3, 32, 32, generator=g)


@pytest.fixture(scope="module")
def tiny_vit() -> LoadedModel:
    return load_model("curate-tiny-vit", seed=0)


TEXTS = ["a photo of a dog.", "a photo of a cat.", "a photo of a fox.", "snow", "grass", ""]


# ----------------------------------------------------------------------------- CLIP encode
@pytest.mark.parametrize("arch", TINY_CLIPS)
def test_tiny_clip_shapes_and_normalisation(arch, images):
    m = load_model(arch, seed=0)
    assert isinstance(m, LoadedModel) and m.kind == "clip"
    assert m.image_size == (32, 32)
    assert m.embed_dim == cm.TINY_CONFIGS[arch]["embed_dim"]
    assert m.tokenizer is not None and m.context_length == 16
    assert not m.module.training

    img = m.encode_image(images)
    assert img.shape == (3, m.embed_dim) and img.dtype == torch.float32
    torch.testing.assert_close(img.norm(dim=-1), torch.ones(3))
    raw = m.encode_image(images, normalize=False)
    assert not torch.allclose(raw.norm(dim=-1), torch.ones(3))
    torch.testing.assert_close(img, torch.nn.functional.normalize(raw, dim=-1))

    txt = m.encode_text(TEXTS)
    assert txt.shape == (len(TEXTS), m.embed_dim)
    torch.testing.assert_close(txt.norm(dim=-1), torch.ones(len(TEXTS)))
    # batched tokenisation gives the same embeddings as one batch
    torch.testing.assert_close(m.encode_text(TEXTS, batch_size=2), txt)
    assert m.encode_text([]).shape == (0, m.embed_dim)
    with pytest.raises(TypeError):
        m.encode_text("a photo of a dog.")
    with pytest.raises(TypeError, match="no fixed classifier head"):
        m.logits(images)


def test_preprocess_is_the_models_eval_transform(tiny_vit):
    im = Image.new("RGB", (100, 60), (200, 30, 30))
    x = tiny_vit.preprocess(im)
    assert tuple(x.shape) == (3, *tiny_vit.image_size)
    batch = tiny_vit.preprocess_images([im, im.convert("L")])
    assert batch.shape == (2, 3, 32, 32)
    assert tiny_vit.encode_image(batch).shape == (2, tiny_vit.embed_dim)
    with pytest.raises(ValueError, match=r"\[N, 3, H, W\]"):
        tiny_vit.encode_image(x)  # a single image without the batch dimension


def test_no_grad_by_default_grad_on_request(tiny_vit, images):
    assert not tiny_vit.encode_image(images).requires_grad
    assert tiny_vit.encode_image(images, grad=True).requires_grad


def test_precision_does_not_change_model_id_and_outputs_are_float32(images):
    ids = set()
    for precision in ("fp32", "bf16", "amp"):
        m = load_model("curate-tiny-vit", seed=0, precision=precision)
        ids.add(m.model_id)
        assert m.encode_image(images).dtype == torch.float32
        assert m.encode_text(TEXTS[:2]).dtype == torch.float32
    assert ids == {"open_clip:curate-tiny-vit:random-seed0"}
    with pytest.raises(ValueError, match="precision"):
        load_model("curate-tiny-vit", precision="fp8")


# ----------------------------------------------------------------------------- model ids
def test_model_ids_random_weights(images):
    a = load_model("curate-tiny-vit", seed=0)
    b = load_model("curate-tiny-vit", seed=0)
    c = load_model("curate-tiny-vit", seed=1)
    r = load_model("curate-tiny-vit")
    assert a.model_id == b.model_id == "open_clip:curate-tiny-vit:random-seed0"
    assert c.model_id == "open_clip:curate-tiny-vit:random-seed1"
    torch.testing.assert_close(a.encode_image(images), b.encode_image(images))
    assert not torch.allclose(a.encode_image(images), c.encode_image(images))
    # unseeded random weights: the id says "random" and is flagged as unsafe for caching
    assert r.model_id == "open_clip:curate-tiny-vit:random" and not r.cache_safe
    assert a.cache_safe and c.cache_safe
    assert load_model("curate-tiny-rn", seed=0).model_id == "open_clip:curate-tiny-rn:random-seed0"
    # seeding does not disturb the caller's RNG
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    load_model("curate-tiny-vit", seed=5)
    torch.testing.assert_close(torch.rand(3), expected)


def test_model_id_and_weights_stable_across_processes(tmp_path, tiny_vit, images):
    path = tmp_path / "w.pt"
    torch.save({"state_dict": tiny_vit.module.state_dict(), "curate": {"arch": "curate-tiny-vit"}}, path)
    torch.save(images, tmp_path / "images.pt")
    script = textwrap.dedent(f"""
        import json, torch
        from curate.models import load_model
        images = torch.load({str(tmp_path / "images.pt")!r})
        out = {{}}
        for key, (name, pre, seed) in {{"seed": ("curate-tiny-vit", None, 0),
                                        "file": ("auto", {str(path)!r}, None)}}.items():
            m = load_model(name, pre, seed=seed)
            out[key] = [m.model_id, m.encode_image(images).tolist()]
        print(json.dumps(out))
        """)
    env = {k: v for k, v in os.environ.items()}
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env, cwd=REPO
    )
    assert proc.returncode == 0, proc.stderr
    other = json.loads(proc.stdout.strip().splitlines()[-1])
    here_file = load_model("auto", path)
    assert other["seed"][0] == tiny_vit.model_id
    assert other["file"][0] == here_file.model_id
    torch.testing.assert_close(torch.tensor(other["seed"][1]), tiny_vit.encode_image(images))
    torch.testing.assert_close(torch.tensor(other["file"][1]), here_file.encode_image(images))


# ----------------------------------------------------------------------------- local files
def test_train_reference_file_round_trip(tmp_path, images):
    """The format curate train-reference writes, loaded by name, by 'auto' and by None."""
    src = load_model("curate-tiny-clip", seed=3)
    path = tmp_path / "ref.pt"
    meta = {"arch": "curate-tiny-clip", "classes": ["ostrich", "vulture"], "steps": 10}
    torch.save({"state_dict": src.module.state_dict(), "curate": meta}, path)
    sha = Checkpoint(path).sha256

    x = torch.rand(2, 3, 48, 48, generator=torch.Generator().manual_seed(1))
    want_img, want_txt = src.encode_image(x), src.encode_text(TEXTS)
    for name, pre in [
        ("curate-tiny-clip", path),
        ("auto", str(path)),
        (None, path),
        ("open_clip:curate-tiny-clip", path),
    ]:
        m = load_model(name, pre)
        assert m.model_id == f"open_clip:curate-tiny-clip:file-{sha[:12]}"
        assert m.cache_safe
        assert m.info["metadata"] == meta and m.info["sha256"] == sha
        assert m.info["weights_file"] == str(path)
        torch.testing.assert_close(m.encode_image(x), want_img, rtol=0, atol=0)
        torch.testing.assert_close(m.encode_text(TEXTS), want_txt, rtol=0, atol=0)
    json.dumps(m.info)  # provenance is JSON-serialisable


@pytest.mark.parametrize("arch", TINY_CLIPS)
def test_bare_state_dict_and_safetensors(tmp_path, arch, images):
    from safetensors.torch import save_file

    src = load_model(arch, seed=7)
    want = src.encode_image(images)
    bare = tmp_path / "bare.bin"
    torch.save(src.module.state_dict(), bare)
    assert torch.equal(load_model(arch, bare).encode_image(images), want)
    with pytest.raises(ModelNotFoundError, match="no curate metadata"):
        load_model("auto", bare)

    st = tmp_path / "w.safetensors"
    tensors = {k: v.contiguous() for k, v in src.module.state_dict().items()}
    save_file(tensors, str(st), metadata={"curate": json.dumps({"arch": arch})})
    m = load_model(None, st)
    assert m.model_id.startswith(f"open_clip:{arch}:file-")
    assert torch.equal(m.encode_image(images), want)
    # two files with the same weights but different bytes have different ids
    assert m.model_id != load_model(arch, bare).model_id


def test_torchscript_archive_like_openai_ships(tmp_path, tiny_vit, images):
    """OpenAI's .pt files are TorchScript archives: read their state dict, not via pickle."""
    path = tmp_path / "ViT-tiny.pt"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.jit.script(tiny_vit.module).save(str(path))
    m = load_model("curate-tiny-vit", path)
    assert torch.equal(m.encode_image(images), tiny_vit.encode_image(images))


def test_weights_that_do_not_fit_the_architecture(tmp_path, tiny_vit):
    path = tmp_path / "vit.pt"
    torch.save({"state_dict": tiny_vit.module.state_dict(), "curate": {"arch": "curate-tiny-vit"}}, path)
    with pytest.warns(UserWarning, match="saved from 'curate-tiny-vit'"):
        with pytest.raises(ModelError, match="do not fit open_clip architecture 'curate-tiny-rn'"):
            load_model("curate-tiny-rn", path)


def test_bad_weight_files(tmp_path):
    with pytest.raises(WeightsNotFoundError, match="does not exist"):
        load_model("curate-tiny-vit", tmp_path / "missing.pt")
    with pytest.raises(WeightsNotFoundError, match="missing.pt"):
        load_model("curate-tiny-vit", "./missing.pt")
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"this is not a checkpoint")
    with pytest.raises(ModelError, match="could not read weights file"):
        load_model("curate-tiny-vit", junk)

    import argparse

    evil = tmp_path / "evil.pt"  # arbitrary pickled objects are refused (weights_only loading)
    torch.save({"state_dict": {"w": torch.zeros(1)}, "args": argparse.Namespace(lr=0.1)}, evil)
    with pytest.raises(ModelError, match="weights_only"):
        load_model("curate-tiny-vit", evil)


# ----------------------------------------------------------------------------- offline tags
def _register_fake_tag(monkeypatch, arch: str, tag: str, **cfg) -> None:
    from open_clip import pretrained as ocp

    tags = dict(ocp._PRETRAINED.get(arch, {}))
    tags[tag] = ocp._pcfg(**cfg)
    monkeypatch.setitem(ocp._PRETRAINED, arch, tags)


def _fake_hf_cache(root: Path, repo: str, filename: str, tensors: dict, with_ref: bool = True) -> Path:
    repo_dir = root / f"models--{repo.replace('/', '--')}"
    snap = repo_dir / "snapshots" / "0123abcd"
    snap.mkdir(parents=True)
    if with_ref:
        (repo_dir / "refs").mkdir()
        (repo_dir / "refs" / "main").write_text("0123abcd")
    torch.save(tensors, snap / filename)
    return snap / filename


@pytest.mark.parametrize("with_ref", [True, False])
def test_tag_resolves_from_hf_cache(tmp_path, monkeypatch, tiny_vit, images, with_ref):
    _register_fake_tag(
        monkeypatch, "curate-tiny-vit", "fake_hub", hf_hub="curate-test/tiny-vit/", mean=(0.5, 0.5, 0.5)
    )
    _fake_hf_cache(
        tmp_path / "hf-cache",
        "curate-test/tiny-vit",
        "open_clip_pytorch_model.bin",
        tiny_vit.module.state_dict(),
        with_ref,
    )
    m = load_model("curate-tiny-vit", "fake_hub")
    assert m.model_id == "open_clip:curate-tiny-vit:fake_hub"
    assert m.info["pretrained"] == "fake_hub" and "open_clip_pytorch_model.bin" in m.info["weights_file"]
    torch.testing.assert_close(m.encode_image(images), tiny_vit.encode_image(images))
    # the tag's preprocessing applies (mean 0.5), as open_clip would apply it
    assert tuple(m.info["preprocess"]["mean"]) == (0.5, 0.5, 0.5)


def test_tag_resolves_from_url_caches(tmp_path, monkeypatch, tiny_vit, images):
    url = "https://example.invalid/weights/tiny-vit-0badc0de.pt"
    _register_fake_tag(monkeypatch, "curate-tiny-vit", "fake_url", url=url)
    with pytest.raises(WeightsNotFoundError) as err:
        load_model("curate-tiny-vit", "fake_url")
    assert "tiny-vit-0badc0de.pt" in str(err.value) and "tiny-vit-0badc0de.pt" in err.value.missing
    clip_cache = Path(os.environ["HOME"]) / ".cache" / "clip"
    clip_cache.mkdir(parents=True)
    torch.save(tiny_vit.module.state_dict(), clip_cache / "tiny-vit-0badc0de.pt")
    m = load_model("curate-tiny-vit", "fake_url")
    torch.testing.assert_close(m.encode_image(images), tiny_vit.encode_image(images))
    assert m.model_id == "open_clip:curate-tiny-vit:fake_url"


def test_tag_resolves_from_curate_weights_dir(tmp_path, monkeypatch, tiny_vit, images):
    _register_fake_tag(monkeypatch, "curate-tiny-vit", "fake_local", hf_hub="curate-test/tiny-vit-local/")
    target = Path(os.environ["CURATE_WEIGHTS_DIR"]) / "curate-test" / "tiny-vit-local"
    target.mkdir(parents=True)
    torch.save(tiny_vit.module.state_dict(), target / "open_clip_pytorch_model.bin")
    m = load_model("curate-tiny-vit", "fake_local")
    torch.testing.assert_close(m.encode_image(images), tiny_vit.encode_image(images))


@pytest.mark.parametrize(
    "name, pretrained, filenames",
    [
        (
            "CLIP-LAION400M-ViT-B/32",
            None,
            ["open_clip_pytorch_model.bin", "vit_b_32-quickgelu-laion400m_e31-d867053b.pt"],
        ),
        ("ViT-B-32-quickgelu", "laion400m_e31", ["open_clip_pytorch_model.bin"]),
        (
            "CLIP-LAION2B-ViT-bigG/14",
            None,
            ["open_clip_pytorch_model.bin", "laion/CLIP-ViT-bigG-14-laion2B-39B-b160k"],
        ),
        ("timm:resnet18", "a1_in1k", ["pytorch_model.bin", "resnet18_a1_0-d63eafa0.pth"]),
    ],
)
def test_missing_weights_fail_fast_without_network(monkeypatch, name, pretrained, filenames):
    """Hub offline mode is off and sockets raise: the error must come from curate, at once."""
    import huggingface_hub.constants as hc

    monkeypatch.setattr(hc, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    assert "HF_HUB_OFFLINE" not in os.environ
    start = time.monotonic()
    with pytest.raises(WeightsNotFoundError) as err:
        load_model(name, pretrained)
    elapsed = time.monotonic() - start
    assert elapsed < 5.0, f"took {elapsed:.1f} s"
    message = str(err.value)
    for fn in filenames:
        assert fn in message
    assert "never downloads" in message and "pretrained=" in message
    assert isinstance(err.value, FileNotFoundError)
    assert "HF_HUB_OFFLINE" not in os.environ and hc.HF_HUB_OFFLINE is False  # hub_offline() restored them


def test_hub_offline_restores_state(monkeypatch):
    import huggingface_hub.constants as hc

    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    before = hc.HF_HUB_OFFLINE
    with hub_offline():
        assert os.environ["HF_HUB_OFFLINE"] == "1" and hc.HF_HUB_OFFLINE is True
    assert os.environ["HF_HUB_OFFLINE"] == "0" and hc.HF_HUB_OFFLINE == before


# ----------------------------------------------------------------------------- names
@pytest.mark.parametrize(
    "name, pretrained, expected",
    [
        ("ViT-B-33", None, "ViT-B-32"),
        ("CLIP-OpenAI-ViT-B/33", None, "CLIP-OpenAI-ViT-B/32"),
        ("resnet50", None, "timm:resnet50"),
        ("timm:resnet19", None, "resnet18"),
        ("timm:resnet18", "a1_in2k", "a1_in1k"),
        ("ViT-B-32-quickgelu", "laion400m_e99", "laion400m_e31"),
        ("ViT-B-16-quickgelu", "laion400m_e31", "ViT-B-16"),  # tag exists only for the GELU arch
        ("hf-hub:org/repo", None, "open_clip, timm"),
        ("auto", None, "local weights file"),
    ],
)
def test_unknown_names_and_tags(name, pretrained, expected):
    start = time.monotonic()
    with pytest.raises(ModelNotFoundError) as err:
        load_model(name, pretrained)
    assert expected in str(err.value)
    assert isinstance(err.value, LookupError)
    assert time.monotonic() - start < 5.0


def test_quickgelu_mismatch_warns():
    with pytest.warns(QuickGELUWarning, match="ViT-B-32-quickgelu"):
        with pytest.raises(WeightsNotFoundError):
            load_model("ViT-B-32", "openai")
    with warnings.catch_warnings():
        warnings.simplefilter("error", QuickGELUWarning)
        with pytest.raises(WeightsNotFoundError):
            load_model("CLIP-OpenAI-ViT-B/32")  # the zoo carries the right architecture


# ----------------------------------------------------------------------------- zoo
def test_zoo_entries_are_registered_open_clip_pretrained():
    import open_clip

    registered = set(open_clip.list_pretrained())
    zoo = cm.load_zoo()
    assert len(zoo) >= 20
    for name, entry in zoo.items():
        assert (entry.model, entry.pretrained) in registered, name
        assert open_clip.get_model_config(entry.model) is not None, name


def test_zoo_quickgelu_mapping():
    """Weights trained with QuickGELU map to a QuickGELU architecture, and only those."""
    import open_clip

    for name, (model, tag) in cm.load_zoo().items():
        tag_qg = bool(open_clip.get_pretrained_cfg(model, tag).get("quick_gelu", False))
        arch_qg = bool(open_clip.get_model_config(model).get("quick_gelu", False))
        assert tag_qg == arch_qg, name
    assert resolve_zoo_name("CLIP-LAION400M-ViT-B/32") == ("ViT-B-32-quickgelu", "laion400m_e31")
    assert resolve_zoo_name("CLIP-OpenAI-ViT-B/32") == ("ViT-B-32-quickgelu", "openai")
    assert resolve_zoo_name("CLIP-LAION400M-ViT-B/16") == ("ViT-B-16", "laion400m_e31")


def test_resolve_zoo_name():
    entry = resolve_zoo_name("clip-laion400m-vit-b/32")  # case-insensitive
    model, tag = entry
    assert (entry.model, entry.pretrained) == (model, tag) == ("ViT-B-32-quickgelu", "laion400m_e31")
    assert cm.paper_name(model, tag) == "CLIP-LAION400M-ViT-B/32"
    assert "CLIP-DFN5B-ViT-H/14" in cm.zoo_names()
    with pytest.raises(ModelNotFoundError, match="CLIP-LAION2B-ViT-B/32"):
        resolve_zoo_name("CLIP-LAION2B-ViT-B32")
    assert cm.parse_model_name("CLIP-LAION2B-ViT-B/16") == (
        "open_clip",
        "ViT-B-16",
        "CLIP-LAION2B-ViT-B/16",
        "laion2b_s34b_b88k",
    )


def test_zoo_file_is_validated(tmp_path):
    bad = tmp_path / "zoo.yaml"
    bad.write_text("kind: open_clip\nmodels:\n  X: {model: ViT-B-32}\n")
    with pytest.raises(ValueError, match="zoo entry 'X'"):
        cm.load_zoo(bad)


# ----------------------------------------------------------------------------- timm
def test_timm_tiny_classifier_random(images):
    m = load_model(TIMM_TINY, seed=0)
    assert m.kind == "classifier" and m.model_id == "timm:test_resnet:random-seed0" and m.cache_safe
    assert m.image_size == (160, 160) and m.tokenizer is None
    x = m.preprocess_images([Image.new("RGB", (300, 200), (10, 120, 40))] * 2)
    assert x.shape == (2, 3, 160, 160)
    logits = m.logits(x)
    assert logits.shape == (2, 1000) and logits.dtype == torch.float32
    feats = m.encode_image(x)
    assert feats.shape == (2, m.embed_dim)
    torch.testing.assert_close(feats.norm(dim=-1), torch.ones(2))
    with pytest.raises(TypeError, match="no text tower"):
        m.encode_text(["a dog"])
    torch.testing.assert_close(load_model(TIMM_TINY, seed=0).logits(x), logits)
    assert load_model(TIMM_TINY).model_id == "timm:test_resnet:random"


def test_timm_resnet18_random_gives_1000_logits():
    m = load_model("timm:resnet18", seed=0)
    assert m.image_size == (224, 224)
    assert m.logits(torch.rand(1, 3, 224, 224)).shape == (1, 1000)


def test_timm_local_file_and_tag_from_disk(tmp_path, monkeypatch):
    from safetensors.torch import save_file

    src = load_model(TIMM_TINY, seed=4)
    x = torch.rand(2, 3, 160, 160, generator=torch.Generator().manual_seed(2))
    want = src.logits(x)
    path = tmp_path / "cls.pt"
    torch.save({"state_dict": src.module.state_dict(), "curate": {"arch": TIMM_TINY}}, path)
    for name in (TIMM_TINY, "auto"):
        m = load_model(name, path)
        assert m.model_id == f"timm:test_resnet:file-{Checkpoint(path).sha256[:12]}"
        torch.testing.assert_close(m.logits(x), want, rtol=0, atol=0)

    # a pretrained tag resolves to the file timm would download, found in curate's weights dir
    with pytest.raises(WeightsNotFoundError, match="timm/test_resnet.r160_in1k"):
        load_model(TIMM_TINY, "r160_in1k")
    target = Path(os.environ["CURATE_WEIGHTS_DIR"]) / "timm" / "test_resnet.r160_in1k"
    target.mkdir(parents=True)
    save_file(
        {k: v.contiguous() for k, v in src.module.state_dict().items()}, str(target / "model.safetensors")
    )
    for name, tag in (
        (TIMM_TINY, "r160_in1k"),
        (TIMM_TINY, "default"),
        ("timm:test_resnet.r160_in1k", "default"),
    ):
        m = load_model(name, tag)
        assert m.model_id == "timm:test_resnet:r160_in1k"
        torch.testing.assert_close(m.logits(x), want, rtol=0, atol=0)


# ----------------------------------------------------------------------------- registry
def test_register_backend_dispatch(tiny_vit):
    seen = {}

    def fake_loader(req):
        seen["req"] = req
        return tiny_vit

    cm.register_backend("fake", fake_loader)
    try:
        assert load_model("fake:thing", "tag", seed=3) is tiny_vit
        assert (seen["req"].arch, seen["req"].pretrained, seen["req"].seed) == ("thing", "tag", 3)
        assert "fake" in cm.backends()
    finally:
        from curate.models import registry

        registry._BACKENDS.pop("fake")


def test_import_is_light():
    code = "import sys, curate.models; print(any(m in sys.modules for m in ('torch', 'open_clip', 'timm')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert out.stdout.strip() == "False", out.stderr


# ----------------------------------------------------------------------------- issue 45/46: words
def _cli(args: list[str]):
    from click.testing import CliRunner

    from curate.cli import main

    return CliRunner(env={"COLUMNS": "400"}).invoke(main, args)


@pytest.fixture()
def folder(tmp_path):
    sys.path.insert(0, str(REPO / "tests"))
    from eval_helpers import make_folder

    return make_folder(tmp_path / "ds", per_class=2)


def test_a_file_with_another_librarys_keys_is_described_in_one_line(tmp_path):
    """EfficientNet-PyTorch names timm's ``conv_stem`` ``_conv_stem``: the error says what the file
    holds and what the model expects (count, prefixes, a sample key), not 600 characters of keys."""
    src = load_model(TIMM_TINY, seed=0)
    path = tmp_path / "other-library.pt"
    torch.save({f"_{k}": v for k, v in src.module.state_dict().items()}, path)
    with pytest.raises(ModelError) as caught:
        load_model(TIMM_TINY, path)
    message = str(caught.value)
    n = len(src.module.state_dict())
    assert "\n" not in message and "Missing key" not in message and len(message) < 500, message
    assert f"the file's {n} tensors are named _conv1" in message and "(e.g. _conv1." in message, message
    assert f"the model's {n} conv1" in message and "0 names match" in message and "converted" in message, message
    # a shape that differs under the same names is named with both shapes
    state = {k: v.clone() for k, v in src.module.state_dict().items()}
    state["fc.weight"] = torch.zeros(1000, 3)
    torch.save(state, tmp_path / "shapes.pt")
    with pytest.raises(ModelError, match=r"fc\.weight is \[1000, 3\] in the file and \[1000, \d+\] in the model"):
        load_model(TIMM_TINY, tmp_path / "shapes.pt")


def test_a_truncated_weights_file_reads_cleanly(tmp_path):
    src = load_model(TIMM_TINY, seed=0)
    whole = tmp_path / "whole.pt"
    torch.save(src.module.state_dict(), whole)
    cut = tmp_path / "cut.pt"
    cut.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
    with pytest.raises(ModelError) as caught:
        load_model(TIMM_TINY, cut)
    message = str(caught.value)
    assert "truncated or not a weights file?" in message and message.endswith("delete it and fetch it again, "
                                                                               "or check the path"), message
    assert ".." not in message and ". Delete" not in message and "\n" not in message, message


def test_a_classifier_trained_with_other_preprocessing_says_so(tmp_path, folder):
    """mean, std, input size and interpolation over timm's defaults: in the name (library), as
    options (CLI); the transform, the model id and the run's record follow."""
    from curate.models.spec import ModelSpec, split_preprocess, with_preprocess

    name = with_preprocess(TIMM_TINY, mean="0.5,0.5,0.5", std=(0.25, 0.25, 0.25), size="96", interpolation="bilinear")
    assert name == "timm:test_resnet#mean=0.5/0.5/0.5,std=0.25/0.25/0.25,size=96,interpolation=bilinear"
    assert ModelSpec(name).preprocess == {"mean": (0.5,) * 3, "std": (0.25,) * 3, "size": (96, 96),
                                          "interpolation": "bilinear"}
    plain, custom = load_model(TIMM_TINY, seed=0), load_model(name, seed=0)
    assert custom.image_size == (96, 96) and plain.image_size == (160, 160)
    steps = {type(t).__name__: t for t in custom.preprocess.transforms}
    assert steps["Resize"].interpolation.value == "bilinear" and tuple(steps["CenterCrop"].size) == (96, 96)
    assert steps["Normalize"].mean.tolist() == [0.5] * 3 and steps["Normalize"].std.tolist() == [0.25] * 3
    assert custom.model_id.startswith(plain.model_id + "+prep-")  # other pixels, other outputs: another id
    assert custom.info["preprocess_overrides"]["mean"] == [0.5] * 3 and custom.info["preprocess"]["input_size"] == [3, 96, 96]
    photo = Image.new("RGB", (120, 90), (200, 30, 60))
    assert not torch.allclose(custom.logits(custom.preprocess_images([photo])),
                              plain.logits(plain.preprocess_images([photo])))
    for bad, words in (("timm:test_resnet#mean=1/2", "mean needs 3 numbers"), ("timm:test_resnet#gamma=2", "gamma"),
                       ("timm:test_resnet#interpolation=cubic", "not one of")):
        with pytest.raises(ValueError, match=words):
            split_preprocess(bad)
    with pytest.raises(ValueError, match="timm: classifiers"):
        with_preprocess("curate-tiny-vit", mean="0.5,0.5,0.5")

    weights = tmp_path / "cls.pt"
    torch.save(plain.module.state_dict(), weights)
    result = _cli(["-q", "evaluate", str(folder.root), "--model", TIMM_TINY, "--pretrained", str(weights),
                   "--mean", "0.5,0.5,0.5", "--std", "0.25,0.25,0.25", "--input-size", "96", "--interpolation",
                   "bilinear", "--bootstrap", "10", "--run-name", "custom", "--device", "cpu"])
    assert result.exit_code == 0, result.output
    config = json.loads((folder.root / "runs" / "custom" / "config.json").read_text())
    recorded = config["model"]
    assert recorded["name"] == name and "+prep-" in recorded["model_id"]
    assert recorded["info"]["preprocess"]["mean"] == [0.5] * 3 and recorded["info"]["preprocess"]["interpolation"] == "bilinear"
    refused = _cli(["evaluate", str(folder.root), "--model", "curate-tiny-vit", "--mean", "0.5,0.5,0.5"])
    assert refused.exit_code == 2 and "timm: classifiers" in refused.output, refused.output


def test_the_quickgelu_warning_is_one_cli_line_saying_what_to_type(folder):
    """``--model ViT-B-32 --pretrained laion400m_e31`` (the paper's weights, GELU architecture): one
    line naming the pair to type and the zoo name, no Python file path or warning class."""
    result = _cli(["evaluate", str(folder.root), "--model", "ViT-B-32", "--pretrained", "laion400m_e31"])
    lines = [line for line in result.output.splitlines() if "QuickGELU" in line]
    assert len(lines) == 1, result.output
    assert lines[0].startswith("warning: open_clip weights ViT-B-32:laion400m_e31 were trained with QuickGELU")
    assert lines[0].endswith("type --model ViT-B-32-quickgelu --pretrained laion400m_e31, or --model "
                             "CLIP-LAION400M-ViT-B/32"), lines[0]
    assert "QuickGELUWarning" not in result.output and ".py:" not in result.output and "warnings.warn" not in result.output
    quiet = _cli(["-q", "evaluate", str(folder.root), "--model", "ViT-B-32", "--pretrained", "laion400m_e31"])
    assert "QuickGELU" not in quiet.output and quiet.exit_code == 1


def test_the_missing_weights_error_reads_line_by_line(folder):
    """A short first line, then where curate looked and how to fix it, each on its own line."""
    result = _cli(["evaluate", str(folder.root), "--model", "timm:resnet18", "--pretrained", "a1_in1k"])
    assert result.exit_code == 1
    lines = result.output.splitlines()
    assert lines[0] == ("error: weights for timm resnet18.a1_in1k are not on this machine (pytorch_model.bin / "
                        "resnet18_a1_0-d63eafa0.pth missing); curate never downloads weights"), lines[0]
    assert "looked in:" in lines and "to fix, on a machine with internet, either:" in lines, result.output
    bullets = [line for line in lines if line.startswith("  - ")]
    assert len(bullets) >= 8 and len(lines[0]) < 200, result.output
    assert any("hf download timm/resnet18.a1_in1k" in b for b in bullets)
    assert any(b.endswith("pass the file itself: --pretrained /path/to/weights") for b in bullets), result.output


# ----------------------------------------------------------------------------- issue 45: classifier speed on CPU
def _random_statistics(module: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Batch norms with random running statistics and affine terms (a fresh model's are 0/1: folding them is trivial)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.copy_(torch.rand(m.running_mean.shape, generator=g) - 0.5)
                m.running_var.copy_(torch.rand(m.running_var.shape, generator=g) + 0.5)
                m.weight.copy_(torch.rand(m.weight.shape, generator=g) + 0.5)
                m.bias.copy_(torch.rand(m.bias.shape, generator=g) - 0.5)
    return module.eval()


@pytest.mark.parametrize("arch", ["test_efficientnet", "test_resnet"])
def test_batch_norms_fold_into_their_convolutions_without_changing_outputs(arch):
    import timm

    from curate.models.fold import fold_batchnorm

    module = _random_statistics(timm.create_model(arch))
    before = {k: v.clone() for k, v in module.state_dict().items()}
    x = torch.rand(3, 3, 96, 96, generator=torch.Generator().manual_seed(1))
    folded, count = fold_batchnorm(module, x[:2])
    norms = sum(isinstance(m, torch.nn.BatchNorm2d) for m in module.modules())
    left = sum(isinstance(m, torch.nn.BatchNorm2d) for m in folded.modules())
    assert count > 0 and left == norms - count and folded is not module, (count, norms, left)
    assert all(torch.equal(before[k], v) for k, v in module.state_dict().items())  # the original is untouched
    with torch.no_grad():
        want, got = module(x), folded(x)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4 * float(want.abs().max()))


def test_a_batch_norm_whose_convolution_feeds_another_layer_is_not_folded():
    from curate.models.fold import conv_bn_pairs, fold_batchnorm

    class Shared(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv, self.bn, self.other = torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.Conv2d(4, 4, 1)

        def forward(self, x):
            y = self.conv(x)
            return self.bn(y) + self.other(y)  # the convolution's output is used twice: folding would change `other`

    module = _random_statistics(Shared())
    assert conv_bn_pairs(module) == []
    assert fold_batchnorm(module, torch.rand(1, 3, 8, 8)) == (module, 0)


def test_a_cpu_classifier_encodes_a_folded_channels_last_copy_a_few_images_a_pass():
    """What makes curate faster than a plain timm loop on a CPU (benchmarks/classifier.py): the
    outputs are timm's, up to float rounding; gradients still run through the model as built."""
    import timm

    from curate.engine.images import model_output

    model = load_model("timm:test_efficientnet", seed=3)
    _random_statistics(model.module)  # as trained weights would have; then the fast copy is made again
    model = type(model)(module=model.module, model_id=model.model_id, preprocess=model.preprocess,
                        image_size=model.image_size, device=model.device, precision="fp32")
    reference = timm.create_model("test_efficientnet")
    reference.load_state_dict(model.module.state_dict())
    reference.eval()
    assert model.folded > 0 and model.info["cpu_inference"]["memory_format"] == "channels_last"
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in model.fast_module.modules())
    passes = []
    model.fast_module.register_forward_pre_hook(lambda module, args: passes.append(args[0].shape[0]))
    x = torch.rand(10, 3, *model.image_size, generator=torch.Generator().manual_seed(2))
    got = model_output(model, "logits", x)
    assert passes == [4, 4, 2]  # ClassifierModel.cpu_batch images a pass
    assert model.fast_module.conv_stem.weight.is_contiguous(memory_format=torch.channels_last)
    with torch.no_grad():
        want = reference(x)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4 * float(want.abs().max()))
    out = model.logits(x[:2], grad=True)  # saliency's path: the module as built, with gradients
    out[:, 0].sum().backward()
    assert model.module.conv_stem.weight.grad is not None and passes == [4, 4, 2]
    seen = []  # and without gradients (EigenCAM's hooks): the module as built, never the fast copy
    model.module.conv_stem.register_forward_hook(lambda module, args, output: seen.append(output.shape[0]))
    torch.testing.assert_close(model.logits(x[:3]), want[:3], rtol=1e-4, atol=1e-4 * float(want.abs().max()))
    model.encode_image(x[:3])
    assert seen == [3, 3] and passes == [4, 4, 2]
    torch.testing.assert_close(model_output(model, "embedding", x), model.encode_image(x), rtol=1e-4, atol=1e-4)
