"""``salient:PATH.onnx``: a salient-object segmenter (U2-Net, IS-Net, BiRefNet) run by ONNX Runtime.

These models were trained to cut the main object out of a photo (background removal, dichotomous
image segmentation): image in, one foreground map out, no text. They are what ``rembg`` runs,
and their ONNX files are what it downloads. The proposal does not depend on the prompt (the
stage passes one; it is recorded and ignored): on a photo of one animal the salient object is the
animal, which is what a CounterAnimal-style benchmark needs masked; on a cluttered photo it may
be something else, which review and ``--measure`` show.

Spec
----
``salient:PATH[#OPTIONS]``. ``PATH`` is a local ``.onnx`` file (nothing is downloaded);
``OPTIONS`` (comma-separated, the CLI's ``--preset``, ``--input-size``, ``--mean``, ``--std``
and ``--postprocess`` write them, :func:`with_options`) are a preset name and/or
``size=H[xW]``, ``mean=R/G/B``, ``std=R/G/B``, ``output=<one of OUTPUTS>``, each overriding the
preset's value. An existing file is a ``PATH`` whole (so a path may hold ``#``); else the text
is split at its last ``#``. Without a preset in the options, the file's name picks one when it
is a name ``rembg`` saves (:data:`FILE_PRESETS`: ``u2net.onnx``, ``isnet-general-use.onnx``,
``birefnet-general.onnx``, ...); a file with neither a preset nor all four values is refused,
naming its input shape and the presets that feed it (:func:`input_shape`, :func:`presets_for_shape`).

Presets (:data:`PRESETS`, the values of rembg's sessions, ``rembg/sessions/*.py``):

================  ===========  =======================  =======================  ==================
preset            input        mean                     std                      output
================  ===========  =======================  =======================  ==================
``u2net``         320 x 320    0.485 / 0.456 / 0.406    0.229 / 0.224 / 0.225    ``minmax``
``isnet``         1024 x 1024  0.5 / 0.5 / 0.5          1 / 1 / 1                ``minmax``
``isnet-anime``   1024 x 1024  0.485 / 0.456 / 0.406    1 / 1 / 1                ``minmax``
``birefnet``      1024 x 1024  0.485 / 0.456 / 0.406    0.229 / 0.224 / 0.225    ``sigmoid-minmax``
================  ===========  =======================  =======================  ==================

``u2net`` serves rembg's u2net, u2netp, u2net_human_seg and silueta; ``isnet``
isnet-general-use; ``birefnet`` every birefnet-* file.

Formula
-------
For a photo ``I`` of size ``W x H`` (``preprocess``, rembg's ``BaseSession.normalize``):

1. ``x = resize(RGB(I), (w, h), LANCZOS)`` (squashed to the input, no crop), as float;
   ``x = x / max(max(x), 1e-6)`` (the photo's own brightest value, 255 for most photos);
   ``x_c = (x_c - mean_c) / std_c``; laid out ``(3, h, w)``; a batch stacks photos.
2. ``y``: the model's **first** output for the photo, channel 0 (``out[i, 0]`` of an
   ``(N, C, h', w')`` output, ``out[i]`` of ``(N, h', w')``), as float64.
3. ``p = post(y)`` (``output_map``): ``minmax``: ``(y - min y) / (max y - min y)``;
   ``sigmoid-minmax``: the same of ``sigmoid(y)``; ``sigmoid``: ``sigmoid(y)``; ``none``:
   ``clip(y, 0, 1)``. Min-max is per photo (rembg runs one photo per call, so its batch-wide
   min-max is the same), which makes batches give what single photos give.
4. ``P = clip(resize(p, (W, H), LANCZOS), 0, 1)``: back to the photo's size (rembg resizes the
   8-bit map; here the float map, without the rounding).
5. ``mask = P >= threshold``; ``score = mean(P[mask])``; no pixel at the threshold: no mask,
   ``score = max(P)`` (:func:`curate.masks.backends.clipseg.proposal_of`, CLIPSeg's rule).

With a ``minmax`` output the map's peak is 1 on every photo, so every photo gets a mask (the
threshold cuts the map at a fraction of its range, as rembg's alpha matte does): the score is a
shape statistic, not a probability that there is an object. ``sigmoid`` keeps the model's own
calibration (BiRefNet's logits; U2-Net and IS-Net already end in a sigmoid, so ``none`` gives
theirs). A constant output has no mask (``"the model's output map is constant"``), a non-finite
one neither (``"the model's output is not finite"``).

The model file
--------------
Checked when it loads, before any photo (:func:`check_model`), each failure a one-line
:class:`~curate.models.base.ModelError`: one input, of rank 4, float or float16, 3 channels, and
where its height and width are fixed numbers, the preprocessing's size; the first output of rank
3 or 4. A fixed batch dimension (``1`` in many exports) is honoured: photos go through in groups
of that size (the last group padded with copies and the copies dropped). Out of memory halves
``batch_size`` and goes on (:func:`curate.engine.base.halving`).

Device: ``cpu`` is ONNX Runtime's CPU provider; ``cuda[:N]`` its CUDA provider (``pip install
'curate[salient-gpu]'``, onnxruntime-gpu, instead of ``curate[salient]``), refused when it is
missing or falls back to the CPU; ``auto`` is CUDA when the provider is there, else the CPU.
``--precision`` must be ``fp32``: the model runs in the types of its ONNX file (a float16 file
is fed float16). With ``OMP_WAIT_POLICY=PASSIVE`` ONNX Runtime's threads sleep instead of
spinning while they wait, as torch's do.

Identity: ``model_id = "salient-<preset>:<file stem>@<sha256[:12] of the file>"``, or
``salient-custom-<8 hex of the preprocessing>:...`` when the values are not exactly a preset's;
:func:`identity` computes it and ``info`` without loading ONNX Runtime.
"""
from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from curate.masks.backends.base import MaskModelSpec, MaskSpecError, Proposal, checked_request, parse_mask_spec
from curate.masks.backends.clipseg import proposal_of
from curate.models.base import ModelError, WeightsNotFoundError, check_precision

