"""python -m infer.bench [--models ...] [--batches ...] [--rounds N] [--threads N] [--quick]
                         [--write | --output FILE]
python -m infer.bench --layers [--models ...] [--batches ...]    (operator by operator)
python -m infer.bench --folder [N] [--models ...] [--batches ...] (images/s through classify DIR)

``--models breadth`` names the breadth models (BREADTH_MODELS: one of each family),
``--models real`` the real ones (REAL_MODELS: PP-OCR's, ONNX files from PyPI, batch 1).

The tables are printed; only ``--write`` (or ``--output FILE``) puts them into a file."""

from __future__ import annotations

import argparse
import logging
import shlex
import sys
from pathlib import Path

from infer.bench import folder, report
from infer.bench.models import BREADTH_MODELS, DEFAULT_MODELS, MODELS, REAL_MODELS, REPO
from infer.bench.operators import compare_layers
from infer.bench.run import ENGINES, Settings, run_benchmark

DEFAULT_OUTPUT = REPO / "BENCHMARKS.md"
DEFAULT_BATCHES = (1, 8)
QUICK_MODELS = ("tiny",)            # --quick without --models: exports in seconds
QUICK_BATCHES = (1,)
GROUPS = {"breadth": BREADTH_MODELS, "real": REAL_MODELS}  # names for several models


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m infer.bench",
        description="Time this runtime, onnxruntime and PyTorch on the same models, each in "
                    "its own process, and print the tables; --write puts them into "
                    "BENCHMARKS.md.")
    parser.add_argument("--models", nargs="+", choices=sorted(MODELS) + sorted(GROUPS),
                        default=None,
                        help=f"default: {' '.join(DEFAULT_MODELS)}; with --quick: "
                             f"{' '.join(QUICK_MODELS)}; breadth: "
                             f"{' '.join(BREADTH_MODELS)}; real (batch 1, no torch): "
                             f"{' '.join(REAL_MODELS)}"),
    parser.add_argument("--batches", nargs="+", type=int, default=None,
                        help=f"default: {' '.join(map(str, DEFAULT_BATCHES))}; with --quick: "
                             f"{' '.join(map(str, QUICK_BATCHES))}")
    parser.add_argument("--engines", nargs="+", choices=ENGINES, default=list(ENGINES),
                        help="default: all three")
    parser.add_argument("--rounds", type=int, default=5,
                        help="rounds over all engines (default: 5; with --quick: 1)")
    parser.add_argument("--threads", type=int, default=2, help="threads per engine (default: 2)")
    parser.add_argument("--seconds", type=float, default=2.0,
                        help="timed inferences per worker: at least this long and 5 runs "
                             "(default: 2; with --quick: 2 runs)")
    parser.add_argument("--onnx-exporter", choices=["dynamo", "legacy"], default=None,
                        help="torch.onnx.export(dynamo=True) (needs onnxscript) or the older "
                             "TorchScript-based exporter (dynamo=False): faster to export. "
                             "Default: dynamo; with --quick: legacy")
    parser.add_argument("--no-cold-start", action="store_true",
                        help="skip pnnx-infer's start with an empty kernel cache (the kernels "
                             "compile in the background: a minute or two per model)")
    parser.add_argument("--quick", action="store_true",
                        help="a check that everything runs, not a measurement, in seconds: "
                             "the tiny model at batch 1 (unless --models / --batches say "
                             "otherwise), one round of 2 inferences, the legacy ONNX exporter, "
                             "no start-up with an empty kernel cache")
    parser.add_argument("--workdir", type=Path, default=None,
                        help="keep the exported model files here (reused by later runs); "
                             "default: a temporary folder")
    parser.add_argument("--write", action="store_true",
                        help=f"write the tables into the results section of {DEFAULT_OUTPUT.name} "
                             "(between its markers; the text around them is kept)")
    parser.add_argument("--output", type=Path, default=None, metavar="FILE",
                        help="write the tables into the results section of FILE instead "
                             "(implies --write)")
    parser.add_argument("--no-write", action="store_true",
                        help="no-op, kept for older command lines: not writing is the default")
    parser.add_argument("--layers", action="store_true",
                        help="instead: time each operator of this runtime beside onnxruntime's "
                             "own per-node profile (medians of 20 runs, 3 with --quick), "
                             "paired by what they compute, and print the table "
                             "(infer/bench/operators.py)")
    parser.add_argument("--folder", nargs="?", type=int, const=0, default=None, metavar="N",
                        help=f"instead: images per second through the folder pipeline of "
                             f"`python -m infer classify DIR` on N generated images (default "
                             f"{folder.FOLDER_IMAGES}; with --quick {folder.QUICK_IMAGES}), "
                             f"this runtime beside onnxruntime, at batch max(--batches); "
                             f"model: {' '.join(folder.FOLDER_MODELS)} unless --models "
                             f"(infer/bench/folder.py)")
    args = parser.parse_args(argv)
    for name in ("rounds", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    if args.batches is not None and min(args.batches) < 1:
        parser.error("--batches must be positive")
    if args.no_write and (args.write or args.output):
        parser.error("--no-write contradicts --write / --output")
    if args.layers and (args.write or args.output):
        parser.error("--layers prints its tables only; --write / --output are for the "
                     "latency tables")
    if args.folder is not None:
        if args.layers or args.write or args.output:
            parser.error("--folder prints its table only, without --layers / --write / "
                         "--output")
        if args.folder < 0:
            parser.error("--folder: a number of images, at least 1")
        args.folder = args.folder or (folder.QUICK_IMAGES if args.quick
                                      else folder.FOLDER_IMAGES)
        if not args.quick:
            args.models = args.models or list(folder.FOLDER_MODELS)
    args.models = tuple(args.models or (QUICK_MODELS if args.quick else DEFAULT_MODELS))
    args.models = tuple(dict.fromkeys(model for name in args.models      # groups expanded,
                                      for model in GROUPS.get(name, (name,))))  # no repeats
    args.batches = tuple(args.batches or (QUICK_BATCHES if args.quick else DEFAULT_BATCHES))
    args.onnx_exporter = args.onnx_exporter or ("legacy" if args.quick else "dynamo")
    if args.output is None and args.write:
        args.output = DEFAULT_OUTPUT
    return args


def settings_of(args: argparse.Namespace) -> Settings:
    settings = Settings(models=args.models, batches=args.batches, engines=tuple(args.engines),
                        rounds=args.rounds, threads=args.threads, seconds=args.seconds,
                        workdir=args.workdir, onnx_exporter=args.onnx_exporter,
                        cold_start=not args.no_cold_start)
    if args.quick:       # compiling the kernels into an empty cache takes about a minute
        settings.rounds, settings.seconds, settings.min_runs, settings.warmup = 1, 0.0, 2, 1
        settings.cold_start = settings.fixed_cost = False
    return settings


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    logging.basicConfig(level=logging.WARNING)
    settings = settings_of(args)
    if args.layers:
        settings.min_runs = 3 if args.quick else max(20, settings.min_runs)
        sections, ok = compare_layers(settings, say=lambda line: print(line, flush=True))
        for section in sections:
            print("\n" + section)
        return 0 if ok else 1
    command = "python -m infer.bench " + shlex.join(sys.argv[1:] if argv is None else argv)
    if args.folder is not None:
        found = folder.run_folder_benchmark(settings, args.folder,
                                            say=lambda line: print(line, flush=True))
        print("\n" + folder.markdown(found, command.strip()))
        return 0 if folder.ok(found) else 1
    results = run_benchmark(settings, say=lambda line: print(line, flush=True))
    section = report.markdown(results, command.strip())
    print("\n" + section)
    if args.output is not None:
        report.write(args.output, section)
        print(f"written into {args.output}")
    else:
        print(f"(not written: --write puts these tables into {DEFAULT_OUTPUT.name})")
    return 0 if all(m.ok for m in results.measurements) else 1


if __name__ == "__main__":
    sys.exit(main())
