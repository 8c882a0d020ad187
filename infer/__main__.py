"""Command line: ``python -m infer classify|detect|ops|export|convert ...`` (``--help`` on each)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from parser.errors import InferError


def _classify(args: argparse.Namespace) -> int:
    """One block of lines per image, or one CSV row each with --output; an image or folder
    that cannot be read or used is one line on stderr, the others go on, and the exit code is
    1 if any failed. A folder job (a folder among the names, or --output) ends with a line on
    stderr saying how many images were classified, how fast."""
    import csv
    import time
    from contextlib import nullcontext

    from tqdm import tqdm

    from infer.classify import ImageClassifier, ImageError, csv_header, csv_row, image_paths

    for stream in (sys.stdout, sys.stderr):        # file names that are not UTF-8: escaped
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
    args.ray = args.ray or args.address is not None
    if args.workers and not args.ray:
        raise InferError("--workers: the number of Ray workers, for --ray")
    classifier = ImageClassifier.load(args.model)
    if classifier.card is None:
        pre = classifier.preprocess
        print(f"note: {classifier.graph.param_path} has no model.json beside it: using ImageNet "
              f"labels and torchvision's preprocessing (shorter side {pre.resize}, centre crop "
              f"{pre.crop}, mean {_numbers(pre.mean)}, std {_numbers(pre.std)}); a model.json "
              f"says otherwise (see infer/classify.py)", file=sys.stderr)
    if args.threads:
        classifier.graph.set_num_threads(args.threads)
    try:
        output = (open(args.output, "w", newline="", encoding="utf-8", errors="surrogateescape")
                  if args.output else nullcontext(None))
    except OSError as exc:
        raise InferError(f"cannot write {args.output}: {exc.strerror or exc}") from None
    failed = 0

    def report(err: ImageError, write=print) -> None:
        nonlocal failed
        failed += 1
        write(f"error: {err}", file=sys.stderr)

    paths = image_paths(args.images, args.recursive, report)
    folder_job = args.output is not None or any(os.path.isdir(name) for name in args.images)
    if args.ray:
        from infer.cluster import classify_on_ray

        results = classify_on_ray(paths, args.model, top=args.top, batch=args.batch,
                                  workers=args.workers, threads=args.threads or 1,
                                  address=args.address)
    else:
        results = classifier.classify_many(paths, top=args.top, batch=args.batch,
                                           threads=args.threads or min(8, os.cpu_count() or 1))
    classified, started = 0, time.perf_counter()
    with output as file, tqdm(total=len(paths), desc="classifying", unit="image",
                              file=sys.stderr, disable=len(paths) < 2 or args.ray
                              or not sys.stderr.isatty()) as progress:
        table = csv.writer(file) if file else None
        if table:
            table.writerow(csv_header(args.top))
        for result in results:
            progress.update()
            if result.error is not None:                 # this image only: go on
                report(result.error, progress.write)
                continue
            classified += 1
            if table:
                table.writerow(csv_row(result, args.top))
                continue
            if len(paths) > 1 or folder_job:
                progress.write(f"{result.path}:")
            width = max(len(label) for label, _ in result.top)
            for label, probability in result.top:
                progress.write(f"{label:<{width}}  {probability:.4f}")
    seconds = time.perf_counter() - started
    if folder_job:
        print(f"{classified} images classified, {failed} skipped, in {seconds:.1f} s: "
              f"{classified / max(seconds, 1e-9):.1f} images/s (batch {args.batch}"
              f"{', on Ray' if args.ray else ''})"
              + (f"; results in {args.output}" if args.output else ""), file=sys.stderr)
    return 1 if failed else 0


def _numbers(values) -> str:
    return ",".join(f"{v:g}" for v in values)


def _detect(args: argparse.Namespace) -> int:
    """Per image a line ``PATH: N faces``, then per face its score, box and landmarks; with
    --out the image with them drawn. An image that cannot be read, used or written is one line
    on stderr, the others go on, and the exit code is 1 if any failed."""
    from tqdm import tqdm

    from infer import images
    from infer.detect import LANDMARKS, FaceDetector, draw_faces, write_image
    from parser.errors import ImageError, MemoryBudgetError

    for stream in (sys.stdout, sys.stderr):        # file names that are not UTF-8: escaped
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
    targets = _detect_targets(args.images, args.out)
    detector = FaceDetector(min_face_size=args.min_face_size)
    if args.threads:
        detector.set_num_threads(args.threads)
    failed = 0
    with tqdm(args.images, desc="detecting", unit="image", file=sys.stderr,
              disable=len(args.images) < 2 or not sys.stderr.isatty()) as progress:
        for path, target in zip(progress, targets):
            try:
                image = images.read_image(path)
                faces = detector.detect(image)
                if target is not None:
                    write_image(target, draw_faces(image, faces))
            except (ImageError, MemoryBudgetError) as err:     # this image only: go on
                failed += 1
                named = isinstance(err, ImageError)              # its message starts with a path
                progress.write(f"error: {'' if named else f'{path}: '}{err}", file=sys.stderr)
                continue
            progress.write(f"{path}: {len(faces)} face{'' if len(faces) == 1 else 's'}"
                           + (f" (drawn in {target})" if target is not None else ""))
            for face in faces:
                progress.write(f"  score {face.score:.4f}  box {_coordinates(face.box)}")
                progress.write("    " + "  ".join(f"{name} {_coordinates(point)}" for name, point
                                                  in zip(LANDMARKS, face.landmarks)))
    return 1 if failed else 0


def _coordinates(values) -> str:
    return " ".join(f"{v:.1f}" for v in values)


def _detect_targets(names: list[str], out: str | None) -> list[Path | None]:
    """Where ``detect`` draws each image: nowhere without --out; with one image, --out itself
    (a file), unless --out is a folder; else FOLDER/<stem>_faces.png per image, the folder
    made if missing. Checked before anything runs: an InferError if two images would share a
    file, OpenCV writes no such file type, or the file's folder is missing."""
    import cv2

    if out is None:
        return [None] * len(names)
    folder = Path(out)
    if len(names) == 1 and not folder.is_dir() and not out.endswith(("/", os.sep)):
        if not cv2.haveImageWriter(out):
            raise InferError(f"--out {out}: OpenCV writes no such image type (give a .png or "
                             f".jpg file, or a folder)")
        if not folder.resolve().parent.is_dir():
            raise InferError(f"--out {out}: no folder {folder.parent} to write it in")
        return [folder]
    targets = [folder / f"{Path(name).stem}_faces.png" for name in names]
    shared = {str(t) for t in targets if targets.count(t) > 1}
    if shared:
        raise InferError(f"--out {out}: images of the same name would be drawn into the same "
                         f"file ({', '.join(sorted(shared))}); run them separately")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InferError(f"--out {out}: cannot make the folder: {exc.strerror or exc}") from None
    return list(targets)


