"""What every engine runs per image batch: decoding and preprocessing files, the model's output.

The floor below both the engines (:mod:`curate.engine.local`, :mod:`curate.engine.ray_data`,
:func:`curate.engine.base.encode_batch`) and the feature cache (:mod:`curate.features`, which
calls the engines): it imports neither. Importing it imports no torch.

Two input paths turn image files into the model's input (``docs/scaling.md#feeding-the-gpu``):

- ``cpu-exact`` (:class:`ImageFiles`): the model's own eval transform (open_clip's or timm's PIL
  preprocessing) in the loader workers, float32 tensors to the model. Equal to CLIP_benchmark;
  the default everywhere.
- ``gpu`` (:class:`RawImageFiles` + :class:`DeviceBatches`): the workers only read the file
  (JPEG: its bytes; other formats, or a JPEG when decoding on the host: the decoded uint8
  pixels); the main process pins the uint8 tensors, moves them to the device, decodes the
  JPEGs there in one batched ``torchvision.io.decode_jpeg`` call (falling back to one at a
  time, then to PIL on the host, for a batch or an image the device decoder refuses), and
  resizes, centre-crops and normalises on the device (:class:`DeviceTransform`, the same
  geometry as the model's transform; bicubic/bilinear with antialiasing, rounded to 8 bits
  after the resize as PIL does). It runs on any device, so tests check it on the CPU.

:func:`choose_input_path` picks one; which path made a feature is part of the feature cache's
key (another path gives other pixels, hence other features).
"""
from __future__ import annotations

import contextlib
import io
import os
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch is imported where images are encoded
    import torch

__all__ = ["INPUT_PATHS", "INPUT_PATH_CHOICES", "DeviceBatches", "DeviceTransform", "ImageFiles", "RawImageFiles",
           "choose_input_path", "collate_raw", "decode_on_device", "default_workers", "device_transform_of",
           "model_output"]

#: The input paths a feature can be made by (recorded in the feature cache and the run).
INPUT_PATHS: tuple[str, ...] = ("cpu-exact", "gpu")
#: What a caller may ask for: ``auto`` = :func:`choose_input_path`'s rule.
INPUT_PATH_CHOICES: tuple[str, ...] = ("auto", *INPUT_PATHS)

#: How a worker hands an image to :class:`DeviceBatches`: JPEG bytes to decode on the device,
#: or pixels decoded on the host.
JPEG_BYTES, HOST_PIXELS = 0, 1
_JPEG_MAGIC = b"\xff\xd8\xff"


class ImageFiles:
    """Decodes and preprocesses images; a failure yields a zero tensor and its reason.

    A map-style dataset for ``torch.utils.data.DataLoader`` (``__len__`` + ``__getitem__``; no
    ``Dataset`` base class, so defining it does not import torch)."""

    def __init__(self, paths: Sequence[Path | str], preprocess: Callable, image_size: tuple[int, int]) -> None:
        self.paths = list(paths)
        self.preprocess = preprocess
        self.image_size = image_size

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int):
        from PIL import Image

        try:
            with Image.open(self.paths[index]) as image:
                image.load()
                tensor = self.preprocess(image.convert("RGB"))
            return index, tensor, ""
        except Exception as error:  # reported per sample, never fatal for the batch
            import torch

            return index, torch.zeros(3, *self.image_size), f"{type(error).__name__}: {error}"[:300]


def model_output(model: Any, kind: str, batch: torch.Tensor) -> torch.Tensor:
    """The cached output of ``kind`` for a preprocessed batch: the L2-normalised image embedding
    (``embedding``) or the classifier's logits (``logits``).

    On a CPU, a model with a ``fast_output`` (a timm classifier:
    :meth:`curate.models.classifier.ClassifierModel.fast_output`) computes it: a few images a
    pass, channels-last, batch norms folded into their convolutions (EfficientNet-Lite0, 2 cores:
    14 ms an image against 37-60 ms in one pass of a 32-256 batch, ``benchmarks/classifier.py``).
    Each image's output is the same function of its pixels either way, up to float rounding."""
    fast = getattr(model, "fast_output", None) if _on_cpu(model) else None
    if callable(fast):
        return fast(kind, batch)
    if kind == "embedding":
        return model.encode_image(batch, normalize=True)
    return model.logits(batch)


def _on_cpu(model: Any) -> bool:
    device = getattr(model, "device", None)
    return (getattr(device, "type", None) or str(device).split(":")[0]) == "cpu"


