"""Image and mask ingestion: verify by full decode, make upright 8-bit RGB, hash what is stored.

What is stored for an input image (and why):
- A JPEG (or MPO, a phone JPEG with extra frames) or PNG that is already 8-bit RGB and upright
  (no EXIF orientation other than 1) is stored byte for byte: no re-encoding loss, and the
  sha256 of the stored bytes is the sha256 of the source file.
- Anything else is converted and re-encoded: EXIF orientation is applied (the stored image is
  the upright one; its EXIF is dropped so no viewer rotates it twice), grayscale / palette /
  CMYK / YCbCr become RGB, alpha (LA, RGBA, PA, palette transparency) is composited over white,
  16-bit samples are scaled to 8 bits (v8 = round(v16 * 255 / 65535)). Every converted image
  (and every in-memory PIL image) is stored as PNG, whatever its source format, so the stored
  pixels are exactly the converted ones: ``ImageOps.exif_transpose(img).convert("RGB")`` (or the
  16->8 bit rule above), with no second lossy step. A JPEG re-encode (even at quality 95, with
  chroma subsampling) left a CMYK photo up to 42 levels from its own RGB conversion (issue 14 §5).
  Why PNG rather than keeping the original bytes and converting on read: the media folder is
  read directly by tools curate does not control (FiftyOne, Label Studio, ``datasets``, any image
  viewer), which would each see the raw CMYK / 16-bit / sideways file; storing the converted
  pixels keeps "what is stored is what every reader sees". The price is size (a PNG photo is a
  few times its JPEG), paid only for converted inputs; upright 8-bit RGB files stay verbatim.
  The extension follows the stored format (``png``), and the sha256 is that of the PNG bytes.
- Dedup and ``sample_id`` use the sha256 of these stored bytes (content addressing).

An input that cannot be decoded in full (truncated, corrupt, not an image, too large, an
unreadable path) raises :class:`ImageRejected` with a reason code from :data:`QUARANTINE_REASONS`;
the dataset then records it in ``quarantine.jsonl`` and never half-adds it.

Masks (H x W, 0/1 or instance ids 0..255) must have the stored image's size and are stored as
8-bit grayscale PNG.
"""
from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image, ImageFile, ImageOps

log = logging.getLogger(__name__)

MaskInput = np.ndarray | Path | str | bytes | bytearray | memoryview

#: Reason codes recorded for quarantined inputs (``quarantine.jsonl``), with their meaning.
QUARANTINE_REASONS: dict[str, str] = {
    "unreadable": "the file could not be read (missing, a directory, no permission)",
    "not_an_image": "the bytes are not an image format Pillow recognises",
    "truncated": "the image data ends early (partial download or copy)",
    "corrupt": "the image is recognised but fails to decode",
    "too_large": "more pixels than PIL.Image.MAX_IMAGE_PIXELS (decompression-bomb guard)",
    "unsupported_mode": "a pixel format that cannot be converted to RGB",
    "bad_mask": "the mask is unreadable, not integer 0..255, or not the image's size",
    "bad_class": "the class index/name is not in the dataset's label space",
    "bad_value": "a field value the schema does not allow (status, background, group, ...)",
    "id_collision": "a different image already has the same 16-hex-digit sample_id",
    "bad_member": "an archive member that cannot be used (unreadable, unsafe name, bad JSON, no image)",
}

#: Source formats whose RGB 8-bit upright files are stored unchanged, with their extension.
_VERBATIM_FORMATS = {"JPEG": "jpg", "MPO": "jpg", "PNG": "png"}
_EXIF_ORIENTATION = 0x0112
_WHITE = (255, 255, 255)