if TYPE_CHECKING:  # pragma: no cover
    from PIL import Image

__all__ = ["OUTPUTS", "PRESETS", "FILE_PRESETS", "Preprocessing", "SalientSpec", "SalientProposer", "InputPlan",
           "parse_salient_spec", "with_options", "preset_for_file", "input_shape", "presets_for_shape", "preprocess",
           "output_map", "proposal_from_map",
           "open_session", "check_model", "salient_model_id", "load", "identity"]

logger = logging.getLogger(__name__)

#: How the first output becomes a map in [0, 1] (module docstring, step 3).
OUTPUTS: tuple[str, ...] = ("minmax", "sigmoid-minmax", "sigmoid", "none")
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
CONSTANT_REASON = "the model's output map is constant"
NONFINITE_REASON = "the model's output is not finite"
INSTALL_HINT = "pip install 'curate[salient]' (CPU) or 'curate[salient-gpu]' (CUDA)"


@dataclass(frozen=True)
class Preprocessing:
    """What a model family expects: input ``size`` ``(h, w)``, per-channel ``mean`` / ``std`` on
    pixels scaled to [0, 1], and how its first ``output`` becomes a map (one of :data:`OUTPUTS`)."""

    size: tuple[int, int]
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    output: str

    def text(self) -> str:
        """The canonical options text: ``size=HxW,mean=R/G/B,std=R/G/B,output=NAME``."""
        return (f"size={self.size[0]}x{self.size[1]},mean={'/'.join(f'{v:g}' for v in self.mean)},"
                f"std={'/'.join(f'{v:g}' for v in self.std)},output={self.output}")

    def as_dict(self) -> dict[str, Any]:
        return {"input_size": list(self.size), "mean": list(self.mean), "std": list(self.std), "output": self.output}


#: rembg's sessions (``rembg/sessions/*.py``): input size, mean, std and output post-processing.
PRESETS: dict[str, Preprocessing] = {
    "u2net": Preprocessing((320, 320), IMAGENET_MEAN, IMAGENET_STD, "minmax"),
    "isnet": Preprocessing((1024, 1024), (0.5, 0.5, 0.5), (1.0, 1.0, 1.0), "minmax"),
    "isnet-anime": Preprocessing((1024, 1024), IMAGENET_MEAN, (1.0, 1.0, 1.0), "minmax"),
    "birefnet": Preprocessing((1024, 1024), IMAGENET_MEAN, IMAGENET_STD, "sigmoid-minmax"),
}
#: The file names rembg saves (``~/.u2net/<session name>.onnx``) -> their preset; any name that
#: starts with ``birefnet`` (rembg's names and the release files ``BiRefNet-*.onnx``) is ``birefnet``.
FILE_PRESETS: dict[str, str] = {"u2net": "u2net", "u2netp": "u2net", "u2net_human_seg": "u2net",
                                "silueta": "u2net", "isnet-general-use": "isnet", "isnet-anime": "isnet-anime"}
