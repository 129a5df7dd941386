"""Cold vs warm model preparation on the real models of the benchmark suite.

``python -m benchmarks.bench_prepare`` prints, per model, the time of ``quantsim.prepare.prepare`` with an
empty cache (all passes run) and with the entry it just stored (hash check + load), in a temporary cache
folder so the user's cache is left alone. Also written to ``benchmarks/results/prepare.md``.
"""
from __future__ import annotations

import importlib
import sys
import tempfile
import time
from pathlib import Path

import onnx

from benchmarks.fetch_models import fetch_magika
from benchmarks.suite.fetch import fetch_minilm, fetch_ppocr

RESULTS = Path(__file__).resolve().parent / "results" / "prepare.md"


def _models() -> dict[str, Path]:
    ppocr = fetch_ppocr()
    return {"PP-OCRv4 det": ppocr / "det.onnx", "PP-OCRv4 rec": ppocr / "rec.onnx", "PP-OCR cls": ppocr / "cls.onnx",
            "paraphrase-MiniLM-L3-v2": fetch_minilm() / "model.onnx", "magika": fetch_magika() / "model.onnx"}


def main() -> int:
    prepare_module = importlib.import_module("quantsim.prepare")
    rows = ["| model | nodes in / out | cold prepare (s) | warm prepare (s) | cold / warm |", "|---|--:|--:|--:|--:|"]
    with tempfile.TemporaryDirectory(prefix="quantsim-bench-cache-") as cache:
        for name, path in _models().items():
            model = onnx.load(str(path))
            t0 = time.perf_counter()
            prepared = prepare_module.prepare(model, cache_dir=cache)
            t1 = time.perf_counter()
            again = prepare_module.prepare(model, cache_dir=cache)
            t2 = time.perf_counter()
            assert again.SerializeToString() == prepared.SerializeToString(), name
            cold, warm = t1 - t0, t2 - t1
            rows.append(f"| {name} | {len(model.graph.node)} / {len(prepared.graph.node)} | {cold:.3f} | {warm:.3f} | "
                        f"{cold / warm:.1f}x |")
            print(rows[-1], flush=True)
    text = "## Preparation: cold vs warm cache\n\n" + "\n".join(rows) + "\n"
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(text)
    print(f"\n(written to {RESULTS})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
