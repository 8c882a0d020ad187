"""python -m infer.bench [--models ...] [--batches ...] [--rounds N] [--threads N] [--quick]
python -m infer.bench --layers [--models ...] [--batches ...]    (operator by operator)"""

from __future__ import annotations

import argparse
import logging
import shlex
import sys
from pathlib import Path

from infer.bench import report
from infer.bench.models import DEFAULT_MODELS, MODELS, REPO
from infer.bench.operators import compare_layers
from infer.bench.run import ENGINES, Settings, run_benchmark


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m infer.bench",
        description="Time this runtime, onnxruntime and PyTorch on the same models, each in "
                    "its own process, and write the table into BENCHMARKS.md.")
    parser.add_argument("--models", nargs="+", choices=sorted(MODELS), default=DEFAULT_MODELS)
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 8])
    parser.add_argument("--engines", nargs="+", choices=ENGINES, default=list(ENGINES))
    parser.add_argument("--rounds", type=int, default=5, help="rounds over all engines")
    parser.add_argument("--threads", type=int, default=2, help="threads per engine")
    parser.add_argument("--seconds", type=float, default=2.0,
                        help="timed inferences per worker: at least this long (and 5 runs)")
    parser.add_argument("--onnx-exporter", choices=["dynamo", "legacy"], default="dynamo",
                        help="torch.onnx.export(dynamo=True) (needs onnxscript) or the older "
                             "TorchScript-based exporter (dynamo=False): faster to export")
    parser.add_argument("--quick", action="store_true",
                        help="one short round: a check that everything runs, not a measurement")
    parser.add_argument("--workdir", type=Path, default=None,
                        help="keep the exported model files here (reused by later runs)")
    parser.add_argument("--output", type=Path, default=REPO / "BENCHMARKS.md",
                        help="the Markdown file whose results section is rewritten")
    parser.add_argument("--no-write", action="store_true", help="print the tables only")
    parser.add_argument("--layers", action="store_true",
                        help="instead: time each operator of this runtime beside onnxruntime's "
                             "own per-node profile (medians of 20 runs, 3 with --quick), "
                             "paired by what they compute, and print the table "
                             "(infer/bench/operators.py)")
    args = parser.parse_args(argv)
    for name in ("rounds", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    if min(args.batches) < 1:
        parser.error("--batches must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    logging.basicConfig(level=logging.WARNING)
    settings = Settings(models=tuple(args.models), batches=tuple(args.batches),
                        engines=tuple(args.engines), rounds=args.rounds, threads=args.threads,
                        seconds=args.seconds, workdir=args.workdir,
                        onnx_exporter=args.onnx_exporter)
    if args.quick:
        settings.rounds, settings.seconds, settings.min_runs, settings.warmup = 1, 0.0, 2, 1
    if args.layers:
        settings.min_runs = 3 if args.quick else max(20, settings.min_runs)
        sections, ok = compare_layers(settings, say=lambda line: print(line, flush=True))
        for section in sections:
            print("\n" + section)
        return 0 if ok else 1
    results = run_benchmark(settings, say=lambda line: print(line, flush=True))
    command = "python -m infer.bench " + shlex.join(sys.argv[1:] if argv is None else argv)
    section = report.markdown(results, command.strip())
    print("\n" + section)
    if not args.no_write:
        report.write(args.output, section)
        print(f"written into {args.output}")
    return 0 if all(m.ok for m in results.measurements) else 1


if __name__ == "__main__":
    sys.exit(main())
