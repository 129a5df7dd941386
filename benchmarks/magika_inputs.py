"""Turn real files on this machine into inputs for magika's ONNX model.

Re-implements magika 1.0.3's feature extraction ("v2", ``Magika._extract_features_from_seekable``)
without importing magika:

* read at most ``block_size`` bytes from the beginning and from the end of the file;
* ``bytes.lstrip()`` the beginning block and ``bytes.rstrip()`` the end block
  (ASCII whitespace: space, \\t, \\n, \\r, \\x0b, \\x0c);
* ``beg`` = first ``beg_size`` bytes of the stripped beginning, right-padded with
  ``padding_token``; ``end`` = last ``end_size`` bytes of the stripped end,
  left-padded with ``padding_token``;
* model input = ``beg + end`` (``mid_size`` is 0 for this model) as int32,
  shape ``[N, beg_size + end_size]`` (``[N, 2048]``), ONNX input name ``bytes``;
  the output ``target_label`` is ``[N, len(target_labels_space)]`` probabilities.

Magika itself does not run the model on files with fewer than
``min_file_size_for_dl`` meaningful bytes; :func:`find_real_files` skips such files.

    python -m benchmarks.magika_inputs [N]   # FP32 sanity check with onnxruntime
"""
from __future__ import annotations

import json
import os
import random
import stat
import sys
import sysconfig
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

DEFAULT_INPUT_NAME = "bytes"
DEFAULT_OUTPUT_NAME = "target_label"

# extension -> magika labels we would accept as "right" for a sanity check
EXPECTED: dict[str, tuple[str, ...]] = {
    ".py": ("python",), ".c": ("c", "cpp"), ".h": ("c", "cpp"), ".json": ("json", "jsonl"),
    ".xml": ("xml",), ".html": ("html",), ".txt": ("txt", "randomtxt"), ".gz": ("gzip",),
    ".so": ("elf",), ".png": ("png",), ".sh": ("shell",), ".md": ("markdown",),
    ".js": ("javascript",), ".css": ("css",), ".yaml": ("yaml",), ".rst": ("rst",),
    ".pl": ("perl",), ".svg": ("svg",), ".jar": ("jar", "zip"), ".pem": ("pem", "crt"),
    ".csv": ("csv",), ".ini": ("ini",), ".conf": ("ini", "txt", "shell"), ".pdf": ("pdf",),
    ".jpg": ("jpeg",), ".ttf": ("ttf",), ".toml": ("toml",), ".pyc": ("pythonbytecode",),
    ".cmake": ("cmake",), ".mo": (), ".zip": ("zip",), ".pm": ("perl",),
}
EXTENSIONS = tuple(EXPECTED)


def default_roots() -> list[Path]:
    roots = ["/usr/share", "/etc", "/usr/include", sysconfig.get_paths()["purelib"],
             sysconfig.get_paths()["stdlib"], "/usr/lib/x86_64-linux-gnu"]
    roots += sorted(str(p) for p in Path("/usr/lib").glob("python3*"))
    seen, out = set(), []
    for r in roots:
        p = Path(r)
        if p.is_dir() and p.resolve() not in seen:
            seen.add(p.resolve())
            out.append(p)
    return out


def _candidates(roots: Sequence[Path], extensions: Sequence[str], min_size: int, max_size: int) -> dict[str, list[Path]]:
    by_ext: dict[str, set[Path]] = {e: set() for e in extensions}
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root, onerror=lambda e: None):
            dirnames.sort()
            for fn in filenames:
                ext = os.path.splitext(fn)[1].lower()
                if ext not in by_ext:
                    continue
                p = os.path.join(dirpath, fn)
                try:
                    st = os.lstat(p)  # no symlinks: regular files only
                except OSError:
                    continue
                if stat.S_ISREG(st.st_mode) and min_size <= st.st_size <= max_size:
                    by_ext[ext].add(Path(p))
    return {e: sorted(v) for e, v in by_ext.items() if v}


def _usable(path: Path, min_meaningful: int) -> bool:
    """Readable, and enough non-whitespace bytes that magika would run the model on it."""
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
    except OSError:
        return False
    return len(head.lstrip()) >= min_meaningful


def find_real_files(n: int, seed: int = 0, roots: Sequence[str | os.PathLike] | None = None,
                    extensions: Sequence[str] = EXTENSIONS, min_size: int = 64,
                    max_size: int = 32 << 20) -> list[Path]:
    """``n`` diverse, readable regular files already on this machine (deterministic).

    Candidates are grouped by extension; each group is sorted, shuffled with a
    seeded RNG, and files are taken round-robin across extensions so that every
    type is represented.  Empty/tiny (< ``min_size``) and huge files are skipped.
    """
    roots = [Path(r) for r in roots] if roots is not None else default_roots()
    groups = _candidates(roots, [e.lower() for e in extensions], min_size, max_size)
    rng = random.Random(seed)
    order = {}
    for ext in sorted(groups):
        files = list(groups[ext])
        rng.shuffle(files)
        order[ext] = iter(files)
    out: list[Path] = []
    while len(out) < n and order:
        for ext in list(order):
            if len(out) >= n:
                break
            for p in order[ext]:
                if _usable(p, 16):
                    out.append(p)
                    break
            else:
                del order[ext]
    if len(out) < n:
        print(f"[magika_inputs] only {len(out)} usable files found (wanted {n})", file=sys.stderr)
    return out