def default_workers(device: torch.device | str) -> int:
    """Decoding workers: on a GPU machine every core but one (the main process feeds the GPU),
    at most 32; none on CPU, where the model needs the cores.

    The issue that set this measured 8 workers on a 16-core H200 host decoding 1,160 images/s
    and 15 workers 1,720: decoding scales with cores, so the old cap of 8 left half the machine
    idle. ``os.sched_getaffinity`` counts the cores this process may use (a container's or a
    scheduler's share), not the machine's."""
    kind = getattr(device, "type", None) or str(device).split(":")[0]
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return min(32, max(1, cpus - 1)) if kind == "cuda" else 0


# ----------------------------------------------------------------------------- the device path
@dataclass(frozen=True)
class DeviceTransform:
    """The model's eval transform, applied to a batch of uint8 ``(3, h, w)`` tensors on a device.

    ``resize``: as torchvision's ``Resize`` (an int: the shorter side, the longer one scaled;
    a pair: exactly ``(H, W)``), ``interpolation`` its mode, ``max_size`` its cap; ``crop``: the
    centre crop ``(H, W)`` (None: none); then ``(x / 255 - mean) / std``. Images of the same
    size are resized in one call. The resize is rounded and clamped to [0, 255] as PIL's 8-bit
    resize is, so the only difference from the exact path is the resampling arithmetic (float
    on the device vs PIL's fixed point) and, on CUDA, the JPEG decoder (nvjpeg vs libjpeg-turbo):
    a few 8-bit levels at edges (measured in ``tests/test_feed_input_path.py``).
    """

    resize: int | tuple[int, int] | None
    interpolation: str
    max_size: int | None
    crop: tuple[int, int] | None
    mean: tuple[float, float, float]
    std: tuple[float, float, float]

    def __call__(self, images: Sequence[torch.Tensor]) -> torch.Tensor:
        import torch
        from torchvision.transforms import InterpolationMode
        from torchvision.transforms.v2 import functional as F

        if not images:
            raise ValueError("no images to transform")
        mode = InterpolationMode(self.interpolation)
        out: list[torch.Tensor | None] = [None] * len(images)
        groups: dict[tuple[int, ...], list[int]] = {}
        for i, image in enumerate(images):
            groups.setdefault(tuple(image.shape), []).append(i)
        for positions in groups.values():
            x = torch.stack([images[i] for i in positions]).float()
            if self.resize is not None:
                size = [self.resize] if isinstance(self.resize, int) else list(self.resize)
                x = F.resize(x, size, interpolation=mode, max_size=self.max_size, antialias=True)
                x = x.round_().clamp_(0, 255)
            if self.crop is not None:
                x = F.center_crop(x, list(self.crop))
            for j, i in enumerate(positions):
                out[i] = x[j]
        batch = torch.stack(out)  # type: ignore[arg-type]
        mean = torch.tensor(self.mean, device=batch.device).view(1, 3, 1, 1)
        std = torch.tensor(self.std, device=batch.device).view(1, 3, 1, 1)
        return batch.div_(255).sub_(mean).div_(std)


def _size(value: Any) -> int | tuple[int, int]:
    if isinstance(value, int):
        return value
    value = tuple(int(v) for v in value)
    return value[0] if len(value) == 1 else (value[0], value[1])


def device_transform_of(preprocess: Any) -> DeviceTransform | None:
    """The :class:`DeviceTransform` equal in geometry to ``preprocess``, or None when it holds a
    step this does not reproduce (then only the exact path can run the model).

    Recognised, in a torchvision ``Compose``: ``Resize``, ``CenterCrop``, RGB conversions
    (open_clip's ``MaybeConvertMode``, ``_convert_to_rgb``), ``ToTensor`` / ``MaybeToTensor``,
    and one ``Normalize`` at the end (open_clip's and timm's eval transforms)."""
    steps = getattr(preprocess, "transforms", None)
    if not isinstance(steps, (list, tuple)):
        return None
    resize: int | tuple[int, int] | None = None
    interpolation, max_size, crop = "bilinear", None, None
    mean = std = None
    tensor = False
    for step in steps:
        name = getattr(step, "__name__", None) or type(step).__name__  # a function (_convert_to_rgb) or a class
        if tensor and name != "Normalize":
            return None  # anything after ToTensor other than Normalize
        if name == "Resize":
            if resize is not None or crop is not None:
                return None
            resize = _size(step.size)
            interpolation = getattr(step.interpolation, "value", str(step.interpolation))
            max_size = step.max_size
            if getattr(step, "antialias", True) is False or interpolation not in ("bicubic", "bilinear", "nearest"):
                return None
        elif name == "CenterCrop":
            crop_size = _size(step.size)
            crop = (crop_size, crop_size) if isinstance(crop_size, int) else crop_size
        elif name in ("MaybeConvertMode", "_convert_to_rgb"):
            if getattr(step, "mode", "RGB") != "RGB":
                return None
        elif name in ("ToTensor", "MaybeToTensor"):
            tensor = True
        elif name == "Normalize" and tensor and mean is None:
            mean, std = tuple(float(m) for m in step.mean), tuple(float(s) for s in step.std)
        else:
            return None
    if not tensor or mean is None or std is None or len(mean) != 3 or len(std) != 3:
        return None
    return DeviceTransform(resize, interpolation, max_size, crop, mean, std)  # type: ignore[arg-type]