_KEYS = ("size", "mean", "std", "output")


def preset_for_file(path: str | Path) -> str | None:
    """The preset of a file named as rembg names it (:data:`FILE_PRESETS`), else None."""
    stem = Path(path).name.lower().removesuffix(".onnx")
    if stem.startswith("birefnet"):
        return "birefnet"
    return FILE_PRESETS.get(stem)


@dataclass(frozen=True)
class SalientSpec:
    """A parsed ``salient:`` spec: the file, the preset named or picked by the file name (None
    when the values are all given), the effective :class:`Preprocessing`, and the spec text."""

    path: Path
    preset: str | None
    prep: Preprocessing
    text: str
    from_file_name: bool = False

    @property
    def family(self) -> str:
        """The preset's name when the values are exactly its, else ``custom-<8 hex>``."""
        if self.preset is not None and PRESETS[self.preset] == self.prep:
            return self.preset
        return "custom-" + hashlib.sha256(self.prep.text().encode()).hexdigest()[:8]


def _triple(text: str, what: str, spec: str) -> tuple[float, float, float]:
    parts = [p for p in text.replace(",", "/").split("/") if p.strip()]
    try:
        values = tuple(float(p) for p in parts)
    except ValueError:
        values = ()
    if len(values) != 3 or not all(np.isfinite(values)):
        raise MaskSpecError(f"mask model {spec!r}: {what} needs three numbers (R/G/B), got {text!r}")
    return values  # type: ignore[return-value]


def _size(text: str, spec: str) -> tuple[int, int]:
    h, x, w = text.lower().partition("x")
    try:
        size = (int(h), int(w if x else h))
    except ValueError:
        size = (0, 0)
    if min(size) < 1 or max(size) > 16384:
        raise MaskSpecError(f"mask model {spec!r}: size needs N or HxW (pixels, 1 to 16384), got {text!r}")
    return size


def _split(rest: str) -> tuple[str, str]:
    """``(path, options)``: an existing file is a path whole; else split at the last ``#``."""
    if "#" not in rest or Path(rest).expanduser().is_file():
        return rest, ""
    path, _, options = rest.rpartition("#")
    return path, options


def parse_salient_spec(spec: str | MaskModelSpec) -> SalientSpec:
    """Read a ``salient:`` spec (module docstring, Spec); the file's existence is not checked here.

    Raises:
        MaskSpecError: a malformed option, an unknown key or preset, or no preset and not all of
            size, mean, std and output.
    """
    parsed = parse_mask_spec(spec)
    text = parsed.text
    if parsed.backend != "salient":
        raise MaskSpecError(f"mask model {text!r} is not a salient: spec")
    raw_path, options = _split(parsed.parts.get("salient", ""))
    if not raw_path:
        raise MaskSpecError(f"mask model {text!r} names no .onnx file; expected salient:PATH.onnx")
    path = Path(raw_path).expanduser()
    preset: str | None = None
    values: dict[str, Any] = {}
    for item in (i.strip() for i in options.split(",") if i.strip()):
        key, eq, value = item.partition("=")
        key = key.strip().lower()
        if not eq:
            if key not in PRESETS:
                raise MaskSpecError(f"mask model {text!r}: unknown preset {item!r}; presets: {', '.join(PRESETS)}")
            if preset is not None and preset != key:
                raise MaskSpecError(f"mask model {text!r} names two presets, {preset} and {key}")
            preset = key
        elif key == "size":
            values["size"] = _size(value.strip(), text)
        elif key in ("mean", "std"):
            values[key] = _triple(value, key, text)
            if key == "std" and min(values[key]) <= 0:
                raise MaskSpecError(f"mask model {text!r}: std must be > 0, got {value!r}")
        elif key == "output":
            if value.strip() not in OUTPUTS:
                raise MaskSpecError(f"mask model {text!r}: output {value!r} is not one of {', '.join(OUTPUTS)}")
            values["output"] = value.strip()
        else:
            raise MaskSpecError(f"mask model {text!r}: unknown option {key!r}; options are a preset "
                                f"({', '.join(PRESETS)}) and {', '.join(k + '=' for k in _KEYS)}")
    named = preset is not None
    if preset is None:
        preset = preset_for_file(path)
    if preset is None:
        missing = [k for k in _KEYS if k not in values]
        if missing:
            shape = input_shape(path)
            fit = presets_for_shape(shape) if shape else list(PRESETS)
            which = (f"preset {fit[0]} feeds" if len(fit) == 1 else f"presets {', '.join(fit)} feed" if fit
                     else "no preset feeds")
            said = (f"its input is {_shape_text(shape)}, which {which} (docs/masks.md says where each preset's file "
                    "comes from); " if shape else "")
            raise MaskSpecError(f"mask model {text!r}: no preset for {path.name!r} (not a file name rembg uses) and "
                                f"no {', '.join(missing)}; {said}give "
                                f"{'--preset ' + '|'.join(fit) + ', or ' if fit else ''}all of --input-size, --mean, "
                                "--std and --postprocess")
        base = Preprocessing(values["size"], values["mean"], values["std"], values["output"])
    else:
        base = PRESETS[preset]
    prep = Preprocessing(values.get("size", base.size), values.get("mean", base.mean), values.get("std", base.std),
                         values.get("output", base.output))
    return SalientSpec(path, preset, prep, text, from_file_name=preset is not None and not named)


