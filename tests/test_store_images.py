"""Image and mask ingestion (curate.store.images) and how the dataset quarantines bad inputs."""
from __future__ import annotations

import hashlib
import io
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageFile, ImageOps
from store_helpers import encode, exif_jpeg, noise_rgb, png16, rgb_jpeg, solid_png, toy_space

from curate.store import Dataset, ImageRejected, NewSample, check_dataset, prepare_image, prepare_mask


def stored(prepared) -> Image.Image:
    img = Image.open(io.BytesIO(prepared.data))
    img.load()
    return img


def test_rgb_jpeg_and_png_are_stored_verbatim() -> None:
    for data, ext in ((rgb_jpeg(1), "jpg"), (solid_png((1, 2, 3)), "png")):
        prepared = prepare_image(data)
        assert prepared.data == data and prepared.ext == ext and prepared.conversions == ()
        assert prepared.sha256 == hashlib.sha256(data).hexdigest()


def test_path_input(tmp_path: Path) -> None:
    path = tmp_path / "a.jpg"
    path.write_bytes(rgb_jpeg(2))
    assert prepare_image(path).data == path.read_bytes() and prepare_image(str(path)).ext == "jpg"


def test_grayscale_becomes_rgb() -> None:
    gray = np.arange(256, dtype=np.uint8).reshape(16, 16)
    prepared = prepare_image(encode(Image.fromarray(gray, mode="L"), "PNG"))
    img = stored(prepared)
    assert img.mode == "RGB" and prepared.ext == "png"
    assert np.array_equal(np.asarray(img)[..., 1], gray) and "mode L->RGB" in prepared.conversions


def test_cmyk_jpeg_becomes_rgb_png() -> None:
    cmyk = Image.new("CMYK", (16, 16), (0, 255, 255, 0))  # pure red in CMYK
    prepared = prepare_image(encode(cmyk, "JPEG", quality=95))
    img = stored(prepared)
    assert img.mode == "RGB" and img.format == "PNG" and prepared.ext == "png"
    r, g, b = np.asarray(img).reshape(-1, 3).mean(axis=0)
    assert r > 200 and g < 60 and b < 60


def test_alpha_and_palette_are_composited_on_white() -> None:
    rgba = Image.new("RGBA", (16, 16), (255, 0, 0, 0))
    rgba.paste((0, 255, 0, 255), (0, 0, 8, 16))
    img = stored(prepare_image(encode(rgba, "PNG")))
    assert img.getpixel((12, 5)) == (255, 255, 255) and img.getpixel((2, 5)) == (0, 255, 0)
    la = stored(prepare_image(encode(Image.new("LA", (8, 8), (0, 0)), "PNG")))
    assert la.getpixel((0, 0)) == (255, 255, 255)
    palette = Image.new("P", (8, 8), 1)
    palette.putpalette([0, 0, 0, 10, 20, 30] + [0] * 762)
    assert stored(prepare_image(encode(palette, "PNG"))).getpixel((0, 0)) == (10, 20, 30)
    palette.info["transparency"] = 1
    assert stored(prepare_image(encode(palette, "PNG", transparency=1))).getpixel((0, 0)) == (255, 255, 255)


def test_16bit_gray_png_is_scaled_to_8bit() -> None:
    values = (np.arange(256, dtype=np.uint32) * 257).astype(np.uint16).reshape(16, 16)  # 0..65535
    prepared = prepare_image(png16(values))
    img = np.asarray(stored(prepared))
    assert img.dtype == np.uint8 and img.shape == (16, 16, 3)
    assert np.array_equal(img[..., 0], np.arange(256, dtype=np.uint8).reshape(16, 16))
    assert "16-bit->8-bit" in prepared.conversions


def test_16bit_rgb_png_is_8bit_rgb() -> None:
    values = np.zeros((4, 4, 3), np.uint16)
    values[..., 0], values[..., 1], values[..., 2] = 65535, 257 * 100, 0
    img = np.asarray(stored(prepare_image(png16(values))))
    assert img.dtype == np.uint8 and np.abs(img[0, 0].astype(int) - [255, 100, 0]).max() <= 1