def choose_input_path(device: Any, requested: str = "auto", preprocess: Any = None) -> str:
    """Which input path encodes: ``cpu-exact`` or ``gpu`` (module docstring).

    ``auto``: ``gpu`` when ``device`` is a CUDA device (anything with ``.type == "cuda"``, or
    the string) and ``preprocess`` (when given) is one :func:`device_transform_of` reproduces;
    ``cpu-exact`` otherwise, so on a CPU the numbers stay CLIP_benchmark's. An explicit
    ``cpu-exact`` or ``gpu`` is honoured whatever the device (``gpu`` on a CPU runs the device
    code on the CPU: tests and benchmarks), except ``gpu`` with a transform it cannot
    reproduce, which is an error rather than other numbers."""
    if requested not in INPUT_PATH_CHOICES:
        raise ValueError(f"input path must be one of {', '.join(INPUT_PATH_CHOICES)}, got {requested!r}")
    reproducible = preprocess is None or device_transform_of(preprocess) is not None
    if requested == "gpu" and not reproducible:
        raise ValueError(f"the gpu input path cannot reproduce this model's transform ({preprocess!r}); "
                         "use input path cpu-exact")
    if requested != "auto":
        return requested
    kind = getattr(device, "type", None) or str(device).split(":")[0]
    return "gpu" if kind == "cuda" and reproducible else "cpu-exact"