def input_shape(path: str | Path) -> list[Any] | None:
    """The first input's shape of an ONNX file (``[N, 3, H, W]``, a free dimension as a name or
    None), read by ONNX Runtime on the CPU; None when the file is absent or does not load."""
    path = Path(path).expanduser()
    if not path.is_file():
        return None
    try:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.log_severity_level = 3
        inputs = ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"]).get_inputs()
    except Exception:  # noqa: BLE001 - no ONNX Runtime, or not a model: nothing to read
        return None
    return _dims(inputs[0].shape) if inputs else None


def presets_for_shape(shape: Sequence[Any]) -> list[str]:
    """The presets whose input size a model of input ``shape`` takes: those of its fixed ``H x W``,
    every preset when height or width is free, none when it is not an image input (rank 4, 3 channels)."""
    dims = list(shape)
    if len(dims) != 4 or (isinstance(dims[1], int) and dims[1] > 0 and dims[1] != 3):
        return []
    h, w = dims[2], dims[3]
    if not (isinstance(h, int) and h > 0 and isinstance(w, int) and w > 0):
        return list(PRESETS)
    return [name for name, prep in PRESETS.items() if prep.size == (h, w)]


def with_options(model: str, *, preset: str | None = None, input_size: str | None = None, mean: str | None = None,
                 std: str | None = None, postprocess: str | None = None) -> str:
    """``model`` (a ``salient:`` spec) with the CLI's options appended as spec options
    (``--mean 0.5,0.5,0.5`` -> ``mean=0.5/0.5/0.5``), checked by :func:`parse_salient_spec`."""
    items = [preset.strip().lower() if preset else "",
             f"size={input_size.strip()}" if input_size else "",
             f"mean={mean.strip().replace(',', '/')}" if mean else "",
             f"std={std.strip().replace(',', '/')}" if std else "",
             f"output={postprocess.strip()}" if postprocess else ""]
    items = [i for i in items if i]
    if not items:
        return model
    _, options = _split(model.partition(":")[2])
    text = f"{model}{',' if options else '#'}{','.join(items)}"
    parse_salient_spec(text)
    return text


# ----------------------------------------------------------------------------- the formula
def preprocess(image: Image.Image, prep: Preprocessing) -> np.ndarray:
    """Step 1 of the module docstring: ``(3, h, w)`` float32 (rembg's ``normalize``)."""
    from PIL import Image

    h, w = prep.size
    x = np.asarray(image.convert("RGB").resize((w, h), Image.Resampling.LANCZOS), dtype=np.float64)
    x = x / max(float(x.max()), 1e-6)
    x = (x - np.asarray(prep.mean)) / np.asarray(prep.std)
    return np.ascontiguousarray(x.transpose(2, 0, 1), dtype=np.float32)


def _sigmoid(y: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * y))  # = 1 / (1 + exp(-y)), without overflow


