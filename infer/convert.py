"""Convert a TorchScript (.pt) or ONNX (.onnx) file to pnnx files with pnnx's own converter.

    python -m infer convert model.onnx -o out/
    python -m infer convert traced.pt --inputshape 1,3,224,224 -o out/

``convert(model_path, out_dir)`` runs the ``pnnx`` program shipped in the pnnx wheel (the one
``infer.export`` runs on its traces) and keeps ``NAME.pnnx.param`` / ``NAME.pnnx.bin``. pnnx
takes the input shapes a traced TorchScript file stores (``torch.jit.trace`` keeps its example
inputs; ``inputshape`` must then repeat them) and those of an ONNX file; ``inputshape`` is
needed where an ONNX input has free dims. pnnx converts traced modules; a scripted one
(``torch.jit.script``) can crash it.
``inputshape2`` gives a second set of shapes: dims that differ stay free (``?``) in the result.

pnnx writes scratch files beside the model path it is given, so it runs on a link to the model
in a temporary folder that also receives all its outputs: the user's folders get the two pnnx
files and nothing else. An ONNX model whose weights live in external files (torch's exporter
writes ``model.onnx.data``) is first saved with its weights inlined (with the ``onnx``
package): pnnx reads external weights wrongly.
"""

from __future__ import annotations

import importlib.util
import logging
import mmap
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Sequence

from parser.errors import ExportError

log = logging.getLogger(__name__)

SUFFIXES = {".pt": "TorchScript", ".pth": "TorchScript", ".torchscript": "TorchScript",
            ".onnx": "ONNX"}
DTYPES = ("f32", "f64", "f16", "bf16", "i64", "i32", "i16", "i8", "u8", "bool")
_SHAPE = re.compile(r"^(?:(\d+(?:,\d+)*)|\[(\d+(?:,\d+)*)\])(" + "|".join(DTYPES) + r")?$")


def parse_input_shape(text: str) -> str:
    """One input's shape as the user writes it, ``1,3,224,224`` or ``1,10i64`` or pnnx's own
    ``[1,10]i64``, -> pnnx's form ``[1,10]i64`` (float32 when no dtype is given)."""
    match = _SHAPE.match(text.replace(" ", ""))
    dims = match and (match.group(1) or match.group(2))
    if not dims or any(int(d) < 1 for d in dims.split(",")):
        raise ValueError(f"expected dims >= 1 separated by commas, optionally followed by a "
                         f"dtype ({', '.join(DTYPES)}), e.g. 1,3,224,224 or 1,16i64; got "
                         f"{text!r}")
    return f"[{dims}]{match.group(3) or 'f32'}"


def pnnx_program() -> str:
    """Path of the pnnx executable in the installed pnnx wheel, found without importing the
    ``pnnx`` package (which imports torch: an ONNX file converts without torch's 2 s start)."""
    spec = importlib.util.find_spec("pnnx")
    if spec is None or not spec.submodule_search_locations:
        raise ExportError("converting needs the pnnx package: pip install pnnx")
    folder = Path(list(spec.submodule_search_locations)[0])
    program = folder / ("pnnx.exe" if sys.platform == "win32" else "pnnx")
    if not program.is_file():
        raise ExportError(f"the pnnx package has no pnnx program at {program}")
    return str(program)


def convert(model_path: str | Path, out_dir: str | Path | None = None,
            inputshape: Sequence[str] = (), inputshape2: Sequence[str] = (),
            name: str | None = None) -> tuple[Path, Path]:
    """Convert ``model_path`` (TorchScript .pt / .pth / .torchscript, or .onnx) with pnnx;
    write ``out_dir/name.pnnx.param`` and ``.pnnx.bin`` (default: beside the model, named
    after it) and return their paths. ``inputshape`` / ``inputshape2``: one shape per input
    (see ``parse_input_shape``). A missing or unknown file, or a failed conversion, is an
    ExportError."""
    model = Path(model_path)
    if not model.is_file():
        raise ExportError(f"no model file {model}")
    kind = SUFFIXES.get(model.suffix.lower())
    if kind is None:
        raise ExportError(f"{model}: expected a TorchScript file (.pt, .pth, .torchscript) "
                          f"or an ONNX file (.onnx), got {model.suffix or 'no suffix'}")
    try:
        shapes = [parse_input_shape(s) for s in inputshape]
        shapes2 = [parse_input_shape(s) for s in inputshape2]
    except ValueError as exc:
        raise ExportError(f"input shape: {exc}") from None
    if shapes2 and len(shapes2) != len(shapes):
        raise ExportError(f"inputshape2 gives {len(shapes2)} shapes for {len(shapes)} inputs")
    out_dir = Path(out_dir) if out_dir is not None else model.parent
    name = name or model.stem
    program = pnnx_program()

    with tempfile.TemporaryDirectory(prefix="pnnx_convert_") as scratch:
        work = Path(scratch)
        source = _model_for_pnnx(model, kind, work)     # pnnx writes scratch files beside it
        param, binary = work / f"{name}.pnnx.param", work / f"{name}.pnnx.bin"
        command = [program, str(source), f"pnnxparam={param}", f"pnnxbin={binary}",
                   f"pnnxpy={work / 'out_pnnx.py'}", f"pnnxonnx={work / 'out.pnnx.onnx'}",
                   f"ncnnparam={work / 'out.ncnn.param'}", f"ncnnbin={work / 'out.ncnn.bin'}",
                   f"ncnnpy={work / 'out_ncnn.py'}"]
        if shapes:
            command.append("inputshape=" + ",".join(shapes))
        if shapes2:
            command.append("inputshape2=" + ",".join(shapes2))
        log.info("running %s", " ".join(command))
        result = subprocess.run(command, cwd=work, capture_output=True, text=True)
        log.debug("pnnx output:\n%s%s", result.stdout, result.stderr)
        if not param.exists() or not binary.exists():
            output = result.stdout + result.stderr
            if "Load torchscript failed" in output:
                raise ExportError(
                    f"{model} is not a TorchScript file (a state_dict, or a module saved with "
                    f"torch.save?): save one with torch.jit.trace(model, example_inputs)"
                    f".save(path), or export the module with `python -m infer export`")
            hint = ""
            if kind == "TorchScript" and result.returncode < 0:
                hint = ("\npnnx converts traced modules; a scripted one (torch.jit.script) can "
                        "crash it: save torch.jit.trace(model, example_inputs) instead")
            raise ExportError(f"pnnx could not convert the {kind} file {model} (exit code "
                              f"{_exit_code(result.returncode)}); its last output:\n"
                              f"{_last_words(output)}{hint}")
        if kind == "ONNX" and not shapes2:
            _warn_of_fixed_dims(model)
        if result.returncode != 0:       # e.g. its ncnn conversion, which runs last, failed
            log.warning("pnnx exited with code %s after writing %s", result.returncode,
                        param.name)
        out_dir.mkdir(parents=True, exist_ok=True)
        for path in (param, binary):
            shutil.move(str(path), out_dir / path.name)
    return out_dir / param.name, out_dir / binary.name


