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

TOLERANCE = 1e-4  # the largest absolute difference of a logit allowed


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