def output_map(raw: np.ndarray, output: str) -> tuple[np.ndarray | None, str | None]:
    """Step 3: one photo's ``(h', w')`` output as a float64 map in [0, 1], or None and the reason."""
    y = np.asarray(raw, dtype=np.float64)
    if not np.isfinite(y).all():
        return None, NONFINITE_REASON
    if output in ("sigmoid", "sigmoid-minmax"):
        y = _sigmoid(y)
    if output == "none":
        return np.clip(y, 0.0, 1.0), None
    if output == "sigmoid":
        return y, None
    if output not in OUTPUTS:
        raise ValueError(f"output {output!r} is not one of {', '.join(OUTPUTS)}")
    lo, hi = float(y.min()), float(y.max())
    if not hi > lo:
        return None, CONSTANT_REASON
    return (y - lo) / (hi - lo), None


def proposal_from_map(prob: np.ndarray, image_size: tuple[int, int], threshold: float) -> Proposal:
    """Steps 4-5: ``prob`` (``(h', w')`` in [0, 1]) resized to ``image_size = (W, H)``, thresholded."""
    from PIL import Image

    width, height = int(image_size[0]), int(image_size[1])
    small = Image.fromarray(np.ascontiguousarray(prob, dtype=np.float32))
    resized = np.asarray(small.resize((width, height), Image.Resampling.LANCZOS), dtype=np.float64)
    return proposal_of(np.clip(resized, 0.0, 1.0), threshold)


# ----------------------------------------------------------------------------- ONNX Runtime
def _first_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[0] if lines else type(error).__name__


def _providers(device: str) -> tuple[list[Any], bool]:
    """ONNX Runtime providers for a device name, and whether CUDA was asked for by name."""
    try:
        import onnxruntime as ort
    except ImportError:
        raise ModelError(f"salient: models run in ONNX Runtime, which is not installed: {INSTALL_HINT}") from None
    device = str(device)
    has_cuda = "CUDAExecutionProvider" in ort.get_available_providers()
    if device == "cpu" or (device == "auto" and not has_cuda):
        return ["CPUExecutionProvider"], False
    if device == "auto":
        return ["CUDAExecutionProvider", "CPUExecutionProvider"], False
    name, _, index = device.partition(":")
    if name != "cuda" or (index and not index.isdigit()):
        raise ValueError(f"--device must be auto, cpu or cuda[:N], got {device!r}")
    if not has_cuda:
        raise ModelError("--device cuda: this ONNX Runtime has no CUDA provider (the onnxruntime package is CPU-only); "
                         "pip install 'curate[salient-gpu]' in place of 'curate[salient]', or use --device cpu")
    return [("CUDAExecutionProvider", {"device_id": int(index or 0)}), "CPUExecutionProvider"], True


def open_session(path: str | Path, device: str = "auto") -> Any:
    """An ``onnxruntime.InferenceSession`` of ``path`` on ``device`` (module docstring, Device).

    Raises:
        WeightsNotFoundError: no such file.
        ModelError: ONNX Runtime is missing or cannot read the file, or CUDA was asked for and is
            not there (or the session fell back to the CPU).
    """
    path = Path(path).expanduser()
    if not path.is_file():
        raise WeightsNotFoundError(f"salient model file {path} does not exist; give the .onnx file's path (curate "
                                   "never downloads weights; docs/masks.md says where to get them)",
                                   missing=[path.name], searched=[str(path.parent)])
    providers, want_cuda = _providers(device)
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3  # errors only: no provider chatter in the progress bar
    if os.environ.get("OMP_WAIT_POLICY", "").upper() == "PASSIVE":  # as torch's threads (the Makefile sets it)
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    try:
        session = ort.InferenceSession(str(path), sess_options=options, providers=providers)
    except Exception as error:  # noqa: BLE001 - ONNX Runtime's errors are not one class
        raise ModelError(f"{path} does not load in ONNX Runtime: {_first_line(error)}") from None
    if want_cuda and "CUDAExecutionProvider" not in session.get_providers():
        raise ModelError(f"--device {device}: ONNX Runtime fell back to the CPU for {path.name} (its CUDA provider "
                         "did not start: CUDA or cuDNN libraries missing?); use --device cpu or fix the CUDA install")
    return session


@dataclass(frozen=True)
class InputPlan:
    """What :func:`check_model` found: the input's and first output's names, the input's numpy
    dtype, and its fixed batch size (None when the batch dimension is free)."""

    input_name: str
    output_name: str
    dtype: Any
    batch: int | None


def _dims(shape: Any) -> list[Any]:
    return list(shape) if isinstance(shape, (list, tuple)) else []


