"""Training and measurement cost per epoch of the ViT study's tiny ViT on digits (CPU).

Runs ``train_vit`` (the code behind ``blockcoupling vit-train``) with the paper's recipe on
scikit-learn's digits (16x16, 17 tokens), the ``tiny`` preset (width 64, 4 blocks, 4 heads),
and reads the per-epoch wall and CPU seconds of the training pass, the evaluation pass and
the coupling measurement (depth-wise, [CLS] token, K = 10, ``--monitor-images`` test
images) from ``metrics.json``. CPU seconds (``time.process_time``) are the process's own
work, which a loaded shared machine does not inflate the way it inflates wall time.

    python benchmarks/bench_vit_train.py --epochs 10 --threads 1
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch
from common import machine, save

from blockcoupling.studies.vit.train import VitTrainConfig, train_vit


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--monitor-images", type=int, default=4)
    ap.add_argument("--drop-path", type=float, default=0.1)
    args = ap.parse_args()
    load_start = os.getloadavg()[0]
    cfg = VitTrainConfig(dataset="digits", epochs=args.epochs, drop_path=args.drop_path,
                         monitor_images=args.monitor_images)
    with tempfile.TemporaryDirectory() as tmp:
        t0, c0 = time.perf_counter(), time.process_time()
        out = train_vit(cfg, Path(tmp) / "run", progress=False, threads=args.threads)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        metrics = json.loads((out / "metrics.json").read_text())
    epochs = [e for e in metrics["epochs"] if e["epoch"] >= 1]

    def med(key: str) -> float:
        return statistics.median(e[key] for e in epochs)

    record = {
        "bench": "vit_train", "machine": machine(), "threads": args.threads,
        "load_start": load_start, "load_end": os.getloadavg()[0],
        "config": cfg.to_dict(), "total_wall_s": wall, "total_cpu_s": cpu,
        "median_train_wall_s": med("seconds_train"), "median_train_cpu_s": med("cpu_seconds_train"),
        "median_eval_wall_s": med("seconds_eval"),
        "median_measure_wall_s": med("seconds_measure"),
        "median_measure_cpu_s": med("cpu_seconds_measure"),
        "test_accuracy": [e["test_accuracy"] for e in metrics["epochs"]],
        "coupling": [e["coupling"] for e in metrics["epochs"]],
        "final": metrics["final"], "torch": torch.__version__,
    }
    print(json.dumps({k: v for k, v in record.items() if k not in ("machine", "config")},
                     indent=1))
    print("saved", save([record], "bench_vit_train"))


if __name__ == "__main__":
    main()
