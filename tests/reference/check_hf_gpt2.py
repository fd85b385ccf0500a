#!/usr/bin/env python3
"""Reference check: `remat train --save DIR --format hf-gpt2` is loaded by Transformers.

Trains two small models (untied and tied embeddings), saves each as a --format hf-gpt2 directory,
loads it with transformers.GPT2LMHeadModel.from_pretrained (every tensor used, none missing or
left over), runs the same token ids through it and through remat (remat_reference_logits, which
reads the directory as `remat train --load DIR` does) and compares the logits to 1e-4, for a
float32 run and a mixed-precision run (--dtype bf16) saved as float32 and as bf16 (--save-dtype
bf16; remat_run.VARIANTS: both sides compute in float32, bf16 weights widened exactly); then the
way back: the directory Transformers' save_pretrained writes (no remat metadata) read by remat,
its logits compared with Transformers' to 1e-4 as well. As a control, the same directory with
config.json's GELU swapped for the tanh form ("gelu_new") must give logits further than the
tolerance from remat's: the comparison can fail.

Not run by CI: it needs torch, transformers, safetensors and numpy (pip install torch
transformers safetensors numpy).

  cmake --build build --target remat remat_reference_logits
  python3 tests/reference/check_hf_gpt2.py [--build build]
Exit status 0 when every comparison passes.
"""

import argparse
import json
import os
import shutil
import sys
import tempfile

import numpy as np
import torch
import transformers
from safetensors.torch import load_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import remat_run  # noqa: E402


def load_float32(directory, **kwargs):
    """GPT2LMHeadModel in float32 whatever the file's dtype (a bf16 file widens exactly), as remat computes."""
    return transformers.GPT2LMHeadModel.from_pretrained(directory, dtype=torch.float32, **kwargs)


def transformers_logits(directory, ids):
    model, info = load_float32(directory, output_loading_info=True)
    problems = {k: v for k, v in info.items() if v}
    model.eval()
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].double().numpy()
    return logits, problems, model.config


def check(remat, logits_tool, work, tied, variant, extra):
    name = "hf-gpt2 " + ("tied" if tied else "untied") + f" embeddings ({variant})"
    directory = os.path.join(work, ("tied" if tied else "untied") + "-" + variant.replace(" ", "_").replace(",", ""))
    remat_run.train(remat, directory, "hf-gpt2", (["--tie-embeddings"] if tied else []) + extra)
    entries = load_file(os.path.join(directory, "model.safetensors"))
    dtypes = sorted({str(t.dtype).replace("torch.", "") for t in entries.values()})
    print(f"{name}: {directory}: {sorted(os.listdir(directory))}, entries {', '.join(dtypes)}")
    config = json.load(open(os.path.join(directory, "config.json")))
    ids = remat_run.token_ids(config["vocab_size"], config["n_positions"])
    ours = remat_run.remat_logits(logits_tool, directory, ids)
    theirs, problems, hf_config = transformers_logits(directory, ids)
    ok = not problems
    if problems:
        print(f"{name}: FAIL: Transformers reports {problems}")
    print(f"{name}: config: activation {hf_config.activation_function}, eps {hf_config.layer_norm_epsilon}, "
          f"tie_word_embeddings {hf_config.tie_word_embeddings}, n_layer {hf_config.n_layer}, n_head {hf_config.n_head}")
    ok = remat_run.compare(name, ours, theirs) and ok

    # back: what Transformers saves (save_pretrained: no remat metadata) is read by remat, its
    # heads and GELU from config.json
    resaved = directory + "-resaved"
    load_float32(directory).save_pretrained(resaved)
    ok = remat_run.compare(name + ", saved by Transformers, read by remat",
                           remat_run.remat_logits(logits_tool, resaved, ids), theirs) and ok

    # control: the tanh GELU must be measurably further from remat's logits
    control = directory + "-gelu_new"
    shutil.copytree(directory, control)
    config["activation_function"] = "gelu_new"
    json.dump(config, open(os.path.join(control, "config.json"), "w"))
    tanh_logits, _, _ = transformers_logits(control, ids)
    exact = float(np.max(np.abs(ours - theirs)))
    tanh = float(np.max(np.abs(ours - tanh_logits)))
    print(f"{name}: control: with \"gelu_new\" the largest difference is {tanh:.3g} (with \"gelu\" {exact:.3g})")
    if not tanh > remat_run.TOLERANCE:
        print(f"{name}: FAIL: the control does not tell the two GELUs apart at the tolerance")
        ok = False
    return ok, entries


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default="build", help="the build directory (default: build)")
    args = parser.parse_args()
    remat, logits_tool = remat_run.executables(args.build)
    print(f"torch {torch.__version__}, transformers {transformers.__version__}")
    with tempfile.TemporaryDirectory() as work:
        ok = True
        for tied in (False, True):
            exported = {}
            for variant, extra in remat_run.VARIANTS:
                passed, exported[variant] = check(remat, logits_tool, work, tied, variant, extra)
                ok = passed and ok
            ok = remat_run.same_as_rounded("hf-gpt2 " + ("tied" if tied else "untied") + " bf16 weights",
                                           exported["bf16 run, f32 weights"], exported["bf16 run, bf16 weights"]) and ok
    print("check_hf_gpt2: " + ("PASS" if ok else "FAIL"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