@contextlib.contextmanager
def _quiet_torchvision_io() -> Iterator[None]:
    """torchvision 0.29 warns on every decode that its image I/O moves to TorchCodec; the calls
    still work, and the warning would repeat once per image."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*TorchCodec.*")
        yield


def _host_pixels(data: bytes) -> torch.Tensor:
    """PIL decode of file bytes -> uint8 ``(3, h, w)`` RGB (what the exact path decodes)."""
    import numpy as np
    import torch
    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        pixels = np.asarray(image.convert("RGB"), dtype=np.uint8)
    return torch.from_numpy(pixels.copy()).permute(2, 0, 1)


class RawImageFiles:
    """The workers' half of the ``gpu`` input path: item ``i`` -> ``(i, payload, how, reason)``.

    ``how`` is :data:`JPEG_BYTES` (``payload`` = the file's bytes as a uint8 tensor, decoded on
    the device by :func:`decode_on_device`) when ``device_decode`` and the file starts like a
    JPEG; otherwise :data:`HOST_PIXELS` (``payload`` = uint8 ``(3, h, w)``, decoded here with
    ``torchvision.io.decode_jpeg`` for a JPEG, PIL for anything else or a JPEG it refuses). A
    file that cannot be read or decoded gives an empty payload and its reason."""

    def __init__(self, paths: Sequence[Path | str], *, device_decode: bool) -> None:
        self.paths = list(paths)
        self.device_decode = device_decode

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int):
        import torch

        try:
            with open(self.paths[index], "rb") as handle:
                data = handle.read()
            is_jpeg = data[:3] == _JPEG_MAGIC
            if is_jpeg and self.device_decode:
                return index, torch.frombuffer(bytearray(data), dtype=torch.uint8), JPEG_BYTES, ""
            if is_jpeg:
                from torchvision.io import ImageReadMode, decode_jpeg

                try:
                    raw = torch.frombuffer(bytearray(data), dtype=torch.uint8)
                    with _quiet_torchvision_io():
                        return index, decode_jpeg(raw, mode=ImageReadMode.RGB), HOST_PIXELS, ""
                except Exception:  # noqa: BLE001 - PIL below decides
                    pass
            return index, _host_pixels(data), HOST_PIXELS, ""
        except Exception as error:  # reported per sample, never fatal for the batch
            return index, torch.zeros(0, dtype=torch.uint8), HOST_PIXELS, f"{type(error).__name__}: {error}"[:300]


def collate_raw(items: list[tuple[int, Any, int, str]]) -> tuple[Any, list[Any], list[int], list[str]]:
    """A ``DataLoader`` collate for :class:`RawImageFiles`: sizes differ, so payloads stay a list
    (the loader still pins each tensor)."""
    import torch

    return (torch.tensor([it[0] for it in items], dtype=torch.long), [it[1] for it in items],
            [it[2] for it in items], [it[3] for it in items])


def decode_on_device(payloads: Sequence[torch.Tensor], hows: Sequence[int], device: Any
                     ) -> tuple[list[torch.Tensor | None], list[str]]:
    """uint8 ``(3, h, w)`` images on ``device`` for one batch, and a reason per failure.

    The :data:`JPEG_BYTES` payloads are decoded together (``torchvision.io.decode_jpeg`` on
    ``device``, batched); when that call fails, each is tried alone, and one the device refuses
    is decoded on the host by PIL (progressive or CMYK JPEGs some nvjpeg builds refuse). A
    payload nothing decodes is None with its reason."""

    images: list[torch.Tensor | None] = [None] * len(payloads)
    errors = [""] * len(payloads)
    jpegs = [i for i, how in enumerate(hows) if how == JPEG_BYTES and payloads[i].numel()]
    for i, how in enumerate(hows):
        if how != JPEG_BYTES and payloads[i].numel():
            images[i] = payloads[i].to(device, non_blocking=True)
        elif not payloads[i].numel():
            errors[i] = "empty file"
    if jpegs:
        with _quiet_torchvision_io():
            _decode_jpegs(payloads, jpegs, images, errors, device)
    return images, errors


def _decode_jpegs(payloads: Sequence[torch.Tensor], jpegs: list[int], images: list[torch.Tensor | None],
                  errors: list[str], device: Any) -> None:
    """:func:`decode_on_device`'s JPEGs: batched, else one by one, else PIL on the host."""
    from torchvision.io import ImageReadMode, decode_jpeg

    try:
        decoded = decode_jpeg([payloads[i] for i in jpegs], mode=ImageReadMode.RGB, device=device)
        for i, image in zip(jpegs, decoded):
            images[i] = image
    except Exception:  # noqa: BLE001 - one bad file fails the batched call: go one by one
        for i in jpegs:
            try:
                images[i] = decode_jpeg(payloads[i], mode=ImageReadMode.RGB, device=device)
            except Exception:  # noqa: BLE001 - the host decoder decides
                try:
                    images[i] = _host_pixels(payloads[i].cpu().numpy().tobytes()).to(device)
                except Exception as error:  # noqa: BLE001 - reported per sample
                    errors[i] = f"{type(error).__name__}: {error}"[:300]


class DeviceBatches:
    """The main process's half of the ``gpu`` input path: one loader batch of
    :func:`collate_raw` -> ``(indices, pixels (N, 3, H, W) float on the device, reasons)``,
    failures as zero rows with their reason (what :func:`curate.engine.base.encode_batch`
    takes)."""

    def __init__(self, transform: DeviceTransform, device: Any, image_size: tuple[int, int]) -> None:
        self.transform, self.device, self.image_size = transform, device, tuple(image_size)

    def __call__(self, batch: tuple[Any, list[Any], list[int], list[str]]) -> tuple[list[int], Any, list[str]]:
        import torch

        indices, payloads, hows, errors = batch
        images, decode_errors = decode_on_device(payloads, hows, self.device)
        reasons = [e or d for e, d in zip(errors, decode_errors)]
        good = [i for i, (image, reason) in enumerate(zip(images, reasons)) if image is not None and not reason]
        pixels = torch.zeros(len(payloads), 3, *self.image_size, device=self.device)
        if good:
            pixels[good] = self.transform([images[i] for i in good])  # type: ignore[misc]
        for i, image in enumerate(images):
            if image is None and not reasons[i]:
                reasons[i] = "not decoded"
        return indices.tolist(), pixels, reasons