class ImageRejected(ValueError):
    """An input image (or mask) that will not be stored; ``code`` is a key of QUARANTINE_REASONS."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(f"{code}: {detail}")
        self.code = code
        self.detail = detail


#: Marks a :class:`PreparedImage` that :func:`prepare_image` made in this process (verified by a full decode).
_SEAL = object()


@dataclass(frozen=True)
class PreparedImage:
    """An image ready to store: its bytes, their sha256, extension and upright size.

    ``conversions`` lists what was done to the source ("exif_transpose", "mode CMYK->RGB",
    "16-bit->8-bit", "alpha over white", "re-encoded PNG", ...); empty when stored verbatim.

    One made by :func:`prepare_image` is *verified* (:attr:`verified`): handing it to
    :meth:`~curate.store.Dataset.add_samples` (``NewSample(image=prepared)``) stores its bytes
    without decoding them again, so a collector that verified an image on its way in does not pay
    for a second decode (issue 42). Any other instance (built by hand, or a ``dataclasses.replace``
    copy, which does not carry the mark) is verified from its ``data`` like plain bytes.
    """

    data: bytes
    sha256: str
    ext: str
    width: int
    height: int
    source_format: str | None
    conversions: tuple[str, ...] = field(default_factory=tuple)
    _seal: object = field(default=None, init=False, repr=False, compare=False)

    @property
    def verified(self) -> bool:
        """Whether :func:`prepare_image` made this instance (so its bytes decode, and ``sha256``,
        ``ext`` and the size are theirs)."""
        return self._seal is _SEAL


ImageInput = Path | str | bytes | bytearray | memoryview | Image.Image | PreparedImage


def _sealed(prepared: PreparedImage) -> PreparedImage:
    object.__setattr__(prepared, "_seal", _SEAL)
    return prepared


_DECODE_GUARD = threading.Lock()


@contextlib.contextmanager
def _strict_decoding() -> Iterator[None]:
    """Decode with truncation checks on, even if other code set ``LOAD_TRUNCATED_IMAGES``."""
    if not ImageFile.LOAD_TRUNCATED_IMAGES:
        yield
        return
    with _DECODE_GUARD:
        previous = ImageFile.LOAD_TRUNCATED_IMAGES
        ImageFile.LOAD_TRUNCATED_IMAGES = False
        try:
            yield
        finally:
            ImageFile.LOAD_TRUNCATED_IMAGES = previous


def read_source(image: Path | str | bytes | bytearray | memoryview) -> bytes:
    """The bytes of a path or bytes-like input; raises ImageRejected('unreadable')."""
    if isinstance(image, (bytes, bytearray, memoryview)):
        return bytes(image)
    path = Path(image)
    try:
        return path.read_bytes()
    except IsADirectoryError:
        raise ImageRejected("unreadable", f"{path} is a directory, not an image file") from None
    except FileNotFoundError:
        raise ImageRejected("unreadable", f"{path} does not exist") from None
    except OSError as exc:
        raise ImageRejected("unreadable", f"cannot read {path}: {exc.strerror or exc}") from None


def _looks_like_text(data: bytes) -> bool:
    """Whether ``data`` reads as text (UTF-8, no NUL, nearly all printable): no image format
    Pillow reads is that (every header has binary fields), so such bytes are never a cut image
    even when they happen to start with a format's magic (``BM...`` is a BMP's, ``SIMPLE`` a FITS's)."""
    head = data[:4096]
    if not head or b"\x00" in head:
        return False
    text = head.decode("utf-8", errors="replace")
    odd = sum(1 for ch in text if ch == "\ufffd" or not (ch.isprintable() or ch in "\t\n\r\f\v"))
    return odd <= max(1, len(text) // 50)  # a multi-byte character cut at 4096 bytes is fine


def _not_an_image(data: bytes) -> ImageRejected:
    if not data:
        return ImageRejected("not_an_image", "not an image: the file is empty")
    kind = "bytes of text" if _looks_like_text(data) else "bytes"
    return ImageRejected("not_an_image", f"not an image: {len(data)} {kind} starting {data[:8]!r} "
                                         "(no image format Pillow reads)")


def _rejected(data: bytes, exc: BaseException, where: str) -> ImageRejected:
    """The reason of a decode failure after Pillow recognised a format from the first bytes."""
    if _looks_like_text(data):  # text that starts with some format's magic, e.g. "BMW ..." (BMP)
        return _not_an_image(data)
    message = str(exc)
    if "truncated" in message.lower():
        if where == "header":
            return ImageRejected("truncated", f"the header ends early (a cut file, or not an image): {message}")
        return ImageRejected("truncated", f"the image data ends early: {message}")
    return ImageRejected("corrupt", f"{where} does not parse: {message}" if where == "header" else
                         f"{where} data does not decode: {message}")


def decode(data: bytes) -> Image.Image:
    """Open and fully decode ``data`` (first frame); raises :class:`ImageRejected` with a reason."""
    with _strict_decoding():
        try:
            img = Image.open(io.BytesIO(data))
        except Image.DecompressionBombError as exc:
            raise ImageRejected("too_large", str(exc)) from None
        except Image.UnidentifiedImageError:
            raise _not_an_image(data) from None
        except Exception as exc:  # noqa: BLE001 - Pillow raises many types on bad headers
            raise _rejected(data, exc, "header") from None
        limit = Image.MAX_IMAGE_PIXELS
        if limit and img.width * img.height > limit:
            raise ImageRejected(
                "too_large", f"{img.width}x{img.height} pixels exceed PIL.Image.MAX_IMAGE_PIXELS={limit}"
            )
        try:
            img.load()
        except Image.DecompressionBombError as exc:
            raise ImageRejected("too_large", str(exc)) from None
        except Exception as exc:  # noqa: BLE001 - OSError (truncated, broken data) and others
            raise _rejected(data, exc, str(img.format)) from None
    if img.width <= 0 or img.height <= 0:
        raise ImageRejected("corrupt", f"image has size {img.width}x{img.height}")
    return img


def _orientation(img: Image.Image) -> int:
    try:
        value = img.getexif().get(_EXIF_ORIENTATION)
    except Exception:  # noqa: BLE001 - broken EXIF is ignored, not fatal
        return 1
    return int(value) if isinstance(value, int) and 1 <= value <= 8 else 1


def _scale16(array: np.ndarray) -> np.ndarray:
    """16-bit samples to 8-bit: round(v * 255 / 65535), clipped to 0..65535 first."""
    wide = np.clip(array.astype(np.int64), 0, 65535)
    return ((wide * 255 + 32767) // 65535).astype(np.uint8)


def _png16_colour(data: bytes, img: Image.Image) -> np.ndarray | None:
    """The exact samples (H x W x 3 or 4, uint16) of a 16-bit RGB / RGBA PNG, else None.

    Pillow has no 16-bit colour mode: it decodes such a PNG to 8 bits by keeping each sample's
    high byte (v >> 8), which is not the rule curate applies to 16-bit gray (round(v * 255 /
    65535)). Decoding the file a second time with the little-endian unpacker yields the low
    bytes (the PNG unfiltering is the same), so v = high * 256 + low, and every 16-bit input
    follows the one rule. (16-bit gray+alpha opens as RGBA with no such twin unpacker and keeps
    Pillow's high byte.)
    """
    if img.format != "PNG" or data[12:16] != b"IHDR" or len(data) < 26 or data[24] != 16 or data[25] not in (2, 6):
        return None
    high = np.asarray(img)
    with _strict_decoding():
        try:
            twin = Image.open(io.BytesIO(data))
            twin.tile = [(t[0], t[1], t[2], f"{twin.mode};16L") for t in twin.tile]
            twin.load()
            low = np.asarray(twin)
        except Exception as exc:  # noqa: BLE001 - the first decode worked; this one should too
            log.warning("16-bit PNG: low bytes do not decode (%s); keeping Pillow's 8-bit reading", exc)
            return None
    if low.shape != high.shape:
        return None
    return high.astype(np.uint16) * 256 + low


def to_rgb8(img: Image.Image) -> tuple[Image.Image, list[str]]:
    """Convert any Pillow mode to 8-bit RGB; returns the image and what was done.

    - L / 1 / P (opaque) / CMYK / YCbCr / HSV / LAB: ``Image.convert("RGB")``.
    - LA / RGBA / PA / La / RGBa / P with transparency: composited over white.
    - I;16* (16-bit gray): v8 = round(v * 255 / 65535). I (32-bit) and F: values above 255 are
      treated as 16-bit (same formula); values in 0..255 are kept (F in [0, 1] is scaled by 255).
    """
    mode = img.mode
    if mode == "RGB":
        return img, []
    notes = [f"mode {mode}->RGB"]
    if mode.startswith("I;16") or mode in ("I", "F"):
        array = np.asarray(img)
        if mode.startswith("I;16"):
            gray = _scale16(array)
            notes.append("16-bit->8-bit")
        elif mode == "F" and np.nanmin(array) >= 0 and np.nanmax(array) <= 1:
            gray = np.round(np.nan_to_num(array) * 255).astype(np.uint8)
        elif np.nanmax(array) > 255:
            gray = _scale16(np.nan_to_num(array))
            notes.append("16-bit->8-bit")
        else:
            gray = np.clip(np.nan_to_num(array), 0, 255).round().astype(np.uint8)
        return Image.fromarray(gray, mode="L").convert("RGB"), notes
    has_alpha = mode in ("LA", "RGBA", "PA", "La", "RGBa") or (mode == "P" and "transparency" in img.info)
    try:
        if has_alpha:
            rgba = img.convert("RGBA")
            background = Image.new("RGB", rgba.size, _WHITE)
            background.paste(rgba, mask=rgba.getchannel("A"))
            notes.append("alpha over white")
            return background, notes
        return img.convert("RGB"), notes
    except (ValueError, OSError) as exc:
        raise ImageRejected("unsupported_mode", f"cannot convert mode {mode} to RGB: {exc}") from None


def _encode_png(img: Image.Image, icc_profile: bytes | None) -> bytes:
    """Lossless PNG bytes of an 8-bit RGB image (the stored form of every converted image)."""
    buffer = io.BytesIO()
    kwargs: dict[str, object] = {"compress_level": 6}
    if icc_profile:
        kwargs["icc_profile"] = icc_profile
    img.save(buffer, "PNG", **kwargs)
    return buffer.getvalue()


def prepare_image(image: ImageInput) -> PreparedImage:
    """Verify, convert and encode one input image for storage (see the module docstring).

    Raises :class:`ImageRejected` (with a reason code) for anything that must be quarantined.
    A :attr:`~PreparedImage.verified` :class:`PreparedImage` is returned as it is (it was decoded
    once already); any other :class:`PreparedImage` is prepared from its ``data``.
    """
    if isinstance(image, PreparedImage):
        return image if image.verified else prepare_image(image.data)
    if isinstance(image, Image.Image):
        return _sealed(_prepare_pil(image))
    data = read_source(image)
    img = decode(data)
    fmt = img.format
    orientation = _orientation(img)
    wide = _png16_colour(data, img)
    if fmt in _VERBATIM_FORMATS and img.mode == "RGB" and orientation == 1 and wide is None:
        return _sealed(PreparedImage(
            data=data, sha256=hashlib.sha256(data).hexdigest(), ext=_VERBATIM_FORMATS[fmt],
            width=img.width, height=img.height, source_format=fmt,
        ))
    notes: list[str] = []
    keep_icc = img.mode == "RGB"  # a CMYK/gray profile does not describe the converted pixels
    icc = img.info.get("icc_profile") if keep_icc else None
    if wide is not None:
        exact = Image.fromarray(_scale16(wide), mode=img.mode)
        exact.info = dict(img.info)  # EXIF / XMP orientation, for exif_transpose below
        img = exact
        notes.append("16-bit->8-bit")
    if orientation != 1:
        img = ImageOps.exif_transpose(img)
        notes.append("exif_transpose")
    img, converted = to_rgb8(img)
    notes.extend(converted)
    # PNG, not the source's format: lossless, so the stored pixels are the converted ones (module doc)
    notes.append("re-encoded PNG")
    data = _encode_png(img, icc)
    return _sealed(PreparedImage(
        data=data, sha256=hashlib.sha256(data).hexdigest(), ext="png",
        width=img.width, height=img.height, source_format=fmt, conversions=tuple(notes),
    ))


def _prepare_pil(image: Image.Image) -> PreparedImage:
    """An in-memory image: upright, RGB 8-bit, stored as PNG (lossless)."""
    with _strict_decoding():
        try:
            image.load()
        except Exception as exc:  # noqa: BLE001
            raise ImageRejected("corrupt", f"the PIL image does not decode: {exc}") from None
    notes: list[str] = []
    if _orientation(image) != 1:
        image = ImageOps.exif_transpose(image)
        notes.append("exif_transpose")
    image, converted = to_rgb8(image)
    notes.extend(converted)
    data = _encode_png(image, None)
    return PreparedImage(
        data=data, sha256=hashlib.sha256(data).hexdigest(), ext="png",
        width=image.width, height=image.height, source_format=None, conversions=tuple(notes),
    )


def prepare_mask(mask: MaskInput, size: tuple[int, int]) -> bytes:
    """PNG bytes (mode L) of a mask that must be ``size`` = (width, height) of the stored image.

    Accepts an H x W array (bool or integer, or float holding integers) with values 0..255,
    or a path / bytes of an image whose pixels are such values (1, L, P, I;16 or gray RGB).
    Raises :class:`ImageRejected` ('bad_mask') otherwise.
    """
    array = mask_array(mask)
    height, width = array.shape
    if (width, height) != tuple(size):
        raise ImageRejected(
            "bad_mask", f"mask is {width}x{height} but the stored (upright) image is {size[0]}x{size[1]}"
        )
    buffer = io.BytesIO()
    Image.fromarray(array, mode="L").save(buffer, "PNG", compress_level=6)
    return buffer.getvalue()


def mask_array(mask: MaskInput) -> np.ndarray:
    """An H x W uint8 array from any accepted mask input (see :func:`prepare_mask`)."""
    if isinstance(mask, np.ndarray):
        array = mask
    else:
        try:
            data = read_source(mask)  # type: ignore[arg-type]
        except ImageRejected as exc:
            raise ImageRejected("bad_mask", exc.detail) from None
        try:
            img = decode(data)
        except ImageRejected as exc:
            raise ImageRejected("bad_mask", f"mask image: {exc}") from None
        if img.mode in ("RGB", "RGBA"):
            rgb = np.asarray(img.convert("RGB"))
            if not (np.array_equal(rgb[..., 0], rgb[..., 1]) and np.array_equal(rgb[..., 0], rgb[..., 2])):
                raise ImageRejected("bad_mask", "mask image is in colour; give a grayscale/label image")
            array = rgb[..., 0]
        elif img.mode in ("1", "L", "P") or img.mode.startswith("I"):
            array = np.asarray(img)
        else:
            raise ImageRejected("bad_mask", f"mask image mode {img.mode} is not a label image")
    if array.ndim == 3 and array.shape[2] == 1:
        array = array[..., 0]
    if array.ndim != 2:
        raise ImageRejected("bad_mask", f"mask must be H x W, got shape {tuple(array.shape)}")
    if array.dtype == bool:
        return array.astype(np.uint8)
    if np.issubdtype(array.dtype, np.floating):
        if not np.all(np.isfinite(array)) or not np.all(array == np.round(array)):
            raise ImageRejected("bad_mask", "mask holds non-integer values; give 0/1 or instance ids")
    elif not np.issubdtype(array.dtype, np.integer):
        raise ImageRejected("bad_mask", f"mask dtype {array.dtype} is not integer")
    if array.size and (array.min() < 0 or array.max() > 255):
        raise ImageRejected(
            "bad_mask", f"mask values span {array.min()}..{array.max()}; allowed are 0..255 (0/1 or instance ids)"
        )
    return array.astype(np.uint8)


def image_size(path: Path) -> tuple[int, int]:
    """(width, height) from the header only (cheap)."""
    with Image.open(path) as img:
        return img.size