def _add_detect_command(detect: argparse.ArgumentParser) -> None:
    detect.description = (
        "Find faces with MTCNN (three networks in model_file/mtcnn/, weights of facenet-pytorch). "
        "Per image it prints 'PATH: N faces', then per face, best first, its score (the face "
        "probability), its box x1 y1 x2 y2 and five landmarks x y (left eye, right eye, nose, "
        "mouth left, mouth right, as seen in the image), in pixels.")
    detect.add_argument("images", nargs="+", metavar="IMAGE", help="image files (png, jpg, ...)")
    detect.add_argument("--out", metavar="PATH", default=None,
                        help="draw the boxes and landmarks: with one image, into this file "
                             "(annotated.png; its extension gives the type); with several "
                             "images (or if it is a folder, or ends with /), into this folder, "
                             "as <stem>_faces.png each")
    detect.add_argument("--min-face-size", metavar="PIXELS", type=_positive_int, default=20,
                        help="smallest face to look for, in pixels")
    detect.add_argument("--threads", type=_positive_int, default=None,
                        help="cap on CPU threads (default: every core)")
    detect.set_defaults(run=_detect)


def _ops(args: argparse.Namespace) -> int:
    from layers import LayerRegisterer, fast  # noqa: F401  (fast: registers the fast layers)

    if args.update:
        update_readme(args.update)
        return 0
    if args.markdown:
        print(operator_table(), end="")
        return 0
    registry = LayerRegisterer()
    for type_name in registry.types():
        layer_class = registry.layer_class(type_name)
        line = f"{type_name:<28} {layer_class.__module__}.{layer_class.__name__}"
        fast_class = registry.layer_class(type_name, fast=True)
        if fast_class is not layer_class:
            line += f"  (fast: {fast_class.__module__}.{fast_class.__name__})"
        print(line)
    return 0


