"""`tuner init`: write a first study file for a model, one that runs as written."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Annotated

import typer

from tuner.cli.common import err_console
from tuner.errors import SpecError, TunerError


def init(
    model: Annotated[Path, typer.Argument(help="The ONNX model.", show_default=False)],
    backend: Annotated[str, typer.Option("--backend", help="The backend to tune for.")] = "onnxruntime",
    data: Annotated[
        Path | None, typer.Option("--data", help="An .npz of validation inputs (arrays by input name).")
    ] = None,
    out: Annotated[
        Path | None, typer.Option("-o", "--out", help="The study file to write (default: MODEL.toml).")
    ] = None,
) -> None:
    """Write a commented study file for MODEL: its inputs, data, a suggested metric and tolerance, a budget."""
    from tuner.spec import spec_from_doc
    from tuner.spec.template import study_text

    target = out or Path(f"{model.stem}.toml")
    if target.exists():
        raise TunerError(f"{target} exists; not overwriting it (choose another name with -o)")
    inputs, outputs, note = _read_model(model)
    shapes = _data_shapes(data, [t.name for t in inputs if t.dims]) if data is not None else None
    text = study_text(model, target, inputs, outputs, backend, data, shapes, note)
    try:
        spec_from_doc(tomllib.loads(text), target)  # what is written loads: refused here, not at `tuner run`
    except SpecError as exc:
        raise TunerError(f"{model}: no study file written: {exc.field}: {exc.expected}") from None
    with open(target, "x", encoding="utf-8") as f:  # exclusive: never over a file that appeared meanwhile
        f.write(text)
    err_console.print(
        f'wrote {target}: check the lines marked "review this", then `tuner run {target}`',
        highlight=False,
        markup=False,
        soft_wrap=True,
    )


def _read_model(model: Path) -> tuple[list, list, str]:
    """The model's inputs and outputs, and what its precision already is (a line, or "")."""
    import onnx

    from tuner.precision.given import given_precision
    from tuner.spec.onnx_check import DTYPES, read_inputs
    from tuner.spec.template import Tensor, tensors

    class _Reader:
        def fail(self, field: str, expected: str) -> TunerError:
            return TunerError(expected if field == "model.path" else f"{model}: {field}: {expected}")

    declared = read_inputs(_Reader(), model)  # checks the file is a readable, valid model
    inputs = [Tensor(name, dtype, list(dims or [])) for name, (dtype, dims) in declared.items()]
    graph = onnx.load(str(model), load_external_data=False).graph
    return inputs, tensors(graph.output, DTYPES), given_precision(model).note


def _data_shapes(data: Path, names: list[str]) -> dict[str, tuple[int, ...]]:
    """The shapes of the data file's arrays, read from their headers (samples along axis 0); refused unless one is
    named like an input."""
    import zipfile

    import numpy as np

    if not data.is_file():
        raise TunerError(f"--data: file not found: {data}")
    shapes = {}
    try:
        with zipfile.ZipFile(data) as npz:
            for entry in npz.namelist():
                with npz.open(entry) as f:
                    major, _ = np.lib.format.read_magic(f)
                    header = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
                    shapes[entry.removesuffix(".npy")] = tuple(int(d) for d in header(f)[0])
    except (ValueError, OSError, zipfile.BadZipFile) as exc:
        raise TunerError(f"--data: {data} is not a readable .npz file of arrays ({type(exc).__name__})") from exc
    if names and not any(shapes.get(n) for n in names):
        raise TunerError(f"--data: {data} holds no array named like the model's inputs ({', '.join(names)})")
    return shapes
