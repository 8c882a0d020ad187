"""Command line: ``python -m infer classify|ops|export ...`` (``--help`` on each)."""

from __future__ import annotations

import argparse
import logging
import sys

from parser.errors import InferError


def _classify(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from infer.classify import ImageClassifier

    classifier = ImageClassifier.load(args.model)
    if args.threads:
        classifier.graph.set_num_threads(args.threads)
    progress = tqdm(args.images, desc="classifying", unit="image", file=sys.stderr,
                    disable=len(args.images) < 2 or not sys.stderr.isatty())
    for path in progress:
        results = classifier.classify(path, top=args.top)
        if len(args.images) > 1:
            progress.write(f"{path}:")
        width = max(len(label) for label, _ in results)
        for label, probability in results:
            progress.write(f"{label:<{width}}  {probability:.4f}")
    return 0


def _ops(args: argparse.Namespace) -> int:
    from layers import LayerRegisterer

    registry = LayerRegisterer()
    for type_name in registry.types():
        layer_class = registry.layer_class(type_name)
        print(f"{type_name:<28} {layer_class.__module__}.{layer_class.__name__}")
    return 0


def _export(args: argparse.Namespace) -> int:
    from infer.export import export_command

    param, binary = export_command(args.model, args.out, args.shape, args.name, args.weights,
                                   args.dynamic)
    print(param)
    print(binary)
    return 0


def _positive_int(text: str) -> int:
    value = int(text)
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m infer",
                                     description="Run pnnx models on the CPU.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log what happens")
    commands = parser.add_subparsers(dest="command", required=True)

    classify = commands.add_parser("classify", help="classify images with a shipped model")
    classify.add_argument("images", nargs="+", help="image files (png, jpg, ...)")
    classify.add_argument("--model", default="efficientnet_lite0",
                          help="a model_file/ folder name, a folder with model.json, or a "
                               ".pnnx.param path (ImageNet labels and mean/std unless a "
                               "model.json beside it says otherwise; default: %(default)s)")
    classify.add_argument("--top", type=_positive_int, default=5,
                          help="classes to print per image")
    classify.add_argument("--threads", type=_positive_int, default=None,
                          help="cap on CPU threads")
    classify.set_defaults(run=_classify)

    ops = commands.add_parser("ops", help="list the pnnx operator types this runtime runs")
    ops.set_defaults(run=_ops)

    export = commands.add_parser("export", help="export a torch model to pnnx files "
                                                "(needs torch and pnnx)")
    export.add_argument("model", help="resnet18, efficientnet-lite0, or package.module:factory")
    export.add_argument("--out", required=True, help="output folder")
    export.add_argument("--name", default=None, help="file stem (default: from the model)")
    export.add_argument("--shape", action="append", default=None, type=_shape,
                        help="input shape, e.g. 1,3,224,224 (repeat for several inputs)")
    export.add_argument("--weights", default=None, help="a state_dict file to load first")
    export.add_argument("--dynamic", action="store_true",
                        help="trace a second input size so batch and image size stay free")
    export.set_defaults(run=_export)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "shape", ()) is None:
        args.shape = [(1, 3, 224, 224)]
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        return args.run(args)
    except InferError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