def load_config(model_dir: str | os.PathLike | Mapping) -> dict:
    """The model config: a dict as-is, or ``<model_dir>/config.min.json``."""
    if isinstance(model_dir, Mapping):
        return dict(model_dir)
    return json.loads((Path(model_dir) / "config.min.json").read_text())


def labels(model_dir: str | os.PathLike | Mapping) -> list[str]:
    """Output label names, in the order of the model's output columns."""
    return list(load_config(model_dir)["target_labels_space"])


def input_name(model_dir: str | os.PathLike | Mapping) -> str:
    """The ONNX input name (read from the model when a model dir is given)."""
    if isinstance(model_dir, Mapping):
        return model_dir.get("input_name", DEFAULT_INPUT_NAME)
    import onnx

    m = onnx.load(str(Path(model_dir) / "model.onnx"), load_external_data=False)
    inits = {i.name for i in m.graph.initializer}
    return [i.name for i in m.graph.input if i.name not in inits][0]


def file_features(path: str | os.PathLike, cfg: Mapping) -> np.ndarray:
    """One file's model input row (int32, length beg_size + mid_size + end_size)."""
    beg_size, end_size = int(cfg["beg_size"]), int(cfg["end_size"])
    block, pad = int(cfg["block_size"]), int(cfg["padding_token"])
    if int(cfg.get("mid_size", 0)) != 0 or cfg.get("use_inputs_at_offsets", False):
        raise NotImplementedError("only the beg/end feature layout (magika v2 features) is implemented")
    assert beg_size < block and end_size < block
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        k = min(block, size)
        beg = f.read(k)
        f.seek(size - k)
        end = f.read(k)
    row = np.full(beg_size + end_size, pad, dtype=np.int32)
    if beg_size:
        b = np.frombuffer(beg.lstrip()[:beg_size], dtype=np.uint8)
        row[: len(b)] = b
    if end_size:
        e = end.rstrip()
        e = np.frombuffer(e[max(0, len(e) - end_size):], dtype=np.uint8)
        row[beg_size + end_size - len(e):] = e
    return row


def features(paths: Sequence[str | os.PathLike], model_dir: str | os.PathLike | Mapping) -> np.ndarray:
    """``[len(paths), beg_size + end_size]`` int32 array in magika's model input layout."""
    cfg = load_config(model_dir)
    width = int(cfg["beg_size"]) + int(cfg.get("mid_size", 0)) + int(cfg["end_size"])
    out = np.empty((len(paths), width), dtype=np.int32)
    for i, p in enumerate(paths):
        out[i] = file_features(p, cfg)
    return out


def batches(feats: np.ndarray, batch_size: int, input_name: str = DEFAULT_INPUT_NAME) -> list[dict[str, np.ndarray]]:
    """Split rows into feeds ``{input_name: feats[i:i+batch_size]}`` (last one may be short)."""
    if batch_size <= 0:
        raise ValueError("batch_size must be positive")
    return [{input_name: np.ascontiguousarray(feats[i:i + batch_size])}
            for i in range(0, len(feats), batch_size)]


def expected_ok(path: str | os.PathLike, label: str) -> bool | None:
    """Is ``label`` a plausible magika label for this file's extension? None if unknown."""
    exp = EXPECTED.get(Path(path).suffix.lower())
    return (label in exp) if exp else None


def main(argv: list[str] | None = None) -> int:
    import collections
    import time

    import onnxruntime as ort

    from benchmarks.fetch_models import fetch_magika

    argv = sys.argv[1:] if argv is None else argv
    n = int(argv[0]) if argv else 300
    model_dir = fetch_magika()
    t0 = time.perf_counter()
    paths = find_real_files(n)
    x = features(paths, model_dir)
    t1 = time.perf_counter()
    names = labels(model_dir)
    sess = ort.InferenceSession(str(model_dir / "model.onnx"), providers=["CPUExecutionProvider"])
    probs = np.concatenate([sess.run(None, f)[0] for f in batches(x, 64, input_name(model_dir))])
    pred = [names[i] for i in probs.argmax(1)]
    print(f"{len(paths)} files, features {x.shape} {x.dtype} in {t1 - t0:.2f}s; output {probs.shape}")
    per_ext: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    ok = tot = 0
    for p, lab in zip(paths, pred):
        per_ext[p.suffix.lower()][lab] += 1
        r = expected_ok(p, lab)
        if r is not None:
            ok += r
            tot += 1
    for ext in sorted(per_ext):
        c = per_ext[ext]
        print(f"  {ext:6s} n={sum(c.values()):3d}  " + ", ".join(f"{k}:{v}" for k, v in c.most_common(4)))
    print(f"FP32 predictions matching the file extension: {ok}/{tot} ({100 * ok / max(tot, 1):.1f}%)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
