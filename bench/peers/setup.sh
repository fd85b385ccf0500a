#!/usr/bin/env bash
# bench/peers/setup.sh - the Python side of the peer benchmarks: a virtual environment in
# bench/peers/.venv with torch, jax (CPU), numpy, safetensors and matplotlib. Idempotent: an
# environment that already imports everything is left alone.
#
# Only PyPI is reachable here, so torch comes from PyPI. Its x86_64 Linux wheel is the CUDA build
# and pulls the nvidia-* wheels (several GiB); the benchmarks never use them, but torch refuses to
# import without them, so they are installed too. The script checks the free disk first.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="$here/.venv"
py="$venv/bin/python"

need_gib=12
avail_kib=$(df -Pk "$here" | awk 'NR == 2 { print $4 }')
avail_gib=$((avail_kib / 1024 / 1024))

if [[ ! -x "$py" ]]; then
  echo "setup: creating $venv"
  python3 -m venv "$venv"
fi

if "$py" - <<'EOF' 2>/dev/null; then
import torch, jax, jaxlib, numpy, safetensors, matplotlib  # noqa: F401
EOF
  echo "setup: $venv is complete (torch $("$py" -c 'import torch; print(torch.__version__)'), jax $("$py" -c 'import jax; print(jax.__version__)'))"
  exit 0
fi

echo "setup: ${avail_gib} GiB free under $here"
"$py" -m pip install --quiet --upgrade pip
"$py" -m pip install --quiet numpy safetensors matplotlib "jax[cpu]"
if ! "$py" -c 'import torch' 2>/dev/null; then
  if ((avail_gib < need_gib)); then
    echo "setup: torch from PyPI (CUDA build with its nvidia-* wheels) needs about ${need_gib} GiB free; only ${avail_gib} GiB" >&2
    echo "setup: the PyTorch column will be missing" >&2
  else
    echo "setup: installing torch from PyPI (the CUDA build: several GiB of nvidia-* wheels; only its CPU side is used)"
    "$py" -m pip install --quiet torch || echo "setup: pip install torch failed; the PyTorch column will be missing" >&2
  fi
fi
"$py" - <<'EOF'
import importlib
for name in ["numpy", "safetensors", "matplotlib", "jax", "jaxlib", "torch"]:
    try:
        m = importlib.import_module(name)
        print(f"setup: {name} {getattr(m, '__version__', '?')}")
    except Exception as e:  # report, do not fail: run.py skips a missing system
        print(f"setup: {name} MISSING ({type(e).__name__}: {e})")
EOF
