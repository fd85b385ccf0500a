#!/usr/bin/env python3
"""Writes scripts/cuda-check's report, bench/results/cuda-DATE.md, from the outputs of its stages.

  scripts/cuda-report.py WORK REPORT COMMIT SECONDS STAGE_ROW...

WORK holds one NAME.out per stage (bench_cuda_gpt's and torch_gpt_cuda.py's JSON lines among the
text) and torch.jsonl (PyTorch's lines). Kernels are put into the issue's categories by name
(CATEGORIES below, first match wins), for remat's kernel profile and PyTorch's torch.profiler alike.
"""

import json
import re
import sys

CATEGORIES = [
    ("attention", r"attention|fmha|flash|efficient_attention|AttentionKernel|sdpa"),
    ("loss", r"cross_entropy|nll_loss|SoftMax|log_softmax"),
    ("GEMM", r"gemm|GEMM|cutlass|cublas|xmma|Kernel2|splitK|dot_kernel"),
    ("norms", r"layer_norm|LayerNorm|GammaBeta|rms_norm|norm backward|batch_norm"),
    ("optimizer", r"sgd|adam|Adam|multi_tensor|foreach"),
    ("reductions", r"reduce|column_partials|combine_partials|bias gradient"),
    ("copies and gathers", r"copy|Memcpy|Memset|fill|Fill|arange|iota|index|Index|embedding|Embedding|radix|Radix|"
                           r"sort|scan|gather|deferred|id check|CatArray|compute_grad_weight|sum_and_scatter"),
    ("elementwise", r".*"),
]


def category(name):
    for label, pattern in CATEGORIES:
        if re.search(pattern, name):
            return label
    return "elementwise"


def lines(path):
    try:
        return [json.loads(l) for l in open(path) if l.startswith("{")]
    except (OSError, ValueError):
        return []


def mib(b):
    return f"{b / 2**20:.1f} MiB"


def ms(s):
    return f"{s * 1e3:.1f} ms"