TABLE_BEGIN = "<!-- operator table: generated by `python -m infer ops --markdown` -->"
TABLE_END = "<!-- end of operator table -->"


def operator_table() -> str:
    """The README's operator table, from the registry: one row per layer module (family),
    its first docstring line, and the pnnx types its layers serve, "(fast)" marking those
    the fast backend also serves (layers/fast/layers.py)."""
    import sys

    from layers import LayerRegisterer, fast  # noqa: F401  (fast: registers the fast layers)

    registry = LayerRegisterer()
    fast_types = set(registry.fast_types())
    families: dict[str, list[str]] = {}
    for type_name in registry.types():
        module = registry.layer_class(type_name).__module__
        if module.startswith("layers."):          # built-in layers, not a session's custom ones
            families.setdefault(module, []).append(type_name)
    rows = ["| Module | What | pnnx operator types |", "|---|---|---|"]
    for module, types in sorted(families.items()):
        what = _summary(sys.modules[module].__doc__ or "")
        path = module.replace(".", "/") + ".py"
        cells = [f"`{t}` (fast)" if t in fast_types else f"`{t}`" for t in types]
        rows.append(f"| `{path}` | {what} | {', '.join(cells)} |")
    total = sum(len(types) for types in families.values())
    return ("\n".join(rows) + f"\n\n{total} operator types; {len(fast_types)} of them also have "
            f"a fast layer (fast).\n")


def _summary(docstring: str) -> str:
    """A module docstring's first sentence, up to a colon, as one markdown table cell."""
    paragraph = " ".join(docstring.strip().split("\n\n")[0].split())
    sentence = paragraph.split(". ")[0].split(": ")[0].rstrip(".")
    return sentence.replace("``", "`").replace("|", "\\|")


def readme_with_table(text: str, path: str = "README.md") -> str:
    """``text`` (a README) with the part between the table markers replaced by the table."""
    begin, end = text.find(TABLE_BEGIN), text.find(TABLE_END)
    if begin < 0 or end < begin:
        raise InferError(f"{path} has no operator table section: it must hold the lines "
                         f"{TABLE_BEGIN!r} and {TABLE_END!r}")
    return text[:begin + len(TABLE_BEGIN)] + "\n" + operator_table() + text[end:]


def update_readme(path: str) -> None:
    from pathlib import Path

    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise InferError(f"cannot read {path}: {exc.strerror}") from None
    Path(path).write_text(readme_with_table(text, path), encoding="utf-8")


def _convert(args: argparse.Namespace) -> int:
    from infer.convert import convert

    param, binary = convert(args.model, args.out, args.inputshape or (),
                            args.inputshape2 or (), args.name)
    print(param)
    print(binary)
    _note_unsupported(param)
    return 0


def _export(args: argparse.Namespace) -> int:
    from infer.export import export_command

    param, binary = export_command(args.model, args.out, args.shape, args.name, args.weights,
                                   args.dynamic, args.random_weights, args.keep_extras)
    print(param)
    print(binary)
    _note_unsupported(param)
    return 0


def _note_unsupported(param: Path | str) -> None:
    """After convert or export: name the operator types of the file no layer serves yet."""
    from infer.convert import unsupported_types

    missing = unsupported_types(param)
    if missing:
        print(f"note: this runtime has no layer yet for {', '.join(missing)}", file=sys.stderr)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text[:40]!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _shape(text: str) -> tuple[int, ...]:
    """'1,3,224,224' -> (1, 3, 224, 224)."""
    try:
        shape = tuple(int(d) for d in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers separated by commas, got "
                                         f"{text!r}") from None
    if any(d < 1 for d in shape):
        raise argparse.ArgumentTypeError(f"every dim must be at least 1, got {text!r}")
    return shape