def free_onnx_dims(model: Path) -> dict[str, list[int]]:
    """The dims an ONNX file leaves free (``batch``, ``height``...), per graph input: {} if
    there are none, or if the onnx package (the test extra) cannot read the file."""
    try:
        import onnx
    except ImportError:
        return {}
    try:
        graph = onnx.load(str(model), load_external_data=False).graph
    except Exception:                    # not readable here: pnnx says why, if it cannot
        return {}
    weights = {initializer.name for initializer in graph.initializer}
    free = {}
    for value in graph.input:
        dims = value.type.tensor_type.shape.dim
        loose = [i for i, d in enumerate(dims) if not d.HasField("dim_value") or d.dim_value < 1]
        if loose and value.name not in weights:
            free[value.name] = loose
    return free


def _warn_of_fixed_dims(model: Path) -> None:
    """pnnx gives an ONNX file's free dims the sizes of inputshape (1 without one): say so."""
    for name, dims in free_onnx_dims(model).items():
        log.warning("%s: input %r leaves dim(s) %s free (a dynamic batch or size); pnnx "
                    "fixed them at the sizes of --inputshape (1 without it). To keep them "
                    "free, convert with --inputshape and --inputshape2 giving two sizes.",
                    model.name, name, ", ".join(map(str, dims)))


def _model_for_pnnx(model: Path, kind: str, work: Path) -> Path:
    """The file to give pnnx, in the scratch folder ``work``: a link to the model or, for an
    ONNX model that keeps its weights in external files, a copy with the weights inlined
    (pnnx 20261020 reads external weights wrongly: Gemm weights come out as garbage)."""
    source = work / model.name
    if kind == "ONNX" and _has_external_data(model):
        try:
            import onnx
        except ImportError:
            raise ExportError(f"{model} keeps its weights in external files, which pnnx "
                              f"misreads; install onnx (pip install onnx) so that convert can "
                              f"inline them first") from None
        try:
            onnx.save_model(onnx.load(str(model)), str(source))  # loads the external weights
        except Exception as exc:                  # onnx raises OSError, ValueError, its own
            raise ExportError(f"cannot inline the external weights of {model}: {exc}") from None
        log.info("inlined the external weights of %s", model)
    else:
        source.symlink_to(model.resolve())
    return source


def _has_external_data(model: Path) -> bool:
    """Whether an ONNX file names external weight files: its protobuf then holds the key
    ``location`` of a TensorProto.external_data entry (field 1, 8 bytes: 0x0a 0x08)."""
    if model.stat().st_size == 0:
        return False
    with open(model, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
        return data.find(b"\n\x08location") >= 0


def unsupported_types(param_path: str | Path) -> list[str]:
    """The operator types of a .pnnx.param file that no registered layer serves (after the
    graph's own rewrites, which remove tuple plumbing such as prim::TupleConstruct)."""
    from infer.graph import RuntimeGraph
    from layers import LayerRegisterer

    graph = RuntimeGraph(param_path)
    graph.init()
    registry = LayerRegisterer()
    return sorted({op.type for op in graph.operators if op.type not in registry})


def _exit_code(code: int) -> str:
    return f"{code} (killed by signal {-code})" if code < 0 else str(code)


def _last_words(output: str, lines: int = 8) -> str:
    """pnnx's last lines, without terminal colour codes, C++ stack frames and the echo of its
    options (``inputshape = ...``)."""
    clean = re.sub(r"\x1b\[[0-9;]*m", "", output)
    kept = [line for line in clean.strip().splitlines()
            if not re.match(r"^(frame #\d+:|\w+ = )", line)]
    return "\n".join(kept[-lines:])