def _shape_text(shape: Sequence[Any]) -> str:
    return "x".join(str(d) if isinstance(d, int) and d > 0 else "?" for d in shape)


def check_model(session: Any, sal: SalientSpec) -> InputPlan:
    """Check a session's input and first output against the spec's preprocessing (module
    docstring, The model file); each failure is a one-line :class:`ModelError`."""
    inputs, outputs = session.get_inputs(), session.get_outputs()
    name = sal.path.name
    if sal.preset is not None and sal.prep.size == PRESETS[sal.preset].size:
        feeds = f"preset {sal.preset}" + (" (picked by the file's name)" if sal.from_file_name else "")
    else:
        feeds = "--input-size"
    h, w = sal.prep.size
    if len(inputs) != 1:
        raise ModelError(f"{name} takes {len(inputs)} inputs ({', '.join(i.name for i in inputs)}); a salient: model "
                         "takes one image tensor (N, 3, H, W)")
    spec = inputs[0]
    shape = _dims(spec.shape)
    if len(shape) != 4:
        raise ModelError(f"{name}'s input {spec.name!r} has shape {_shape_text(shape) or 'unknown'}; a salient: model "
                         "takes an image tensor (N, 3, H, W)")
    if spec.type not in ("tensor(float)", "tensor(float16)"):
        raise ModelError(f"{name}'s input {spec.name!r} is {spec.type}; a salient: model takes float or float16 pixels")
    if isinstance(shape[1], int) and shape[1] > 0 and shape[1] != 3:
        raise ModelError(f"{name}'s input {spec.name!r} has {shape[1]} channels (shape {_shape_text(shape)}); a "
                         "salient: model takes RGB, (N, 3, H, W)")
    fixed = [(d, want) for d, want in zip(shape[2:], (h, w)) if isinstance(d, int) and d > 0]
    if any(d != want for d, want in fixed):
        matching = [p for p, prep in PRESETS.items() if tuple(shape[2:]) == prep.size]
        advice = f"--preset {' or --preset '.join(matching)}" if matching else f"--input-size {_shape_text(shape[2:])}"
        raise ModelError(f"{name} takes {_shape_text(shape)} input but {feeds} feeds {h}x{w}: the file is another "
                         f"model family than the preset, use {advice} (docs/masks.md lists which file takes which)")
    if not outputs or len(_dims(outputs[0].shape)) not in (3, 4):
        out_shape = _shape_text(_dims(outputs[0].shape)) if outputs else "none"
        raise ModelError(f"{name}'s first output has shape {out_shape}; a salient: model's first output is its "
                         "foreground map, (N, 1, H, W) or (N, H, W)")
    batch = shape[0] if isinstance(shape[0], int) and shape[0] > 0 else None
    dtype = np.float16 if spec.type == "tensor(float16)" else np.float32
    return InputPlan(spec.name, outputs[0].name, dtype, batch)


