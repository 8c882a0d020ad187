"""The benchmark: this runtime, onnxruntime and PyTorch on the same models, side by side.

    python -m infer.bench            # ResNet18 and EfficientNet-Lite0, batch 1 and 8: printed
    python -m infer.bench --write    # the same, and the tables written into BENCHMARKS.md
    python -m infer.bench --quick    # a small CNN, one short round: a smoke test, seconds
    python -m infer.bench --models breadth   # six models, one of each family (breadth.py)

How to compare inference engines fairly, and how this benchmark does it:

- Same model, same weights, same input. One torch module is exported for each engine
  (models.py): pnnx files for this runtime, ONNX for onnxruntime, a frozen TorchScript trace
  for PyTorch; every engine gets the same seeded input, and each output is checked against
  torch's (within 1e-4).
- One process per engine. Thread pools spin for a while after each run, and two engines in
  one process would slow each other down; memory too is only attributable per process. Every
  measurement runs in a fresh worker process (worker.py) that imports only its own engine.
- Same threads. Every engine is capped at ``--threads`` (2 by default): onnxruntime's
  intra-op threads, torch.set_num_threads, this runtime's set_num_threads; the usual
  environment variables (OMP_NUM_THREADS, OPENBLAS_NUM_THREADS, ...) are set for every worker.
- Rounds, alternating. Machines drift (other processes, frequency, heat), so the engines take
  turns: each round runs every engine once, in a rotated order, and the median is taken over
  all rounds. The per-round medians are reported too: when they disagree a lot, the machine
  was busy and the numbers are to be taken with care.
- Warm-up apart. Loading, the first inference (compilation, caches, memory touched for the
  first time) and the steady state are reported separately, and this runtime's start-up is
  measured once with its compiled kernels' on-disk cache empty and once with it filled
  (not with --quick: compiling the kernels takes about a minute per model).
- Ratios, not absolute times. Targets are stated as ratios to onnxruntime measured in the
  same run, which survive a change of machine better than milliseconds do.

models.py names the models (breadth.py writes the breadth ones), run.py drives the workers,
report.py makes the tables (and, with --write, writes them into BENCHMARKS.md).
"""
