#!/usr/bin/env python3
"""Reference check: `remat train --save FILE --format nanogpt` computes nanoGPT's logits.

Trains a small tied-embedding model (nanoGPT always ties lm_head to wte), saves it with nanoGPT's
names, loads the file into nanoGPT's GPT and compares its logits with remat's
(remat_reference_logits) to 1e-4. It does so for a float32 run and for a mixed-precision run
(--dtype bf16) saved as float32 and as bf16 (--save-dtype bf16; remat_run.VARIANTS), and checks
that the bf16 file holds the float32 file's weights rounded once.

nanoGPT's model.py is not vendored here (nor available offline in general):
  --model-py PATH  imports GPT and GPTConfig from PATH, nanoGPT's own model.py (Karpathy's
                   nanoGPT repository); the check then runs the real thing;
  without it       the check uses `restated_forward` below, a re-statement of nanoGPT's GPT
                   forward written for this check from its documented architecture (GPT-2's:
                   learned position embeddings, pre-LayerNorm blocks with bias and eps 1e-5,
                   fused q|k|v Linear, causal softmax attention scaled by 1/sqrt(head size),
                   4x MLP with the exact GELU, final LayerNorm, lm_head tied to wte). It is
                   not nanoGPT's code; the output says which of the two ran.

Not run by CI: it needs torch, safetensors and numpy (pip install torch safetensors numpy).

  cmake --build build --target remat remat_reference_logits
  python3 tests/reference/check_nanogpt.py [--build build] [--model-py /path/to/nanoGPT/model.py]
Exit status 0 when the comparison passes.
"""

import argparse
import importlib.util
import math
import os
import sys
import tempfile

import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import load_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import remat_run  # noqa: E402


def restated_forward(sd, layers, heads, ids):
    """nanoGPT's GPT forward over its state dict (see the header), all positions' logits."""
    idx = torch.tensor([ids])
    t = idx.shape[1]
    x = sd["transformer.wte.weight"][idx] + sd["transformer.wpe.weight"][:t]
    width = x.shape[-1]
    head = width // heads

    def norm(v, name):
        return F.layer_norm(v, (width,), sd[name + ".weight"], sd[name + ".bias"], 1e-5)

    def linear(v, name):
        return v @ sd[name + ".weight"].T + sd[name + ".bias"]

    mask = torch.ones(t, t, dtype=torch.bool).tril()
    for n in range(layers):
        p = f"transformer.h.{n}."
        q, k, v = linear(norm(x, p + "ln_1"), p + "attn.c_attn").split(width, dim=-1)
        q, k, v = (z.view(1, t, heads, head).transpose(1, 2) for z in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(head)
        y = scores.masked_fill(~mask, float("-inf")).softmax(-1) @ v
        x = x + linear(y.transpose(1, 2).reshape(1, t, width), p + "attn.c_proj")
        x = x + linear(F.gelu(linear(norm(x, p + "ln_2"), p + "mlp.c_fc")), p + "mlp.c_proj")
    return (norm(x, "transformer.ln_f") @ sd["transformer.wte.weight"].T)[0]


def nanogpt_forward(model_py, sd, meta, ids):
    """The logits of nanoGPT's own GPT (imported from model_py) with the file's weights."""
    spec = importlib.util.spec_from_file_location("nanogpt_model", model_py)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.GPTConfig(block_size=int(meta["seq"]), vocab_size=sd["transformer.wte.weight"].shape[0],
                              n_layer=int(meta["layers"]), n_head=int(meta["heads"]), n_embd=int(meta["width"]),
                              dropout=0.0, bias=True)
    model = module.GPT(config)
    missing, unexpected = model.load_state_dict(sd, strict=False)
    # lm_head.weight is wte's (tied); ".attn.bias" is the causal mask of the non-flash path
    missing = [k for k in missing if k != "lm_head.weight" and not k.endswith(".attn.bias")]
    if missing or unexpected:
        raise SystemExit(f"nanoGPT: FAIL: missing {missing}, unexpected {unexpected}")
    model.eval()
    with torch.no_grad():
        logits, _ = model(torch.tensor([ids]), torch.tensor([ids]))  # with targets: every position's logits
    return logits[0]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default="build", help="the build directory (default: build)")
    parser.add_argument("--model-py", help="nanoGPT's model.py (else the re-statement in this script)")
    args = parser.parse_args()
    remat, logits_tool = remat_run.executables(args.build)
    print(f"torch {torch.__version__}; reference: " +
          (f"nanoGPT's model.py at {args.model_py}" if args.model_py else "restated_forward (this script's re-statement)"))
    ok = True
    with tempfile.TemporaryDirectory() as work:
        exported = {}
        for variant, extra in remat_run.VARIANTS:
            name = f"nanogpt ({variant})"
            path = os.path.join(work, variant.replace(" ", "_").replace(",", "") + ".safetensors")
            remat_run.train(remat, path, "nanogpt", ["--tie-embeddings", *extra])
            sd = load_file(path)
            exported[variant] = sd
            with safe_open(path, framework="pt") as f:
                meta = f.metadata()
            dtypes = sorted({str(t.dtype).replace("torch.", "") for t in sd.values()})
            print(f"{name}: {len(sd)} entries, {', '.join(dtypes)}")
            sd = {k: v.float() for k, v in sd.items()}  # bf16 widens exactly: both sides compute in float32
            layers, heads, seq = int(meta["layers"]), int(meta["heads"]), int(meta["seq"])
            ids = remat_run.token_ids(sd["transformer.wte.weight"].shape[0], seq)
            ours = remat_run.remat_logits(logits_tool, path, ids)
            with torch.no_grad():
                theirs = (nanogpt_forward(args.model_py, sd, meta, ids) if args.model_py
                          else restated_forward(sd, layers, heads, ids))
            ok = remat_run.compare(name, ours, theirs.double().numpy()) and ok
        ok = remat_run.same_as_rounded("nanogpt bf16 weights", exported["bf16 run, f32 weights"],
                                       exported["bf16 run, bf16 weights"]) and ok
    print("check_nanogpt: " + ("PASS" if ok else "FAIL"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