def _input_shape(text: str) -> str:
    """'1,3,224,224' or '1,16i64' -> pnnx's '[1,3,224,224]f32' / '[1,16]i64'."""
    from infer.convert import parse_input_shape

    try:
        return parse_input_shape(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """``--help`` shows each option's default, where there is one to show (not None/False)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default in (None, False) or "%(default)" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


def version() -> str:
    """The package's version: its installed metadata, else pyproject.toml beside the code."""
    from importlib import metadata

    try:
        return metadata.version("pnnx-infer")
    except metadata.PackageNotFoundError:
        import re
        from pathlib import Path

        pyproject = Path(__file__).resolve().parent.parent / "pyproject.toml"
        try:
            found = re.search(r'^version\s*=\s*"([^"]+)"', pyproject.read_text("utf-8"), re.M)
        except OSError:
            found = None
        return found.group(1) if found else "unknown"


RESNET18_HELP = ("resnet18 needs --weights resnet18-f37072fd.pth, torchvision's ImageNet "
                 "checkpoint (https://download.pytorch.org/models/resnet18-f37072fd.pth, which "
                 "torchvision.models.resnet18(weights='IMAGENET1K_V1') puts in the torch hub "
                 "cache, where it is found by itself; this runtime downloads nothing), or "
                 "--random-weights")


def build_parser() -> argparse.ArgumentParser:
    from infer.classify import DEFAULT_MODEL, shipped_models

    parser = argparse.ArgumentParser(prog="python -m infer", formatter_class=_HelpFormatter,
                                     description="Run pnnx models on the CPU.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log what happens")
    parser.add_argument("--version", action="version", version=f"pnnx-infer {version()}")
    # -v after the subcommand too; SUPPRESS: not given there, it keeps the value given before
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                        help="log what happens")
    commands = parser.add_subparsers(dest="command", required=True)

    def command(name: str, **kwargs: str) -> argparse.ArgumentParser:
        return commands.add_parser(name, parents=[common], formatter_class=_HelpFormatter,
                                   **kwargs)

    classify = command("classify", help="classify images with a shipped model")
    classify.add_argument("images", nargs="+", metavar="IMAGE",
                          help="image files (png, jpg, ...), and folders of them")
    classify.add_argument("-r", "--recursive", action="store_true",
                          help="a folder's subfolders too")
    classify.add_argument("--batch", type=_positive_int, default=8,
                          help="images per forward pass")
    classify.add_argument("-o", "--output", metavar="CSV", default=None,
                          help="write the results into this CSV file (path, then label_i and "
                               "score_i for the best classes) instead of printing them")
    shipped = ", ".join(shipped_models()) or "none found"
    classify.add_argument("--model", default=DEFAULT_MODEL,
                          help=f"a shipped model ({shipped}; - or _ alike), a folder with a "
                               f"model.json, or a .pnnx.param path (without a model.json: "
                               f"ImageNet labels and torchvision's preprocessing)")
    classify.add_argument("--top", type=_positive_int, default=5,
                          help="classes to print per image")
    classify.add_argument("--threads", type=_positive_int, default=None,
                          help="cap on CPU threads, for the model and for reading images "
                               "(default: every core; with --ray: per worker, default 1)")
    classify.add_argument("--ray", action="store_true",
                          help="run on Ray Data (pip install -e \".[cluster]\"): the cluster "
                               "at --address, else the one `ray start` runs on the local machine, "
                               "else a new Ray instance here")
    classify.add_argument("--address", default=None,
                          help="the Ray cluster to run on, HOST:6379 (implies --ray; auto: "
                               "RAY_ADDRESS or the one `ray start` runs on the local machine; "
                               "local: a new instance here)")
    classify.add_argument("--workers", type=_positive_int, default=None,
                          help="with --ray: classifier workers, each loading the model once "
                               "(default: the cluster's CPUs / --threads)")
    classify.set_defaults(run=_classify)

    _add_detect_command(command("detect", help="find faces and their landmarks (MTCNN)"))

    ops = command("ops", help="list the pnnx operator types this runtime runs")
    ops.add_argument("--markdown", action="store_true",
                     help="print the README's operator table (layer family -> pnnx types)")
    ops.add_argument("--update", metavar="README", default=None,
                     help="rewrite the operator table between the markers of this file")
    ops.set_defaults(run=_ops)

    convert = command("convert", help="convert a TorchScript (.pt) or ONNX (.onnx) file to "
                                      "pnnx files (needs pnnx)")
    convert.add_argument("model", help="MODEL.pt (TorchScript) or MODEL.onnx")
    convert.add_argument("-o", "--out", default=None,
                         help="output folder (default: the model's folder)")
    convert.add_argument("--name", default=None, help="file stem (default: the model's)")
    convert.add_argument("--inputshape", action="append", type=_input_shape, default=None,
                         help="an input's shape, e.g. 1,3,224,224 or 1,16i64 (repeat for "
                              "several inputs); needed for a scripted (not traced) model "
                              "or an ONNX model with free dims")
    convert.add_argument("--inputshape2", action="append", type=_input_shape, default=None,
                         help="a second shape per input: dims that differ stay free")
    convert.set_defaults(run=_convert)

    export = command("export", help="export a torch model to pnnx files (needs torch and pnnx)",
                     description="Export a torch model to pnnx files (needs torch and pnnx). "
                                 + RESNET18_HELP + ".")
    export.add_argument("model", help="resnet18, efficientnet-lite0 (- or _ alike), or "
                                      "package.module:factory")
    export.add_argument("--out", required=True, help="output folder")
    export.add_argument("--name", default=None,
                        help="file stem (default: the model's name, - as _)")
    export.add_argument("--shape", action="append", default=None, type=_shape,
                        help="input shape, e.g. 1,3,224,224 (repeat for several inputs; "
                             "default: 1,3,224,224)")
    weights = export.add_mutually_exclusive_group()
    weights.add_argument("--weights", default=None,
                         help="a state_dict file to load first (resnet18: "
                              "resnet18-f37072fd.pth from download.pytorch.org/models/)")
    weights.add_argument("--random-weights", action="store_true",
                         help="resnet18 without its checkpoint: seeded random weights, for "
                              "tests (its answers mean nothing)")
    export.add_argument("--dynamic", action="store_true",
                        help="trace a second input size so batch and image size stay free")
    export.add_argument("--keep-extras", action="store_true",
                        help="keep pnnx's other outputs beside the files, among them the "
                             "*_pnnx.py that compare_with_torch runs as torch's side")
    export.set_defaults(run=_export)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run a command; the project's errors are one line on stderr and exit code 2, Ctrl-C
    the line "interrupted" and exit code 130 (also where the interrupt, unwinding, made a
    library raise something else: tqdm, stopped inside its lock, releases it unheld)."""
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        if getattr(args, "shape", ()) is None:
            args.shape = [(1, 3, 224, 224)]
        logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                            format="%(levelname)s %(name)s: %(message)s")
        return int(args.run(args))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as err:
        if _raised_by_an_interrupt(err):
            print("interrupted", file=sys.stderr)
            return 130
        if isinstance(err, InferError):
            print(f"error: {err}", file=sys.stderr)
            return 2
        raise


def _raised_by_an_interrupt(err: BaseException) -> bool:
    """Whether ``err`` was raised while a KeyboardInterrupt was being handled (its chain of
    causes and contexts holds one)."""
    seen: set[int] = set()
    link: BaseException | None = err
    while link is not None and id(link) not in seen:
        if isinstance(link, KeyboardInterrupt):
            return True
        seen.add(id(link))
        link = link.__cause__ or link.__context__
    return False


if __name__ == "__main__":
    sys.exit(main())
