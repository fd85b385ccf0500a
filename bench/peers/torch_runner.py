"""One PyTorch (eager, CPU) configuration of the peer benchmarks, in its own process.

  python torch_runner.py --model mlp|gpt|gpt-large|resnet|resnet-110
                         --policy none|per-block|per-stage|sequential|selective
                         --init FILE [--steps 5] [--warmup 2] [--threads 2] [--lr 1e-4]

FILE is written by remat_runner --save-init: the parameters under the same module names as
remat's (Linear weight [out, in], as in PyTorch) and the inputs. The models mirror remat's
exactly: the tanh MLP (layers.i.fc), remat::nn::GPT (pre-norm blocks, causal attention, exact
GELU, mean cross entropy) and remat::nn::ResNet (pre-activation CIFAR ResNet: layers.0 the stem,
layers.1..B the blocks, Residual(PreActBody) or DownsampleBlock, layers.B+1 the head; batch norm in
training mode, mean cross entropy). Attention is nanoGPT's:
torch.nn.functional.scaled_dot_product_attention with is_causal=True (PyTorch's fused CPU kernel;
remat's nn attention is fused too); --attention explicit writes it out (scores, -inf mask, softmax).

Policies:
  none        no checkpointing
  per-block   torch.utils.checkpoint.checkpoint(block, use_reentrant=False) around every block
  sequential  torch.utils.checkpoint.checkpoint_sequential(blocks, round(sqrt(N)) segments)
  selective   per-block checkpoint with create_selective_checkpoint_contexts: MUST_SAVE the
              outputs of aten.mm / aten.addmm / aten.bmm, PREFER_RECOMPUTE the rest
  per-stage   (ResNets) checkpoint(use_reentrant=False) around each residual stage (the blocks
              of one image size); the stem and the head run without checkpointing
Under checkpoint, PyTorch re-runs the batch norms in training mode, so their running statistics
are updated twice per step; the JSON line reports num_batches_tracked of the first block's
first batch norm (bn_batches_tracked) to show it.

A step: zero_grad (set_to_none), forward, loss, backward, SGD update (no momentum).
"""

import argparse
import functools
import math
import time

from common import MODELS, MemoryProbe, emit, fail, split_inputs