def median(v):
    v = sorted(v)
    return v[len(v) // 2] if v else 0


def per_step(values):
    return f"{median(values):.0f}" if values else "-"


def ratio_row(label, value, target):
    return f"| {label} | {value} | {target} |"


def steps_table(remat, torch_runs, torch_profiles):
    out = ["| system | policy | median step | peak saved | peak total | fallback calls | launches / step | "
           "host syncs / step |", "|---|---|---|---|---|---|---|---|"]
    for r in remat.values():
        out.append(f"| remat | {r['policy']} | {ms(r['median_seconds'])} | {mib(r['peak_saved_bytes'])} | "
                   f"{mib(r['peak_total_bytes'])} | {r['fallback_calls']} | {per_step(r.get('launches', []))} | "
                   f"{per_step(r.get('synchronizations', []))} |")
    for r in torch_runs.values():
        p = torch_profiles.get(r["policy"], {})
        launches = f"{p['launches_per_step']:.0f}" if p else "-"
        syncs = f"{p['synchronizations_per_step']:.0f}" if p else "-"
        out.append(f"| PyTorch {r.get('version', '')} | {r['policy']} | {ms(r['median_seconds'])} | - | "
                   f"{mib(r['peak_total_bytes'])} | - | {launches} | {syncs} |")
    return out


def category_seconds(kernels):
    by = {}
    for k in kernels:
        by[category(k["name"])] = by.get(category(k["name"]), 0.0) + k["seconds"]
    return by


def profile_tables(title, kernels, top=15):
    total = sum(k["seconds"] for k in kernels) or 1.0
    by = category_seconds(kernels)
    out = [f"### {title}", "", f"Kernels' device time per step: {ms(total)}.", "",
           "| category | per step | share |", "|---|---:|---:|"]
    for label, _ in CATEGORIES:
        if label in by:
            out.append(f"| {label} | {ms(by[label])} | {100 * by[label] / total:.1f}% |")
    out += ["", "| kernel | category | launches / step | per step | share |", "|---|---|---:|---:|---:|"]
    for k in sorted(kernels, key=lambda k: -k["seconds"])[:top]:
        name = k["name"] if len(k["name"]) <= 90 else k["name"][:87] + "..."
        name = name.replace("|", "\\|")
        out.append(f"| `{name}` | {category(k['name'])} | {k['launches']:.0f} | {k['seconds'] * 1e3:.2f} ms | "
                   f"{100 * k['seconds'] / total:.1f}% |")
    return out + [""]


# Dense bf16 tensor-core peak by device name (NVIDIA's data sheets, SXM parts, no sparsity), for MFU.
PEAK_BF16_FLOPS = [("H200", 989e12), ("H100", 989e12), ("A100", 312e12)]


def model_flops(r):
    """Training FLOPs of one step (forward and backward) as llm.c counts them: 6 per parameter and
    token, and 12 x layers x width x context per token for attention's two products."""
    tokens = r["batch"] * r["seq"]
    return tokens * (6 * r["parameters"] + 12 * r["layers"] * r["width"] * r["seq"])


def mfu(r, device):
    peak = next((f for name, f in PEAK_BF16_FLOPS if name in device), None)
    if peak is None or "parameters" not in r:
        return "-"
    return f"{model_flops(r) / r['median_seconds'] / peak:.3f}"


def bf16_section(work):
    out = ["## bf16 mixed precision (REMAT_CUDA_FAST=bf16)", "",
           "GPT-2 small, float32 master weights and AdamW state, bf16 compute: remat --dtype bf16 against PyTorch "
           "eager under torch.autocast(bfloat16) with its fused SDPA, measured in this run (3 steps after 2 of "
           "warm-up; median). MFU: llm.c's count of training FLOPs per step (6 x parameters x tokens + 12 x layers x "
           "width x context x tokens) over the step time and the device's dense bf16 peak.", "",
           "| batch x context | remat save-all | remat every-layer | PyTorch bf16 | save-all / PyTorch (<= 0.9) | "
           "every-layer / save-all (<= 1.15) | MFU save-all (>= 0.45 at batch 32) | peak saved, every-layer / "
           "save-all | fallback calls |", "|---|---|---|---|---|---|---|---|---|"]
    rows = 0
    for b in (8, 32):
        remat = {r["policy"]: r for r in lines(f"{work}/switch-bf16-gpt-b{b}.out") if r.get("kind") != "profile"}
        torch = [r for r in lines(f"{work}/switch-bf16-torch-b{b}.out") if "median_seconds" in r]
        sa, el, pt = remat.get("save-all"), remat.get("every-layer"), torch[0] if torch else None
        if not (sa or pt):
            continue
        rows += 1
        seq = (sa or pt)["seq"]

        def ratio(x, y):
            return f"{x['median_seconds'] / y['median_seconds']:.2f}" if x and y else "-"
        saved = f"{el['peak_saved_bytes'] / max(1, sa['peak_saved_bytes']):.3f}" if sa and el else "-"
        falls = sum(r["fallback_calls"] for r in remat.values()) if remat else "-"
        out.append(f"| {b} x {seq} | {ms(sa['median_seconds']) if sa else '-'} | "
                   f"{ms(el['median_seconds']) if el else '-'} | {ms(pt['median_seconds']) if pt else '-'} | "
                   f"{ratio(sa, pt)} | {ratio(el, sa)} | {mfu(sa, sa['description']) if sa else '-'} | {saved} | "
                   f"{falls} |")
    return out + [""] if rows else []


def stage_status(stages, name):
    for row in stages:
        cells = [c.strip() for c in row.strip("|").split("|")]
        if cells and cells[0] == name:
            return cells[1]
    return "not run"


def main():
    work, report, commit, seconds, stages = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:]
    remat = {r["policy"].split(":")[0]: r for r in lines(f"{work}/bench-remat.out") if r.get("kind") != "profile"}
    fast = {r["policy"].split(":")[0]: r for r in lines(f"{work}/switch-all-bench.out") if r.get("kind") != "profile"}
    torch_lines = lines(f"{work}/torch.jsonl")
    torch_runs = {r["policy"]: r for r in torch_lines if r.get("kind") != "profile" and "median_seconds" in r}
    torch_profiles = {r["policy"]: r for r in torch_lines if r.get("kind") == "profile"}
    remat_profiles = {r["policy"]: r for r in lines(f"{work}/bench-remat-profile.out") if r.get("kind") == "profile"}
    fast_profiles = {r["policy"]: r for r in lines(f"{work}/switch-all-profile.out") if r.get("kind") == "profile"}

    out = [f"# CUDA device check ({commit[:12]})", "", f"`scripts/cuda-check`, {seconds} s in all.", "",
           "## Stages", "", "Stages named switch-NAME-... run with REMAT_CUDA_FAST=NAME (docs/backends.md, "
           "\"Switches\"); their failures do not fail the check.", "",
           "| stage | status | time |", "|---|---|---|", *stages, ""]
    try:
        smi = open(f"{work}/nvidia-smi.out").read()
    except OSError:
        smi = "(nvidia-smi did not run)"
    out += ["## Device", "", "```", smi.strip()[:3000], "```", ""]

    out += ["## GPT-2 small, float32, TF32 off, AdamW", ""]
    if not remat:
        out += ["The benchmark did not run: see its stage above.", ""]
    else:
        any_r = next(iter(remat.values()))
        out += [f"{any_r['layers']} layers, width {any_r['width']}, {any_r['heads']} heads, context {any_r['seq']}, "
                f"batch {any_r['batch']}, vocabulary {any_r['vocab']}; {any_r.get('optimizer', 'sgd')} step; median of "
                "the measured steps. remat's bytes are its device counters (peak over a step of what the step "
                "allocated); PyTorch's are torch.cuda.max_memory_allocated over a step minus what was allocated "
                "before it. Launches and host synchronisations per step: remat's device counters "
                "(remat::device_activity; the loss read is the step's one wait) and PyTorch's torch.profiler "
                "(kernels launched; cuda*Synchronize calls).", "", "### Default path", ""]
        out += steps_table(remat, torch_runs, torch_profiles) + [""]
        if fast:
            out += ["### Every switch on (REMAT_CUDA_FAST=all)", ""]
            out += steps_table(fast, {}, {}) + [""]
        out += ["## Targets", "", "| ratio | default path | every switch on | target |", "|---|---|---|---|"]
        eager = torch_runs.get("none")

        def both(f):
            return tuple(f(r) if r else "-" for r in (remat, fast or None))

        def fmt(f):
            def g(runs):
                try:
                    return f(runs)
                except (KeyError, ZeroDivisionError, TypeError):
                    return "-"
            return g

        rows = [
            ("remat save-all / PyTorch eager, step time",
             fmt(lambda r: f"{r['save-all']['median_seconds'] / eager['median_seconds']:.2f}"), "<= 0.9 (stretch 0.8)"),
            ("every-layer / save-all, step time",
             fmt(lambda r: f"{r['every-layer']['median_seconds'] / r['save-all']['median_seconds']:.2f}"), "<= 1.15"),
            ("every-layer / save-all, peak saved",
             fmt(lambda r: f"{r['every-layer']['peak_saved_bytes'] / max(1, r['save-all']['peak_saved_bytes']):.3f}"),
             "<= 0.35"),
            ("remat every-layer / PyTorch eager, step time",
             fmt(lambda r: f"{r['every-layer']['median_seconds'] / eager['median_seconds']:.2f}"), "<= 1.0"),
            ("remat every-layer / PyTorch per-block, step time",
             fmt(lambda r: f"{r['every-layer']['median_seconds'] / torch_runs['per-block']['median_seconds']:.2f}"), ""),
            ("host synchronisations per step, save-all / every-layer",
             fmt(lambda r: f"{median(r['save-all']['synchronizations'])} / "
                           f"{median(r['every-layer']['synchronizations'])}"), "<= 1"),
            ("launches per step, remat save-all / PyTorch eager",
             fmt(lambda r: f"{median(r['save-all']['launches'])} / "
                           f"{torch_profiles['none']['launches_per_step']:.0f}"), "reported"),
            ("budget: peak saved / B",
             fmt(lambda r: f"{r['budget']['peak_saved_bytes'] / max(1, r['budget']['budget_bytes']):.3f}"), "<= 1.0"),
            ("fallback calls, all runs", fmt(lambda r: f"{sum(x['fallback_calls'] for x in r.values())}"), "0"),
        ]
        for label, f, target in rows:
            d, a = both(f)
            out.append(f"| {label} | {d} | {a} | {target} |")
        attention = []
        for profiles in (remat_profiles, fast_profiles):
            try:
                mine = category_seconds(profiles["save-all"]["kernels"]).get("attention", 0.0)
                theirs = category_seconds(torch_profiles["none"]["kernels"]).get("attention", 0.0)
                attention.append(f"{mine / theirs:.2f} ({ms(mine)} / {ms(theirs)})")
            except (KeyError, ZeroDivisionError):
                attention.append("-")
        out.append(f"| attention forward + backward / PyTorch's SDPA kernels, per step | {attention[0]} | "
                   f"{attention[1]} | <= 1.0 |")
        out.append("")

    switch_names = sorted({m.group(1) for row in stages
                           for m in [re.match(r"\| switch-(.+?)-(ops|policies|bench) \|", row)] if m})
    if switch_names:
        base = remat.get("save-all")
        out += ["## Switches", "", "Each switch alone (and all together): the op rows against float64 on cuda:0, every "
                "policy bitwise against save-all (test_cuda; the production-shape test with all switches only), and "
                "save-all's step against the default path's (3 steps; the first step's loss against the default's).",
                "", "| switch | op rows | policies | save-all step | / default | first loss - default's |",
                "|---|---|---|---|---|---|"]
        for s in switch_names:
            runs = {r["policy"]: r for r in lines(f"{work}/switch-{s}-bench.out") if r.get("kind") != "profile"}
            r = runs.get("save-all")
            step = ms(r["median_seconds"]) if r else "-"
            rel = f"{r['median_seconds'] / base['median_seconds']:.3f}" if r and base else "-"
            loss = f"{r['losses'][0] - base['losses'][0]:.2e}" if r and base and r["losses"] and base["losses"] else "-"
            out.append(f"| {s} | {stage_status(stages, f'switch-{s}-ops')} | "
                       f"{stage_status(stages, f'switch-{s}-policies')} | {step} | {rel} | {loss} |")
        out.append("")

    out += bf16_section(work)

    if remat_profiles or torch_profiles:
        out += ["## Where the step goes", "",
                "Device time per kernel, one profiled step after the measured ones (remat: REMAT_CUDA_PROFILE=1, "
                "an event pair per launch; PyTorch: torch.profiler, mean of its profiled steps). Categories by kernel "
                "name (scripts/cuda-report.py).", ""]
        for policy in ("save-all", "every-layer"):
            if policy in remat_profiles:
                out += profile_tables(f"remat {policy}, default path", remat_profiles[policy]["kernels"])
            if policy in fast_profiles:
                out += profile_tables(f"remat {policy}, every switch on", fast_profiles[policy]["kernels"])
        for policy in ("none", "per-block"):
            if policy in torch_profiles:
                out += profile_tables(f"PyTorch {policy}", torch_profiles[policy]["kernels"])

    for name, title in (("train-smoke", "remat train --device cuda"),
                        ("switch-all-train-smoke", "remat train --device cuda, every switch on")):
        smoke = lines(f"{work}/{name}.out")
        if smoke:
            out += ["", f"## {title}", "", "```", json.dumps(smoke[-1])[:2000], "```"]
    open(report, "w").write("\n".join(out) + "\n")
    print(f"cuda-check: wrote {report}")


if __name__ == "__main__":
    main()
