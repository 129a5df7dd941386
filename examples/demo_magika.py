"""End-to-end quantsim demo on a real model: Google's magika file-type classifier.

    .venv/bin/python examples/demo_magika.py [--files 600] [--calib 200] [--out-dir DIR | --tmp]

* fetches magika's ONNX model (pip-downloads the magika wheel from PyPI once, caches it;
  see benchmarks/fetch_models.py) -- magika itself is never installed or imported;
* builds model inputs from real files already on this machine (benchmarks/magika_inputs.py);
* calibrates a W8A8 QuantizationSimModel (per-channel weights, default config) with
  min_max and tf_enhanced, and reports top-1 agreement with FP32 on held-out files,
  calibration cost and simulated-inference latency relative to plain onnxruntime FP32,
  all measured side by side in this run;
* exports the AIMET-style ``.encodings`` + ``.onnx`` and a standard QDQ model.
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402

from benchmarks import magika_inputs as mi  # noqa: E402
from benchmarks.common import best_of, interleaved_best, quiet_kwargs, run_feeds, timed, top1_agreement  # noqa: E402
from benchmarks.fetch_models import cache_dir, fetch_magika  # noqa: E402


def _ext_match(paths, probs, names) -> str:
    ok = tot = 0
    for p, i in zip(paths, probs.argmax(1)):
        r = mi.expected_ok(p, names[i])
        if r is not None:
            ok, tot = ok + r, tot + 1
    return f"{ok}/{tot} ({100 * ok / max(tot, 1):.1f}%)"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=600, help="real files to use (calibration + evaluation)")
    ap.add_argument("--calib", type=int, default=200, help="files used for calibration")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3, help="latency repeats (best of)")
    ap.add_argument("--no-w8a16", dest="w8a16", action="store_false",
                    help="skip the extra W8A16 min_max row (int16 activations, for comparison)")
    ap.add_argument("--cache-dir", default=None)
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--out-dir", default=None, help="export directory (default: <cache>/demo)")
    g.add_argument("--tmp", action="store_true", help="export into a fresh temporary directory")
    args = ap.parse_args(argv)

    try:
        from quantsim import QuantizationSimModel
    except ImportError as e:  # the SDK is not finished / installed
        print(f"quantsim.QuantizationSimModel is not available ({e}); nothing to demo.", file=sys.stderr)
        return 2

    # ---- model + data -------------------------------------------------------------------
    model_dir = fetch_magika(args.cache_dir)
    model_path = model_dir / "model.onnx"
    names = mi.labels(model_dir)
    in_name = mi.input_name(model_dir)
    paths = mi.find_real_files(args.files, seed=0)
    x = mi.features(paths, model_dir)
    # every k-th file calibrates; files come round-robin by type, so both splits are diverse
    step = max(1, round(len(paths) / max(1, args.calib)))
    cal_idx = np.arange(len(paths))[::step][: args.calib]
    eval_mask = np.ones(len(paths), bool)
    eval_mask[cal_idx] = False
    eval_paths = [p for p, m in zip(paths, eval_mask) if m]
    cal_feeds = mi.batches(x[cal_idx], args.batch_size, in_name)
    eval_feeds = mi.batches(x[eval_mask], args.batch_size, in_name)
    n_types = len({p.suffix for p in paths})
    print(f"magika {model_dir.name}: {model_path} ({model_path.stat().st_size / 1e6:.1f} MB)")
    print(f"data: {len(paths)} real files ({n_types} extensions) -> {len(cal_idx)} calibration / "
          f"{int(eval_mask.sum())} evaluation, input '{in_name}' {x.shape[1:]} {x.dtype}, batch {args.batch_size}")

    # ---- FP32 reference -----------------------------------------------------------------
    fp32 = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    ref = run_feeds(fp32, eval_feeds)
    fp32_cal = lambda: run_feeds(fp32, cal_feeds)  # noqa: E731

    # ---- quantsim, both calibration schemes ---------------------------------------------
    model = onnx.load(str(model_path))
    rows, sims = [], {}
    variants = [("W8A8", "int8", "min_max"), ("W8A8", "int8", "tf_enhanced")]
    if args.w8a16:  # diagnostic: same weights, 16-bit activations
        variants.append(("W8A16", "int16", "min_max"))
    for label, act, scheme in variants:
        print(f"[demo] calibrating {label} {scheme} ...", file=sys.stderr, flush=True)
        t_build, sim = timed(lambda act=act, scheme=scheme: QuantizationSimModel(
            model, param_type="int8", activation_type=act, quant_scheme=scheme, **quiet_kwargs(QuantizationSimModel)))
        # FP32 over the same calibration data, measured right before (best of N) -> same machine load
        t_ref = best_of(fp32_cal, repeats=args.repeats, warmup=0)
        t_cal, _ = timed(lambda sim=sim: sim.compute_encodings(cal_feeds))
        out = run_feeds(sim.session, eval_feeds)
        rows.append((f"{label} {scheme}", t_build, t_cal, t_ref, top1_agreement(ref, out), out))
        sims[(label, scheme)] = sim

    sim = sims[("W8A8", "min_max")]
    print("[demo] timing inference ...", file=sys.stderr, flush=True)
    one = [{in_name: f[in_name][:1]} for f in eval_feeds[:8]]
    lat = interleaved_best({
        "fp32": lambda: run_feeds(fp32, eval_feeds), "sim": lambda: run_feeds(sim.session, eval_feeds),
        "fp32_1": lambda: run_feeds(fp32, one), "sim_1": lambda: run_feeds(sim.session, one),
    }, repeats=args.repeats)
    t_fp32_eval, t_sim_eval = lat["fp32"], lat["sim"]
    t_fp32_one, t_sim_one = lat["fp32_1"] / len(one), lat["sim_1"] / len(one)

    # ---- export -------------------------------------------------------------------------
    if args.tmp:
        out_dir = Path(tempfile.mkdtemp(prefix="quantsim-demo-"))
    else:
        out_dir = Path(args.out_dir) if args.out_dir else cache_dir(args.cache_dir) / "demo"
    out_dir.mkdir(parents=True, exist_ok=True)
    t_export, _ = timed(lambda: sim.export(str(out_dir), "magika_w8a8"))
    qdq_note = ""
    try:
        qdq = sim.to_onnx_qdq()
        qdq_path = out_dir / "magika_w8a8_qdq.onnx"
        onnx.save(qdq, str(qdq_path))
        qdq_sess = ort.InferenceSession(qdq.SerializeToString(), providers=["CPUExecutionProvider"])
        qdq_out = run_feeds(qdq_sess, eval_feeds)
        n_q = sum(n.op_type == "QuantizeLinear" for n in qdq.graph.node)
        qdq_note = (f"QDQ model: {qdq_path.name} ({n_q} QuantizeLinear); top-1 vs FP32 "
                    f"{100 * top1_agreement(ref, qdq_out):.1f}%, vs sim {100 * top1_agreement(rows[0][5], qdq_out):.1f}%, "
                    f"max |qdq - sim| {float(np.abs(qdq_out - rows[0][5]).max()):.2e}")
    except Exception as e:  # report, don't hide
        qdq_note = f"QDQ export failed: {type(e).__name__}: {e}"

    # ---- report -------------------------------------------------------------------------
    n_eval = int(eval_mask.sum())
    print(f"\nint8 per-channel weights (default config), FP32-vs-sim top-1 agreement on {n_eval} held-out files; "
          f"{platform.machine()} x{os.cpu_count()} (load {os.getloadavg()[0]:.1f}), onnxruntime {ort.__version__}")
    print(f"  {'sim':<18}{'top-1 agree':>12}{'calib time':>12}{'vs FP32 fwd':>13}{'build':>8}")
    for label, t_build, t_cal, t_ref, agree, _ in rows:
        print(f"  {label:<18}{100 * agree:>11.1f}%{t_cal:>11.3f}s{t_cal / t_ref:>12.1f}x{t_build:>7.2f}s")
    print(f"  calib time: one compute_encodings run over {len(cal_idx)} files; 'vs FP32 fwd' divides it by plain "
          f"onnxruntime FP32 over the same files measured just before (best of {args.repeats}; "
          f"{', '.join(f'{r[3] * 1e3:.0f}' for r in rows)} ms)")
    print(f"  predictions matching file extension: FP32 {_ext_match(eval_paths, ref, names)}, "
          f"W8A8 min_max {_ext_match(eval_paths, rows[0][5], names)}"
          + (f", W8A16 min_max {_ext_match(eval_paths, rows[2][5], names)}" if len(rows) > 2 else ""))
    print(f"latency, W8A8 min_max sim.session vs FP32 session (interleaved, best of {args.repeats}):")
    print(f"  batch {args.batch_size:>3}: {t_sim_eval / n_eval * 1e6:8.1f} vs {t_fp32_eval / n_eval * 1e6:8.1f} us/file "
          f"-> {t_sim_eval / t_fp32_eval:.2f}x")
    print(f"  batch   1: {t_sim_one * 1e6:8.1f} vs {t_fp32_one * 1e6:8.1f} us/file -> {t_sim_one / t_fp32_one:.2f}x")
    exported = sorted(p.name for p in out_dir.iterdir() if p.name.startswith("magika_w8a8"))
    print(f"exported to {out_dir} in {t_export:.2f}s: {', '.join(exported)}")
    print(qdq_note)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