# ----------------------------------------------------------------------------- the proposer
class SalientProposer:
    """A loaded salient-object model (the module docstring defines mask and score).

    Args:
        session: an ``onnxruntime.InferenceSession`` (:func:`open_session`).
        spec: its :class:`SalientSpec`.
        model_id, info: from :func:`identity`.
        batch_size: photos per run of the session (halved on out of memory).
    """

    backend = "salient"

    def __init__(self, session: Any, spec: SalientSpec, *, model_id: str, info: dict[str, Any],
                 batch_size: int = 8) -> None:
        if int(batch_size) < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.session, self.spec = session, spec
        self.plan = check_model(session, spec)
        self.model_id, self.info = model_id, info
        self.batch_size = int(batch_size)
        self.providers = list(session.get_providers())

    def raw_outputs(self, images: Sequence[Image.Image]) -> list[np.ndarray]:
        """Steps 1-2 for a list of photos: each photo's output channel 0, in order (in groups of
        the model's fixed batch size when it has one)."""
        x = np.stack([preprocess(im, self.spec.prep) for im in images]).astype(self.plan.dtype)
        group = self.plan.batch or len(x)
        out: list[np.ndarray] = []
        for start in range(0, len(x), group):
            feed = x[start:start + group]
            real = len(feed)
            if real < group:
                feed = np.concatenate([feed, np.repeat(feed[-1:], group - real, axis=0)])
            y = self._run(feed)
            out.extend(y[:real, 0] if y.ndim == 4 else y[:real])
        return out

    def _run(self, feed: np.ndarray) -> np.ndarray:
        try:
            y = self.session.run([self.plan.output_name], {self.plan.input_name: feed})[0]
        except Exception as error:  # noqa: BLE001 - ONNX Runtime's errors are not one class
            text = _first_line(error)
            if "out of memory" in text.lower() or "allocate memory" in text.lower():
                raise MemoryError(text) from None  # halving() halves the batch on it
            raise ModelError(f"{self.spec.path.name} failed on a batch of {len(feed)} {feed.shape[2]}x{feed.shape[3]} "
                             f"images: {text}") from None
        y = np.asarray(y)
        if y.ndim not in (3, 4) or y.shape[0] != len(feed):
            raise ModelError(f"{self.spec.path.name} returned shape {tuple(y.shape)} for a batch of {len(feed)}; "
                             "a salient: model's first output is (N, 1, H, W) or (N, H, W)")
        return y

    def propose(self, images: Sequence[Image.Image], prompts: Sequence[str], threshold: float) -> list[Proposal]:
        """One :class:`Proposal` per image, in order; ``prompts`` are not used (one per image is required)."""
        from curate.engine.base import halving

        threshold = checked_request(images, prompts, threshold)
        results: list[Proposal | None] = [None] * len(images)

        def run(chunk: Sequence[int]) -> None:
            raws = self.raw_outputs([images[i] for i in chunk])
            for i, raw in zip(chunk, raws):
                prob, reason = output_map(raw, self.spec.prep.output)
                results[i] = Proposal(None, None, reason) if prob is None else \
                    proposal_from_map(prob, images[i].size, threshold)

        self.batch_size = halving(list(range(len(images))), self.batch_size, run, what="salient batch")
        return [r for r in results if r is not None]

    def __repr__(self) -> str:
        return f"SalientProposer(model_id={self.model_id!r}, providers={self.providers!r})"


# ----------------------------------------------------------------------------- the backend entries
def salient_model_id(sal: SalientSpec, sha256: str) -> str:
    """``salient-<preset or custom-<hex>>:<file stem>@<sha256[:12]>``."""
    return f"salient-{sal.family}:{sal.path.name.removesuffix('.onnx')}@{sha256[:12]}"


def _identity(sal: SalientSpec, precision: str) -> tuple[str, dict[str, Any]]:
    from curate.models.weights import file_sha256

    check_precision(precision)
    if precision != "fp32":
        raise ValueError(f"--precision {precision}: a salient: model runs in the types of its ONNX file; use fp32 "
                         "(the default)")
    if not sal.path.is_file():
        raise WeightsNotFoundError(f"salient model file {sal.path} does not exist; give the .onnx file's path (curate "
                                   "never downloads weights; docs/masks.md says where to get them)",
                                   missing=[sal.path.name], searched=[str(sal.path.parent)])
    sha = file_sha256(sal.path)
    model_id = salient_model_id(sal, sha)
    info: dict[str, Any] = {
        "backend": "salient", "spec": sal.text, "model_id": model_id, "file": str(sal.path.resolve()), "sha256": sha,
        "preset": sal.preset, "family": sal.family, "preprocessing": sal.prep.text(), **sal.prep.as_dict(),
        "resize": "PIL LANCZOS, squashed to the input size; pixels divided by the photo's max (rembg's normalize)",
        "score": "mean of the map inside the mask (no mask: the map's max)", "precision": precision}
    return model_id, info


def identity(spec: str | MaskModelSpec, *, precision: str = "fp32") -> tuple[str, dict[str, Any]]:
    """``(model_id, info)`` of a ``salient:`` spec: the file is hashed, ONNX Runtime not loaded."""
    return _identity(parse_salient_spec(spec), precision)


def load(spec: str | MaskModelSpec, *, device: str = "auto", precision: str = "fp32",
         batch_size: int = 8) -> SalientProposer:
    """Open a ``salient:`` spec's file in ONNX Runtime, checked against its preprocessing."""
    sal = parse_salient_spec(spec)
    model_id, info = _identity(sal, precision)
    session = open_session(sal.path, device)
    proposer = SalientProposer(session, sal, model_id=model_id, info=info, batch_size=batch_size)
    logger.info("salient model %s on %s", model_id, ", ".join(map(str, proposer.providers)))
    return proposer