def test_exif_orientation_is_applied_and_dropped() -> None:
    # raw 24x12 with a red block at the top-left; orientation 6 = rotate 90 degrees clockwise to view
    prepared = prepare_image(exif_jpeg(6))
    img = stored(prepared)
    assert (prepared.width, prepared.height) == img.size == (12, 24)
    assert "exif_transpose" in prepared.conversions and prepared.ext == "png"
    assert img.getexif().get(0x0112) in (None, 1)  # no viewer will rotate it a second time
    red = np.asarray(img)[..., 0] > 128
    ys, xs = np.nonzero(red)
    assert xs.min() >= 6 and ys.max() < 6  # the block now sits at the top-right
    upright = prepare_image(exif_jpeg(1))
    assert upright.conversions == () and (upright.width, upright.height) == (24, 12)


def png16_filtered(array: np.ndarray) -> bytes:
    """A 16-bit PNG (gray, gray+alpha, RGB or RGBA by channel count) whose rows cycle through the
    None, Sub and Up filters, so decoding depends on the right bytes-per-pixel."""
    array = array if array.ndim == 3 else array[..., None]
    height, width, channels = array.shape
    rows = array.astype(">u2").reshape(height, width * channels).view(np.uint8).astype(np.int64)
    bpp = 2 * channels
    raw = b""
    for y in range(height):
        kind = y % 3
        if kind == 1:  # Sub: minus the byte one pixel to the left
            line = rows[y] - np.concatenate([np.zeros(bpp, np.int64), rows[y][:-bpp]])
        elif kind == 2:  # Up: minus the byte above
            line = rows[y] - rows[y - 1]
        else:
            line = rows[y]
        raw += bytes([kind]) + (line % 256).astype(np.uint8).tobytes()

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    color_type = {1: 0, 2: 4, 3: 2, 4: 6}[channels]
    header = struct.pack(">IIBBBBB", width, height, 16, color_type, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")


def rule16(values: np.ndarray) -> np.ndarray:
    """The documented 16->8 bit rule: v8 = round(v16 * 255 / 65535)."""
    return np.round(values.astype(np.float64) * 255 / 65535).astype(np.uint8)


def _reference(data: bytes) -> np.ndarray:
    """What a lossless ingestion must store: the upright source converted to RGB by Pillow."""
    with Image.open(io.BytesIO(data)) as img:
        return np.asarray(ImageOps.exif_transpose(img).convert("RGB"))


def _exif_noise_jpeg(orientation: int, mode: str = "RGB") -> bytes:
    exif = Image.Exif()
    exif[0x0112] = orientation
    img = Image.fromarray(noise_rgb(20 + orientation, (24, 12))).convert(mode)
    return encode(img, "JPEG", quality=90, exif=exif)


_NOISE16 = np.random.default_rng(16).integers(0, 65536, (12, 20, 4), dtype=np.uint16)
_LOSSLESS_CASES = {
    "cmyk-jpeg": lambda: encode(Image.fromarray(noise_rgb(11, (40, 24))).convert("CMYK"), "JPEG", quality=95),
    "cmyk-jpeg-exif6": lambda: _exif_noise_jpeg(6, "CMYK"),
    "gray-jpeg": lambda: encode(Image.fromarray(noise_rgb(12, (40, 24))[..., 0]), "JPEG", quality=90),
    "gray-png": lambda: encode(Image.fromarray(noise_rgb(13)[..., 0]), "PNG"),
    "palette-png": lambda: encode(Image.fromarray(noise_rgb(14)).quantize(37), "PNG"),
    **{f"rgb-jpeg-exif{o}": (lambda o=o: _exif_noise_jpeg(o)) for o in range(2, 9)},
}


@pytest.mark.parametrize("case", sorted(_LOSSLESS_CASES))
def test_converted_images_are_stored_losslessly(case: str) -> None:
    # the stored pixels are exactly exif_transpose(img).convert("RGB"): no second, lossy encode
    # (a JPEG q95 re-encode left a CMYK photo up to 42 levels from its own RGB conversion)
    data = _LOSSLESS_CASES[case]()
    prepared = prepare_image(data)
    img = stored(prepared)
    assert prepared.conversions and prepared.ext == "png" and img.format == "PNG" and img.mode == "RGB"
    assert prepared.sha256 == hashlib.sha256(prepared.data).hexdigest()
    assert np.array_equal(np.asarray(img), _reference(data))
    assert (prepared.width, prepared.height) == img.size
    again = prepare_image(prepared.data)  # what is stored is upright 8-bit RGB: kept as it is
    assert again.data == prepared.data and again.conversions == ()


@pytest.mark.parametrize("channels", [1, 3, 4])
def test_16bit_pngs_follow_the_one_16_to_8_bit_rule_exactly(channels: int) -> None:
    values = _NOISE16[..., :channels].copy()
    values[0, :4, 0] = [0, 65535, 32767, 32768]  # both ends and the rounding midpoint
    if channels == 1:
        values = values[..., 0]
    prepared = prepare_image(png16_filtered(values))
    img = stored(prepared)
    assert prepared.ext == "png" and img.mode == "RGB" and "16-bit->8-bit" in prepared.conversions
    if channels == 1:
        expected = np.repeat(rule16(values)[..., None], 3, axis=2)
    elif channels == 3:
        expected = rule16(values)
        # Pillow alone keeps the high byte (v >> 8), off by one for many samples; curate does not
        assert not np.array_equal(expected, (values >> 8).astype(np.uint8))
    else:  # the same rule for all four channels, then the alpha over white
        rgba = Image.fromarray(rule16(values), mode="RGBA")
        white = Image.new("RGB", rgba.size, (255, 255, 255))
        white.paste(rgba, mask=rgba.getchannel("A"))
        expected = np.asarray(white)
    assert np.array_equal(np.asarray(img), expected)
    if channels != 4:
        assert np.asarray(img)[0, :4, 0].tolist() == [0, 255, 127, 128]


def test_converted_images_in_the_dataset_are_png_and_content_addressed(tmp_path: Path) -> None:
    ds = Dataset.create(tmp_path / "ds", name="t", label_space=toy_space())
    inputs = [_LOSSLESS_CASES["cmyk-jpeg"](), _exif_noise_jpeg(6), png16_filtered(_NOISE16[..., :3])]
    report = ds.add_samples([NewSample(image=data, class_index=0) for data in inputs])
    assert len(report.added) == 3
    for sid, data in zip(report.added, inputs):
        row = ds.row(sid)
        path = ds.root / row["filepath"]
        assert path.suffix == ".png" and hashlib.sha256(path.read_bytes()).hexdigest() == row["sha256"]
        with Image.open(path) as img:
            assert img.format == "PNG"
        assert np.array_equal(np.asarray(ds.load_image(sid)), np.asarray(stored(prepare_image(data))))
    assert np.array_equal(np.asarray(ds.load_image(report.added[0])), _reference(inputs[0]))
    again = ds.add_samples([NewSample(image=data, class_index=0) for data in inputs])
    assert again.added == [] and len(again.duplicates) == 3
    assert check_dataset(ds.root) == []


def test_in_memory_pil_images_are_stored_as_png() -> None:
    prepared = prepare_image(Image.fromarray(noise_rgb(3)))
    assert prepared.ext == "png" and np.array_equal(np.asarray(stored(prepared)), noise_rgb(3))
    gray16 = Image.fromarray(np.full((4, 4), 65535, np.uint16))
    assert stored(prepare_image(gray16)).getpixel((0, 0)) == (255, 255, 255)


def _flipped_png() -> bytes:
    data = encode(Image.fromarray(noise_rgb(1, (32, 32))), "PNG")
    start = data.index(b"IDAT") + 40
    return data[:start] + bytes(b ^ 0xFF for b in data[start:start + 20]) + data[start + 20:]


@pytest.mark.parametrize("data, code", [
    (rgb_jpeg(4, (64, 64))[:1500], "truncated"),  # cut in the scan data
    (rgb_jpeg(4, (64, 64))[:400], "truncated"),  # cut in the header
    (solid_png((1, 2, 3), (64, 64))[:-30], "truncated"),
    (_flipped_png(), "corrupt"),
    (b"this is not an image at all", "not_an_image"),
    (b"", "not_an_image"),
    (b"\x89PNG\r\n\x1a\n" + b"\x00" * 40, "not_an_image"),
], ids=["jpeg-cut-scan", "jpeg-cut-header", "png-cut", "png-flipped", "text", "empty", "png-zero-header"])
def test_bad_bytes_are_rejected_with_a_reason(data: bytes, code: str) -> None:
    with pytest.raises(ImageRejected) as info:
        prepare_image(data)
    assert info.value.code == code, info.value
    assert str(info.value).startswith(code + ":")


def test_truncation_is_caught_even_if_someone_allows_truncated_images(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", True)
    with pytest.raises(ImageRejected, match="truncated"):
        prepare_image(rgb_jpeg(5, (64, 64))[:1500])
    assert ImageFile.LOAD_TRUNCATED_IMAGES is True


def test_unreadable_paths_and_huge_images(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ImageRejected, match="unreadable: .* does not exist"):
        prepare_image(tmp_path / "missing.jpg")
    with pytest.raises(ImageRejected, match="is a directory"):
        prepare_image(tmp_path)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)
    with pytest.raises(ImageRejected, match="too_large"):
        prepare_image(solid_png((1, 1, 1), (16, 16)))


def test_masks() -> None:
    assert Image.open(io.BytesIO(prepare_mask(np.ones((4, 6), bool), (6, 4)))).mode == "L"
    assert prepare_mask(np.full((4, 6), 2.0), (6, 4))
    labels = np.zeros((4, 6), np.uint8)
    labels[1, 1] = 3
    png = encode(Image.fromarray(labels), "PNG")
    decoded = np.asarray(Image.open(io.BytesIO(prepare_mask(png, (6, 4)))))
    assert np.array_equal(decoded, labels)
    for bad, message in ((np.ones((4, 5)), "6x4"), (np.full((4, 6), -1), "0..255"), (np.full((4, 6), 300), "0..255"),
                         (np.full((4, 6), 0.5), "non-integer"), (np.ones((2, 4, 6)), "H x W"),
                         (encode(Image.new("RGB", (6, 4), (1, 2, 3)), "PNG"), "colour"), (b"nope", "mask image")):
        with pytest.raises(ImageRejected, match=message) as info:
            prepare_mask(bad, (6, 4))
        assert info.value.code == "bad_mask"


def test_dataset_quarantines_bad_images_and_stays_valid(tmp_path: Path) -> None:
    ds = Dataset.create(tmp_path / "ds", name="t", label_space=toy_space())
    folder = tmp_path / "incoming"
    folder.mkdir()
    (folder / "good.jpg").write_bytes(rgb_jpeg(7))
    (folder / "cut.jpg").write_bytes(rgb_jpeg(8, (64, 64))[:1500])
    (folder / "notes.txt").write_text("not an image")
    items = [
        NewSample(image=folder / "good.jpg", class_index=0, source="folder", source_id="good.jpg"),
        NewSample(image=folder / "cut.jpg", class_index=0),
        NewSample(image=folder / "notes.txt", class_index=1),
        NewSample(image=folder / "gone.jpg", class_index=1),
        NewSample(image=encode(Image.new("CMYK", (16, 16)), "JPEG"), class_index=2, source="inat", source_id="42"),
        NewSample(image=png16(np.full((16, 16), 4000, np.uint16)), class_index=2),
        NewSample(image=exif_jpeg(8), class_index=1, mask=np.ones((24, 12), np.uint8)),  # upright size is 12x24
    ]
    report = ds.add_samples(items, actor="collector")
    assert len(report.added) == 4 and len(ds) == 4
    assert [(source, reason.split(":")[0]) for source, reason in report.quarantined] == [
        (str(folder / "cut.jpg"), "truncated"), (str(folder / "notes.txt"), "not_an_image"),
        (str(folder / "gone.jpg"), "unreadable")]
    assert check_dataset(ds.root) == []
    reopened = Dataset.open(ds.root, deep=True)
    for sid in reopened.sample_ids():
        assert reopened.load_image(sid).mode == "RGB"
    exif_row = reopened.row(report.added[-1])
    assert (exif_row["width"], exif_row["height"]) == (12, 24) and reopened.load_mask(exif_row["sample_id"]).shape == (24, 12)
    records = reopened.quarantine()
    assert [r["reason"] for r in records] == ["truncated", "not_an_image", "unreadable"]
    assert records[0]["actor"] == "collector" and records[0]["copy"].startswith("quarantine/")
    assert (ds.root / records[0]["copy"]).read_bytes() == (folder / "cut.jpg").read_bytes()
    assert records[2]["copy"] is None and records[2]["sha256"] is None
    # a re-run is idempotent: no new rows, no repeated quarantine records
    again = ds.add_samples(items, actor="collector")
    assert again.added == [] and len(again.duplicates) == 4 and len(again.quarantined) == 3
    assert len(ds.quarantine()) == 3 and len(ds) == 4
