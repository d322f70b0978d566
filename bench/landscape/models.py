"""Fetch the two models recorded from PyPI wheels, and make their validation data (nothing large is committed).

    python -m bench.landscape.models            # writes models/fetched/ (git-ignored)

- **PP-OCRv4 text recogniser** (`ch_PP-OCRv4_rec_infer.onnx`, opset 12) from the `rapidocr-onnxruntime`
  wheel. Data: 16 real text-line crops from scikit-image's bundled scanned page (`skimage.data.page`) and
  text photograph (`skimage.data.text`), each line cut in four, each piece resized to RapidOCR's recogniser input (3 x
  48 x 320, height 48 keeping the aspect ratio, padded right), normalised as RapidOCR does ((x / 255 - 0.5) / 0.5).
- **Silero VAD** (`silero_vad.onnx`, stateful: `input` [1, 512] audio, `state` [2, 1, 128], scalar `sr`)
  from the `silero-vad` wheel. Data: 16 chunks of 512 samples at 16 kHz of a deterministic signal (a
  voiced, vowel-like harmonic series with a pitch glide and an amplitude envelope, in noise, half of the
  chunks noise only); the state starts at zero and `sr` is 16000 (`[data.inputs]` constants).

Wheels are fetched with pip (`bench.wheels.download`, the exact versions below) into `models/fetched/wheels`.
"""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

import numpy as np

from bench.wheels import download

REPO = Path(__file__).resolve().parents[2]
FETCHED = REPO / "models" / "fetched"
WHEELS = {
    "ppocrv4_rec.onnx": ("rapidocr-onnxruntime==1.4.4", "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx"),
    "silero_vad.onnx": ("silero-vad==6.2.3", "silero_vad/data/silero_vad.onnx"),
}
REC_SHAPE = (3, 48, 320)
VAD_CHUNK, VAD_RATE = 512, 16000


def fetch(name: str) -> Path:
    """The model file `name` (a key of WHEELS), downloaded and extracted once."""
    out = FETCHED / name
    if out.exists():
        return out
    requirement, member = WHEELS[name]
    wheel = download(requirement, FETCHED / "wheels")
    with zipfile.ZipFile(wheel) as z:
        out.write_bytes(z.read(member))
    return out


def text_lines(count: int = 16) -> np.ndarray:
    """`count` text-line crops of scikit-image's page and text images as RapidOCR's recogniser input (N, 3, 48, 320)."""
    from skimage import data, transform

    crops: list[np.ndarray] = []
    for image in (data.page(), data.text()):
        gray = np.asarray(image, dtype=np.float64)
        ink = (gray < np.percentile(gray, 30)).sum(axis=1)
        rows = ink > 0.15 * ink.max()
        starts = [i for i in range(1, len(rows)) if rows[i] and not rows[i - 1]]
        for y in starts:
            end = next((j for j in range(y, len(rows)) if not rows[j]), len(rows))
            top, bottom = max(0, y - 3), min(len(rows), end + 3)
            if bottom - top >= 8:
                width = gray.shape[1] // 4  # a line in four pieces of about six times its height: RapidOCR's aspect
                crops += [gray[top:bottom, k * width : (k + 1) * width] for k in range(4)]
    out = np.zeros((count, *REC_SHAPE), dtype=np.float32)
    for i, crop in enumerate(crops[:count]):
        h = REC_SHAPE[1]
        w = min(REC_SHAPE[2], int(np.ceil(h * crop.shape[1] / crop.shape[0])))
        resized = transform.resize(crop, (h, w), anti_aliasing=True, preserve_range=True)
        out[i, :, :, :w] = ((resized / 255.0 - 0.5) / 0.5).astype(np.float32)[None]
    if len(crops) < count:
        raise RuntimeError(f"found {len(crops)} text lines, need {count}")
    return out


def vad_chunks(count: int = 16, seed: int = 0) -> np.ndarray:
    """`count` chunks of VAD_CHUNK samples: voiced-like harmonics in noise (even chunks), noise only (odd)."""
    rng = np.random.default_rng(seed)
    t = np.arange(VAD_CHUNK) / VAD_RATE
    out = np.zeros((count, VAD_CHUNK), dtype=np.float32)
    for i in range(count):
        noise = 0.01 * rng.standard_normal(VAD_CHUNK)
        if i % 2 == 0:
            f0 = 110.0 + 15.0 * i + 40.0 * t / t[-1]
            voiced = sum((0.3 / k) * np.sin(2 * np.pi * k * np.cumsum(f0) / VAD_RATE) for k in range(1, 12))
            out[i] = (voiced * np.hanning(VAD_CHUNK) + noise).astype(np.float32)
        else:
            out[i] = noise.astype(np.float32)
    return out


def main() -> int:
    """Fetch both models and write their data files."""
    FETCHED.mkdir(parents=True, exist_ok=True)
    for name in WHEELS:
        print(fetch(name))
    np.savez(FETCHED / "ppocrv4_rec_val.npz", x=text_lines())
    np.savez(FETCHED / "silero_vad_val.npz", input=vad_chunks())
    print(FETCHED / "ppocrv4_rec_val.npz", FETCHED / "silero_vad_val.npz")
    return 0


if __name__ == "__main__":
    sys.exit(main())
