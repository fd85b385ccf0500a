"""PyTorch's step at one GPT shape, float32 or bf16 autocast, for bench/run_width.py.

  python torch_width.py --dtype f32|bf16 [--layers 6 --width 384 --heads 6 --seq 256 --batch 4]
                        [--vocab 114] [--threads 2] [--steps 5] [--warmup 2]

The model is torch_runner.py's GPT (remat::nn::GPT's structure: pre-norm blocks, nanoGPT's
attention through scaled_dot_product_attention, exact GELU) with PyTorch's own initialisation; a
step is zero_grad, forward, mean cross entropy, backward and AdamW (as `remat train`), on one fixed
batch of random token ids. bf16 is torch.autocast("cpu", dtype=torch.bfloat16) around forward and
loss (float32 master weights and optimizer state, as `remat train --dtype bf16`). Prints one JSON
line: the median step time of --steps steps after --warmup."""
import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F

from torch_runner import build


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", choices=["f32", "bf16"], required=True)
    for name, default in [("layers", 6), ("width", 384), ("heads", 6), ("seq", 256), ("batch", 4), ("vocab", 114),
                          ("threads", 2), ("steps", 5), ("warmup", 2)]:
        ap.add_argument(f"--{name}", type=int, default=default)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    spec = dict(kind="gpt", vocab=a.vocab, layers=a.layers, width=a.width, heads=a.heads, seq=a.seq)
    model = build(torch, spec)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, a.vocab, (a.batch, a.seq))
    targets = torch.randint(0, a.vocab, (a.batch, a.seq))
    positions = torch.arange(a.seq)

    def loss_fn():
        h = model.wte(ids) + model.wpe(positions)
        logits = model.lm_head(model.ln_f(model.blocks(h)))
        return F.cross_entropy(logits.float().reshape(-1, a.vocab), targets.reshape(-1))

    times = []
    for i in range(a.warmup + a.steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        if a.dtype == "bf16":
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = loss_fn()
        else:
            loss = loss_fn()
        loss.backward()
        opt.step()
        if i >= a.warmup:
            times.append(time.perf_counter() - t0)
    print(json.dumps({"system": "pytorch", "dtype": a.dtype, "torch": torch.__version__,
                      "step_seconds_median": statistics.median(times), "step_seconds": times,
                      "loss": loss.item(), "isa": torch.backends.cpu.get_cpu_capability()}))


if __name__ == "__main__":
    main()
