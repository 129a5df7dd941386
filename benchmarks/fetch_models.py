"""Fetch real models for the demo and benchmarks into a local cache.

Nothing here talks to a model hub: the only network access is ``pip download``
of the ``magika`` wheel from PyPI (the wheel ships its ONNX model).  The wheel
is *not* installed; we only unzip the model files out of it.

    python -m benchmarks.fetch_models          # prints the cached paths
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

MAGIKA_VERSION = "1.0.3"
MAGIKA_MODEL = "standard_v3_3"  # the model magika 1.0.3 uses by default
MAGIKA_FILES = ("model.onnx", "config.min.json")


def cache_dir(path: str | os.PathLike | None = None) -> Path:
    """Cache root: ``path`` if given, else $QUANTSIM_CACHE_DIR, else ~/.cache/quantsim."""
    if path is not None:
        root = Path(path)
    elif os.environ.get("QUANTSIM_CACHE_DIR"):
        root = Path(os.environ["QUANTSIM_CACHE_DIR"])
    else:
        root = Path.home() / ".cache" / "quantsim"
    return root.expanduser()


def _norm(name: str) -> str:
    """PEP 503 normalisation, also applied to wheel file-name prefixes (``-``/``.`` -> ``_``, lower)."""
    return name.lower().replace("-", "_").replace(".", "_")


def find_wheel(wheel_dir: Path, name: str, version: str) -> Path | None:
    """A cached wheel of ``name==version`` in ``wheel_dir`` (wheel file names may differ in case)."""
    if not wheel_dir.is_dir():
        return None
    want = f"{_norm(name)}-{version}-"
    found = sorted(p for p in wheel_dir.glob("*.whl") if _norm(p.name.split("-", 1)[0]) + "-"
                   + p.name.split("-", 2)[1] + "-" == want)
    return found[0] if found else None


def fetch_wheel(name: str, version: str, cache: str | os.PathLike | None = None) -> Path:
    """``<cache>/wheels/<wheel>`` for ``name==version``, downloading it with pip only when missing."""
    wheel_dir = cache_dir(cache) / "wheels"
    wheel = find_wheel(wheel_dir, name, version)
    if wheel is not None:
        return wheel
    wheel_dir.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "-q", f"{name}=={version}", "-d", str(wheel_dir)]
    print(f"[fetch] {' '.join(cmd)}", file=sys.stderr)
    subprocess.run(cmd, check=True)
    wheel = find_wheel(wheel_dir, name, version)
    if wheel is None:
        raise RuntimeError(f"pip download did not produce a {name} {version} wheel in {wheel_dir}")
    return wheel


def _model_members(zf: zipfile.ZipFile) -> dict[str, str]:
    """Map wanted file name -> archive member for the standard model inside the wheel."""
    names = zf.namelist()
    prefix = f"magika/models/{MAGIKA_MODEL}/"
    members = {f: prefix + f for f in MAGIKA_FILES if prefix + f in names}
    if len(members) != len(MAGIKA_FILES):
        # Fall back to any model dir in the wheel that has both files (newest name last).
        dirs = sorted({n.rsplit("/", 1)[0] for n in names
                       if n.startswith("magika/models/") and n.endswith("/model.onnx")})
        for d in reversed(dirs):
            if all(f"{d}/{f}" in names for f in MAGIKA_FILES):
                return {f: f"{d}/{f}" for f in MAGIKA_FILES}
        raise RuntimeError(f"no magika model with {MAGIKA_FILES} found in wheel")
    return members


def fetch_magika(cache: str | os.PathLike | None = None) -> Path:
    """Return a directory holding magika's ``model.onnx`` and ``config.min.json``.

    Downloads the wheel only if it is not cached; extraction is atomic
    (temp dir in the same parent, then ``os.replace``).
    """
    root = cache_dir(cache)
    model_dir = root / "models" / "magika"
    if all((model_dir / f).is_file() for f in MAGIKA_FILES):
        return model_dir
    wheel = fetch_wheel("magika", MAGIKA_VERSION, root)
    model_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".magika-", dir=model_dir.parent))
    os.chmod(tmp, 0o755)  # mkdtemp makes it 0700
    try:
        with zipfile.ZipFile(wheel) as zf:
            for fname, member in _model_members(zf).items():
                with zf.open(member) as src, open(tmp / fname, "wb") as dst:
                    shutil.copyfileobj(src, dst)
            meta = f"magika/models/{MAGIKA_MODEL}/metadata.json"
            if meta in zf.namelist():
                (tmp / "metadata.json").write_bytes(zf.read(meta))
        (tmp / "SOURCE").write_text(f"{wheel.name}\n")
        if model_dir.exists():  # stale/partial dir from an older layout
            shutil.rmtree(model_dir)
        os.replace(tmp, model_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return model_dir


def magika_paths(cache: str | os.PathLike | None = None) -> tuple[Path, Path]:
    """(model.onnx, config.min.json) paths, fetching if needed."""
    d = fetch_magika(cache)
    return d / "model.onnx", d / "config.min.json"


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache-dir", default=None, help="cache root (default: $QUANTSIM_CACHE_DIR or ~/.cache/quantsim)")
    args = ap.parse_args(argv)
    model, config = magika_paths(args.cache_dir)
    print(f"cache:  {cache_dir(args.cache_dir)}")
    print(f"model:  {model} ({model.stat().st_size} bytes)")
    print(f"config: {config}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