def build(torch, spec, attention="sdpa"):
    nn = torch.nn
    F = torch.nn.functional

    class TanhLayer(nn.Module):
        def __init__(self, width):
            super().__init__()
            self.fc = nn.Linear(width, width)

        def forward(self, x):
            return torch.tanh(self.fc(x))

    class TanhMLP(nn.Module):
        def __init__(self, depth, width):
            super().__init__()
            self.layers = nn.Sequential(*[TanhLayer(width) for _ in range(depth)])

    class CausalSelfAttention(nn.Module):
        def __init__(self, width, heads, seq):
            super().__init__()
            self.qkv = nn.Linear(width, 3 * width)
            self.proj = nn.Linear(width, width)
            self.heads = heads
            self.register_buffer("mask", torch.ones(seq, seq, dtype=torch.bool).triu(1), persistent=False)

        def forward(self, x):
            b, t, c = x.shape
            h, d = self.heads, c // self.heads
            q, k, v = self.qkv(x).split(c, dim=-1)
            q, k, v = (z.reshape(b, t, h, d).permute(0, 2, 1, 3) for z in (q, k, v))
            if attention == "sdpa":  # nanoGPT's model.py
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                return self.proj(y.permute(0, 2, 1, 3).reshape(b, t, c))
            scores = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(d))
            scores = scores.masked_fill(self.mask[:t, :t], float("-inf"))
            att = torch.softmax(scores, dim=-1)
            y = torch.matmul(att, v).permute(0, 2, 1, 3).reshape(b, t, c)
            return self.proj(y)

    class MLP(nn.Module):
        def __init__(self, width):
            super().__init__()
            self.fc = nn.Linear(width, 4 * width)
            self.proj = nn.Linear(4 * width, width)

        def forward(self, x):
            return self.proj(F.gelu(self.fc(x)))

    class Block(nn.Module):
        def __init__(self, width, heads, seq):
            super().__init__()
            self.ln1 = nn.LayerNorm(width, eps=1e-5)
            self.attn = CausalSelfAttention(width, heads, seq)
            self.ln2 = nn.LayerNorm(width, eps=1e-5)
            self.mlp = MLP(width)

        def forward(self, x):
            h = x + self.attn(self.ln1(x))
            return h + self.mlp(self.ln2(h))

    class GPT(nn.Module):
        def __init__(self, vocab, layers, width, heads, seq):
            super().__init__()
            self.wte = nn.Embedding(vocab, width)
            self.wpe = nn.Embedding(seq, width)
            self.blocks = nn.Sequential(*[Block(width, heads, seq) for _ in range(layers)])
            self.ln_f = nn.LayerNorm(width, eps=1e-5)
            self.lm_head = nn.Linear(width, vocab, bias=False)

    def conv3(cin, cout, stride=1):
        return nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)

    class PreActBody(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.bn1, self.conv1 = nn.BatchNorm2d(c), conv3(c, c)
            self.bn2, self.conv2 = nn.BatchNorm2d(c), conv3(c, c)

        def forward(self, x):
            return self.conv2(F.relu(self.bn2(self.conv1(F.relu(self.bn1(x))))))

    class Residual(nn.Module):
        def __init__(self, fn):
            super().__init__()
            self.fn = fn

        def forward(self, x):
            return x + self.fn(x)

    class DownsampleBlock(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.bn1, self.conv1 = nn.BatchNorm2d(cin), conv3(cin, cout, stride)
            self.bn2, self.conv2 = nn.BatchNorm2d(cout), conv3(cout, cout)
            self.shortcut = nn.Conv2d(cin, cout, 1, stride=stride, bias=False)

        def forward(self, x):
            a = F.relu(self.bn1(x))
            return self.conv2(F.relu(self.bn2(self.conv1(a)))) + self.shortcut(a)

    class Head(nn.Module):
        def __init__(self, c, classes):
            super().__init__()
            self.bn, self.fc = nn.BatchNorm2d(c), nn.Linear(c, classes)

        def forward(self, x):
            return self.fc(F.adaptive_avg_pool2d(F.relu(self.bn(x)), 1).flatten(1))

    class ResNet(nn.Module):
        def __init__(self, stages, blocks, width, classes):
            super().__init__()
            layers, c = [nn.Conv2d(3, width, 3, padding=1, bias=False)], width
            self.stage_of_block = []
            for s in range(stages):
                out = width << s
                for b in range(blocks):
                    layers.append(DownsampleBlock(c, out, 2) if s > 0 and b == 0 else Residual(PreActBody(out)))
                    self.stage_of_block.append(s)
                    c = out
            layers.append(Head(c, classes))
            self.layers = nn.Sequential(*layers)

    if spec["kind"] == "mlp":
        return TanhMLP(spec["depth"], spec["width"])
    if spec["kind"] == "resnet":
        return ResNet(spec["stages"], spec["blocks"], spec["width"], spec["classes"])
    return GPT(spec["vocab"], spec["layers"], spec["width"], spec["heads"], spec["seq"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True, choices=sorted(MODELS))
    ap.add_argument("--policy", required=True, choices=["none", "per-block", "per-stage", "sequential", "selective"])
    ap.add_argument("--init", required=True)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--attention", choices=["sdpa", "explicit"], default="sdpa")
    a = ap.parse_args()
    try:
        import torch
        import torch.nn.functional as F
        from safetensors.torch import load_file
        from torch.utils.checkpoint import checkpoint, checkpoint_sequential
    except Exception as e:  # noqa: BLE001
        fail("pytorch", a.model, a.policy, f"import: {e}")

    torch.set_num_threads(a.threads)
    spec = MODELS[a.model]
    model = build(torch, spec, a.attention)
    tensors = load_file(a.init)
    params, inputs = split_inputs(tensors)
    if spec["kind"] == "resnet":
        # the file holds remat's parameters; the batch-norm buffers keep PyTorch's defaults
        # (running mean 0, variance 1, count 0), which are remat's initial running statistics
        missing, unexpected = model.load_state_dict(params, strict=False)
        buffers = ("running_mean", "running_var", "num_batches_tracked")
        if unexpected or any(not k.endswith(buffers) for k in missing):
            fail("pytorch", a.model, a.policy, f"state dict mismatch: missing {missing}, unexpected {unexpected}")
    else:
        model.load_state_dict(params, strict=True)
    del tensors, params
    model.train()
    if spec["kind"] == "mlp":
        blocks = list(model.layers)
    elif spec["kind"] == "resnet":
        blocks = list(model.layers)[1:-1]
    else:
        blocks = list(model.blocks)
    n = len(blocks)
    if a.policy == "per-stage" and spec["kind"] != "resnet":
        fail("pytorch", a.model, a.policy, "per-stage is for the ResNets")

    selective_ctx = None
    if a.policy == "selective":
        from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

        saved = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default}

        def policy_fn(ctx, op, *args, **kwargs):
            return CheckpointPolicy.MUST_SAVE if op in saved else CheckpointPolicy.PREFER_RECOMPUTE

        selective_ctx = functools.partial(create_selective_checkpoint_contexts, policy_fn)

    def run_blocks(h):
        if a.policy == "none":
            for blk in blocks:
                h = blk(h)
        elif a.policy == "per-block":
            for blk in blocks:
                h = checkpoint(blk, h, use_reentrant=False)
        elif a.policy == "selective":
            for blk in blocks:
                h = checkpoint(blk, h, use_reentrant=False, context_fn=selective_ctx)
        elif a.policy == "per-stage":
            for s in sorted(set(model.stage_of_block)):
                stage = [blk for blk, t in zip(blocks, model.stage_of_block) if t == s]

                def run_stage(h, stage=stage):
                    for blk in stage:
                        h = blk(h)
                    return h

                h = checkpoint(run_stage, h, use_reentrant=False)
        else:  # sequential
            segments = max(1, round(math.sqrt(n)))
            h = checkpoint_sequential(torch.nn.Sequential(*blocks), segments, h, use_reentrant=False)
        return h

    if spec["kind"] == "mlp":
        x = inputs["x"]

        def loss_fn():
            return run_blocks(x).square().mean()
    elif spec["kind"] == "resnet":
        x, labels = inputs["x"], inputs["labels"]
        stem, head = model.layers[0], model.layers[-1]

        def loss_fn():
            return F.cross_entropy(head(run_blocks(stem(x))), labels)
    else:
        ids, targets = inputs["ids"], inputs["targets"]
        positions = torch.arange(ids.shape[1])

        def loss_fn():
            h = model.wte(ids) + model.wpe(positions)
            h = run_blocks(h)
            logits = model.lm_head(model.ln_f(h))
            return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

    opt = torch.optim.SGD(model.parameters(), lr=a.lr)

    probe = MemoryProbe()
    times, cpu_times, losses = [], [], []
    for step in range(a.warmup + a.steps):
        t0, c0 = time.perf_counter(), time.process_time()
        opt.zero_grad(set_to_none=True)
        loss = loss_fn()
        loss.backward()
        opt.step()
        dt, dc = time.perf_counter() - t0, time.process_time() - c0
        losses.append(loss.item())
        if step >= a.warmup:
            times.append(dt)
            cpu_times.append(dc)
    emit({
        "system": "pytorch", "model": a.model, "policy": a.policy, "threads": torch.get_num_threads(),
        "steps": a.steps, "warmup": a.warmup, "step_seconds": times, "step_cpu_seconds": cpu_times, "losses": losses,
        "first_loss": losses[0], "rss_peak_growth_bytes": probe.growth_bytes(),
        "rss_base_bytes": probe.rss_base_kib * 1024, "hwm_reset": probe.hwm_reset,
        "segments": max(1, round(math.sqrt(n))) if a.policy == "sequential" else None,
        "version": torch.__version__, "attention": a.attention,
        **({"bn_batches_tracked": int(model.layers[1].fn.bn1.num_batches_tracked.item()),
            "bn_batches_tracked_per_step": model.layers[1].fn.bn1.num_batches_tracked.item() / (a.warmup + a.steps)}
           if spec["kind"] == "resnet" else {}),
    })


if __name__ == "__main__":
    main()
