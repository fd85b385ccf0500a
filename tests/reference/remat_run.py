"""What the reference checks share: running remat, reading its logits, comparing.

Not run by CI (the checks need torch and more from PyPI). The executables come from a build
directory (default ./build): `remat` and `remat_reference_logits`, the latter built only when
asked for: cmake --build build --target remat remat_reference_logits.
"""

import json
import os
import subprocess
import sys

import numpy as np
import torch

TOLERANCE = 1e-4  # the largest absolute difference of a logit allowed

# The exports each check loads: a float32 run, and a mixed-precision run (--dtype bf16: float32
# master weights, bf16 compute) saved as its float32 masters and as those rounded once to bf16
# (--save-dtype bf16). Every logit is computed in float32 on both sides, remat's and the
# reference's, from the same weight values (bf16 weights widen to float32 exactly), so the
# tolerance is TOLERANCE for each; a bf16 file's entries must also be the float32 file's rounded
# to nearest even by torch, bit for bit (the two runs are the same deterministic run).
VARIANTS = [
    ("f32 run", []),
    ("bf16 run, f32 weights", ["--dtype", "bf16"]),
    ("bf16 run, bf16 weights", ["--dtype", "bf16", "--save-dtype", "bf16"]),
]


def executables(build):
    remat = os.path.join(build, "remat")
    logits = os.path.join(build, "tests", "reference", "remat_reference_logits")
    for path in (remat, logits):
        if not os.access(path, os.X_OK):
            sys.exit(f"{path} is missing: cmake --build {build} --target remat remat_reference_logits")
    return remat, logits


def train(remat, save, fmt, extra=()):
    """A small model trained long enough that its weights are no longer near their initialisation."""
    command = [remat, "train", "--steps", "150", "--layers", "2", "--width", "32", "--heads", "4", "--seq", "32",
               "--batch", "8", "--lr", "0.01", "--seed", "7", "--quiet", "--save", save, "--format", fmt, *extra]
    subprocess.run(command, check=True)


def same_as_rounded(name, f32_tensors, bf16_tensors):
    """Whether every entry of a --save-dtype bf16 export is the float32 export's entry rounded to bf16."""
    bad = [k for k in f32_tensors if bf16_tensors[k].dtype != torch.bfloat16 or
           not torch.equal(f32_tensors[k].to(torch.bfloat16), bf16_tensors[k])]
    if sorted(f32_tensors) != sorted(bf16_tensors) or bad:
        print(f"{name}: FAIL: the bf16 entries are not the float32 entries rounded once: {bad or 'names differ'}")
        return False
    print(f"{name}: ok: {len(bf16_tensors)} BF16 entries, each the float32 export's entry rounded to nearest even")
    return True


def remat_logits(logits_tool, weights, ids):
    out = subprocess.run([logits_tool, weights, *map(str, ids)], check=True, capture_output=True, text=True).stdout
    return np.array(json.loads(out)["logits"], dtype=np.float64)


def compare(name, ours, theirs):
    """Prints the largest difference; returns whether it is within TOLERANCE."""
    if ours.shape != theirs.shape:
        print(f"{name}: FAIL: shapes differ, remat {ours.shape} and reference {theirs.shape}")
        return False
    diff = float(np.max(np.abs(ours - theirs)))
    ok = diff <= TOLERANCE
    print(f"{name}: {'ok' if ok else 'FAIL'}: logits {ours.shape[0]}x{ours.shape[1]}, "
          f"largest difference {diff:.3g} (tolerance {TOLERANCE:g}), largest |logit| {np.max(np.abs(ours)):.3g}")
    return ok


def token_ids(vocab, count, seed=0):
    return [int(i) for i in np.random.default_rng(seed).integers(0, vocab, size=count)]
