#!/usr/bin/env python3
"""Writes scripts/cuda-check's report, bench/results/cuda-DATE.md, from the outputs of its stages.

  scripts/cuda-report.py WORK REPORT COMMIT SECONDS BUDGET STAGE_ROW...

WORK holds one NAME.out per stage (bench_cuda_gpt's and torch_gpt_cuda.py's JSON lines among the
text), torch.jsonl (PyTorch's lines) and candidates.jsonl (remat_candidates' outcomes, one a case).
Kernels are put into categories by name (CATEGORIES below, first match wins), for remat's kernel
profile and PyTorch's torch.profiler alike.
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
    remat = {r["policy"]: r for r in lines(f"{work}/bench-remat-bf16.out") if r.get("kind") != "profile"}
    torch = [r for r in lines(f"{work}/bench-torch-bf16.out") if "median_seconds" in r]
    sa, el, pt = remat.get("save-all"), remat.get("every-layer"), torch[0] if torch else None
    if not (sa or pt):
        return []

    def ratio(x, y):
        return f"{x['median_seconds'] / y['median_seconds']:.2f}" if x and y else "-"
    saved = f"{el['peak_saved_bytes'] / max(1, sa['peak_saved_bytes']):.3f}" if sa and el else "-"
    falls = sum(r["fallback_calls"] for r in remat.values()) if remat else "-"
    seq, batch = (sa or pt)["seq"], (sa or pt)["batch"]
    return ["## bf16 mixed precision (the backend option sixteen_bit, not yet device-checked)", "",
            "GPT-2 small, float32 master weights and AdamW state, bf16 compute: remat --dtype bf16 against PyTorch "
            "eager under torch.autocast(bfloat16) with its fused SDPA, measured in this run (3 steps after 2 of "
            "warm-up; median). MFU: llm.c's count of training FLOPs per step (6 x parameters x tokens + 12 x layers x "
            "width x context x tokens) over the step time and the device's dense bf16 peak.", "",
            "| batch x context | remat save-all | remat every-layer | PyTorch bf16 | save-all / PyTorch | "
            "every-layer / save-all | MFU save-all | peak saved, every-layer / save-all | fallback calls |",
            "|---|---|---|---|---|---|---|---|---|",
            f"| {batch} x {seq} | {ms(sa['median_seconds']) if sa else '-'} | "
            f"{ms(el['median_seconds']) if el else '-'} | {ms(pt['median_seconds']) if pt else '-'} | "
            f"{ratio(sa, pt)} | {ratio(el, sa)} | {mfu(sa, sa['description']) if sa else '-'} | {saved} | {falls} |",
            ""]


def candidates_section(work):
    outcomes = lines(f"{work}/candidates.jsonl")
    if not outcomes:
        return ["## Candidates", "", "The candidate harness did not run: see its stage above.", ""]
    names = list(dict.fromkeys(o["candidate"] for o in outcomes))
    out = ["## Candidates", "",
           "Each candidate kernel (candidates/cuda/) beside the library's kernel for its row: checked on every case "
           "(bitwise, or the tolerance remat_candidates states; and bitwise against itself on a second call), the "
           "timed cases timed on both sides (seconds per call, 10 calls between two waits after 2). Passed: every "
           "case passed or was declined, at least one passed: the candidate may be promoted (docs/backends.md).", "",
           "| candidate | cases passed | declined | failed or error | passed | speed-up (library / candidate) |",
           "|---|---|---|---|---|---|"]
    for n in names:
        mine = [o for o in outcomes if o["candidate"] == n]
        ok = sum(o["status"] == "passed" for o in mine)
        na = sum(o["status"] == "not applicable" for o in mine)
        bad = len(mine) - ok - na
        speed = ", ".join(f"{o['library_seconds'] / o['candidate_seconds']:.2f}x ({o['case'].split(':')[0]})"
                          for o in mine if o["timed"] and o["candidate_seconds"] > 0)
        out.append(f"| {n} | {ok} of {len(mine)} | {na} | {bad} | {'yes' if ok and not bad else 'no'} | "
                   f"{speed or '-'} |")
    out += ["", "| candidate | case | status | max abs diff | max rel diff | library | candidate | detail |",
            "|---|---|---|---|---|---|---|---|"]
    for o in outcomes:
        lib = f"{o['library_seconds'] * 1e3:.3f} ms" if o["timed"] else "-"
        cand = f"{o['candidate_seconds'] * 1e3:.3f} ms" if o["timed"] else "-"
        detail = o["detail"].replace("|", "\\|")[:160]
        out.append(f"| {o['candidate']} | {o['case']} | {o['status']} | {o['max_abs_diff']:.3g} | "
                   f"{o['max_rel_diff']:.3g} | {lib} | {cand} | {detail} |")
    return out + [""]


def stage_status(stages, name):
    for row in stages:
        cells = [c.strip() for c in row.strip("|").split("|")]
        if cells and cells[0] == name:
            return cells[1]
    return "not run"


def main():
    work, report, commit, seconds, budget, stages = (sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5],
                                                     sys.argv[6:])
    remat = {r["policy"].split(":")[0]: r for r in lines(f"{work}/bench-remat.out") if r.get("kind") != "profile"}
    options = {r["policy"].split(":")[0]: r for r in lines(f"{work}/options-bench.out") if r.get("kind") != "profile"}
    torch_lines = lines(f"{work}/torch.jsonl")
    torch_runs = {r["policy"]: r for r in torch_lines if r.get("kind") != "profile" and "median_seconds" in r}
    torch_profiles = {r["policy"]: r for r in torch_lines if r.get("kind") == "profile"}
    remat_profiles = {r["policy"]: r for r in lines(f"{work}/bench-remat-profile.out") if r.get("kind") == "profile"}

    out = [f"# CUDA device check ({commit[:12]})", "", f"`scripts/cuda-check`, {seconds} s in all (budget {budget} s).",
           "", "## Stages", "", "The default path's stages fail the check; the candidates', the options' and bf16's "
           "are findings (docs/backends.md, \"The device check\").", "",
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
                "(remat::device_activity) and PyTorch's torch.profiler (kernels launched; cuda*Synchronize calls).", "",
                "### Default path", ""]
        out += steps_table(remat, torch_runs, torch_profiles) + [""]
        if options:
            out += ["### Backend options async, stream_ordered_allocator, copy_stream", ""]
            out += steps_table(options, {}, {}) + [""]
        out += ["## Targets", "", "| ratio | default path | async, allocator, copy stream | target |", "|---|---|---|---|"]
        eager = torch_runs.get("none")

        def both(f):
            return tuple(f(r) if r else "-" for r in (remat, options or None))

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
        try:
            mine = category_seconds(remat_profiles["save-all"]["kernels"]).get("attention", 0.0)
            theirs = category_seconds(torch_profiles["none"]["kernels"]).get("attention", 0.0)
            attention = f"{mine / theirs:.2f} ({ms(mine)} / {ms(theirs)})"
        except (KeyError, ZeroDivisionError):
            attention = "-"
        out.append(f"| attention forward + backward / PyTorch's SDPA kernels, per step | {attention} | - | <= 1.0 |")
        out.append("")

    out += bf16_section(work)
    out += candidates_section(work)
    out += ["## Backend options", "", "The CUDA tests and the op rows on cuda:0 with the options async, "
            "stream_ordered_allocator, copy_stream and profile on (REMAT_BACKEND_OPTIONS); each option's own test "
            "(test_cuda, on a backend of its own) ran in the default stage. An option is marked device-checked in "
            "src/tensor/devices.cpp once these pass.", "",
            "| stage | status |", "|---|---|"]
    for name in ("options-test_cuda", "options-test_ops", "options-bench", "bench-remat-bf16", "test_cuda_bf16"):
        out.append(f"| {name} | {stage_status(stages, name)} |")
    out.append("")

    if remat_profiles or torch_profiles:
        out += ["## Where the step goes", "",
                "Device time per kernel, one profiled step after the measured ones (remat: the backend option "
                "profile, an event pair per launch; PyTorch: torch.profiler, mean of its profiled steps). Categories "
                "by kernel name (scripts/cuda-report.py).", ""]
        for policy in ("save-all", "every-layer"):
            if policy in remat_profiles:
                out += profile_tables(f"remat {policy}, default path", remat_profiles[policy]["kernels"])
        for policy in ("none", "per-block"):
            if policy in torch_profiles:
                out += profile_tables(f"PyTorch {policy}", torch_profiles[policy]["kernels"])

    smoke = lines(f"{work}/train-smoke.out")
    if smoke:
        out += ["", "## remat train --device cuda", "", "```", json.dumps(smoke[-1])[:2000], "```"]
    open(report, "w").write("\n".join(out) + "\n")
    print(f"cuda-check: wrote {report}")


if __name__ == "__main__":
    main()
