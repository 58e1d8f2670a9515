"""The input paths (curate.engine.images): the chooser, the device path's fallbacks, and its agreement
with the exact path (open_clip's PIL transform), all on the CPU (the device code runs on any device)."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from feed_helpers import make_photo_folder

from curate.engine.images import (
    HOST_PIXELS,
    JPEG_BYTES,
    DeviceBatches,
    ImageFiles,
    RawImageFiles,
    choose_input_path,
    collate_raw,
    decode_on_device,
    default_workers,
    device_transform_of,
)
from curate.models import load_model

CPU = torch.device("cpu")
pytestmark = pytest.mark.filterwarnings("ignore:.*TorchCodec")


@pytest.fixture(scope="module")
def model():
    return load_model("curate-tiny-clip", seed=0)


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    return make_photo_folder(tmp_path_factory.mktemp("feed") / "jpeg", n=24, size=(120, 90))


def _device_pixels(paths, model, *, device_decode: bool = True):
    raw = RawImageFiles(paths, device_decode=device_decode)
    batch = collate_raw([raw[i] for i in range(len(raw))])
    return DeviceBatches(device_transform_of(model.preprocess), CPU, model.image_size)(batch)


def _exact_pixels(paths, model):
    files = ImageFiles(paths, model.preprocess, model.image_size)
    return torch.stack([files[i][1] for i in range(len(files))])


def test_the_chooser(model) -> None:
    cuda, cpu = SimpleNamespace(type="cuda"), SimpleNamespace(type="cpu")
    assert choose_input_path(cuda, "auto", model.preprocess) == "gpu"
    assert choose_input_path("cuda:1") == "gpu"
    assert choose_input_path(cpu, "auto", model.preprocess) == "cpu-exact"  # the exact path stays the CPU default
    assert choose_input_path(cuda, "cpu-exact", model.preprocess) == "cpu-exact"
    assert choose_input_path(cpu, "gpu", model.preprocess) == "gpu"  # forced: the device code on the CPU

    def custom(image):  # a transform the device path cannot reproduce
        return image

    assert device_transform_of(custom) is None
    assert choose_input_path(cuda, "auto", custom) == "cpu-exact"
    with pytest.raises(ValueError, match="cannot reproduce"):
        choose_input_path(cuda, "gpu", custom)
    with pytest.raises(ValueError, match="input path"):
        choose_input_path(cuda, "fastest")
    assert default_workers(cpu) == 0 and default_workers("cuda") >= 1


def test_png_and_corrupt_jpeg_fall_back(tmp_path, photos, model) -> None:
    """A PNG is decoded on the host; a JPEG the (batched) device decoder refuses is tried alone, then by
    PIL, then reported; the batch's other images are unaffected."""
    from PIL import Image

    good = photos.image_paths(photos.sample_ids()[:3])
    png = tmp_path / "a.png"
    with Image.open(good[0]) as image:
        image.save(png)
    truncated = tmp_path / "bad.jpg"
    truncated.write_bytes(good[1].read_bytes()[:200])  # starts like a JPEG, cannot be decoded
    missing = tmp_path / "none.jpg"
    raw = RawImageFiles([good[0], png, truncated, missing, good[2]], device_decode=True)
    items = [raw[i] for i in range(len(raw))]
    assert [it[2] for it in items] == [JPEG_BYTES, HOST_PIXELS, JPEG_BYTES, HOST_PIXELS, JPEG_BYTES]
    assert items[3][3].startswith("FileNotFoundError")
    images, errors = decode_on_device([it[1] for it in items], [it[2] for it in items], CPU)
    assert errors[0] == errors[1] == errors[4] == "" and errors[2] and images[2] is None
    assert torch.equal(images[0], images[1])  # the PNG holds the JPEG's decoded pixels
    indices, pixels, reasons = DeviceBatches(device_transform_of(model.preprocess), CPU, model.image_size)(
        collate_raw(items))
    assert indices == [0, 1, 2, 3, 4]
    assert [bool(r) for r in reasons] == [False, False, True, True, False]
    assert not pixels[2].any() and not pixels[3].any() and pixels[0].abs().sum() > 0
    torch.testing.assert_close(pixels[0], pixels[1])
    # the host decode (a CPU run of the device path) falls back the same way
    host = RawImageFiles([truncated, png], device_decode=False)
    assert host[0][3] and not host[1][3] and host[1][2] == HOST_PIXELS


def test_the_device_path_agrees_with_the_exact_path(photos, model) -> None:
    """Measured on 24 JPEG photos of 120-128 x 90-98 px, curate-tiny-clip (48 px bicubic + centre crop):
    the inputs differ by at most 4 of 255 levels (mean about 0.15), embeddings by cosine >= 0.99999,
    and the top-1 of a 20-way classifier agrees on every image."""
    paths = photos.image_paths(photos.sample_ids())
    exact = _exact_pixels(paths, model)
    indices, device, reasons = _device_pixels(paths, model)
    assert indices == list(range(len(paths))) and not any(reasons)
    host_indices, host, _ = _device_pixels(paths, model, device_decode=False)
    torch.testing.assert_close(host, device, rtol=0, atol=0)  # where the JPEG is decoded does not matter on a CPU
    std = torch.tensor(device_transform_of(model.preprocess).std).view(1, 3, 1, 1)
    levels = ((device - exact) * std * 255).abs()
    assert levels.max() <= 6 and levels.mean() <= 0.5, (levels.max(), levels.mean())
    a, b = model.encode_image(exact), model.encode_image(device)
    assert (a * b).sum(dim=1).min() >= 0.9999
    classifier = torch.nn.functional.normalize(torch.randn(20, a.shape[1], generator=torch.Generator().manual_seed(0)),
                                               dim=1)
    agree = ((a @ classifier.T).argmax(1) == (b @ classifier.T).argmax(1)).float().mean()
    assert agree >= 0.95, agree


def test_decoders_agree_with_pil(photos) -> None:
    """torchvision's CPU decode_jpeg (the device path's host decoder) and PIL (the exact path's) are
    both libjpeg-turbo here: measured identical pixels on these photos."""
    from PIL import Image
    from torchvision.io import ImageReadMode, decode_jpeg

    for path in photos.image_paths(photos.sample_ids()[:6]):
        ours = decode_jpeg(torch.frombuffer(bytearray(path.read_bytes()), dtype=torch.uint8), mode=ImageReadMode.RGB)
        with Image.open(path) as image:
            pil = torch.from_numpy(np.asarray(image.convert("RGB")).copy()).permute(2, 0, 1)
        assert (ours.int() - pil.int()).abs().max() <= 2


def test_an_encode_on_the_device_path_fails_per_sample_not_per_run(photos, model) -> None:
    from curate.engine.base import EncodeJob
    from curate.engine.local import LocalEngine

    ids = photos.sample_ids()[:7]
    broken = photos.image_path(ids[3])
    broken.write_bytes(broken.read_bytes()[:100])
    job = EncodeJob.for_model(model, "embedding", batch_size=4, input_path="gpu")
    outs = list(LocalEngine(workers=0).map_batches(photos, ids, job))
    assert [len(o.sample_ids) for o in outs] == [3, 3]
    assert list(outs[0].failed) == [ids[3]]
