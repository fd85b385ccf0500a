"""Runs the peer benchmarks (remat, PyTorch eager, JAX jit) and writes the dated report.

  bench/peers/.venv/bin/python bench/peers/run.py [--models mlp,gpt,gpt-large] [--steps N]
      [--warmup 2] [--quiet-busy 0.3] [--quiet-max-wait 120] [--retries 2] [--max-minutes 25] [--out bench/results]

Usually started by bench/peers/run.sh, which first sets up the environment and builds the
runner. Every configuration runs in a fresh process; each prints one JSON line, collected into
bench/results/peers-DATE.json, summarised in peers-DATE.md and plotted in peers-DATE.svg.
"""

import argparse
import datetime
import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
from common import MODELS  # noqa: E402

PY = sys.executable
SNAPSHOT = os.path.join(ROOT, "build", "peers")  # run.sh: the runner and its copy of libremat
RUNNER = os.path.join(SNAPSHOT, "remat_runner")
LOSS_RTOL = 1e-4
TIMEOUT_S = 900

SYSTEMS = ["remat", "pytorch", "jax"]
ATTENTION_SELECTIVE = "selective:matmul,scaled_dot_product_attention"
TORCH_POLICIES = ["none", "per-block", "sequential", "selective"]
JAX_POLICIES = ["none", "per-block", "dots"]
# The ResNets: PyTorch without checkpointing, per block, and per residual stage; no JAX runner for
# them.
RESNET_TORCH_POLICIES = ["none", "per-block", "per-stage"]
# Budgets: fractions of the way from every-layer's saved peak to save-all's; where the two are
# (nearly) equal (the tanh MLP, whose layer boundary is all a layer keeps), fractions of
# save-all's peak below it instead (the planner recomputes segments there).
BUDGET_FRACTIONS = [0.0, 0.25, 0.5, 0.75, 1.0]
BELOW_FRACTIONS = [0.15, 0.3, 0.5, 0.75, 1.0]


def loadavg():
    return os.getloadavg()[0]


def cpu_busy(seconds=1.0):
    """CPUs kept busy by other processes over `seconds` (0 .. number of CPUs), from /proc/stat."""
    def sample():
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        idle = v[3] + (v[4] if len(v) > 4 else 0)
        return sum(v[:8]), idle
    t0, i0 = sample()
    time.sleep(seconds)
    t1, i1 = sample()
    total = max(1, t1 - t0)
    return round((os.cpu_count() or 1) * (1 - (i1 - i0) / total), 2)


QUIET = {"busy": 0.3, "max_wait": 120.0, "retries": 2, "deadline": float("inf")}


def stat_busy_seconds():
    """CPU seconds spent busy by the whole machine so far (all CPUs), from /proc/stat."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + (v[4] if len(v) > 4 else 0)
    return (sum(v[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def children_cpu_seconds():
    import resource

    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def wait_for_quiet_cpus():
    """Before each configuration: wait (at most QUIET['max_wait'] s) until other processes keep
    less than QUIET['busy'] CPUs busy. Returns the last measurement."""
    t0 = time.time()
    busy = cpu_busy()
    while busy > QUIET["busy"] and time.time() - t0 < QUIET["max_wait"] and time.time() < QUIET["deadline"]:
        time.sleep(4)
        busy = cpu_busy()
    return busy


def log(msg):
    print(f"[peers {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


EXTRA_ENV = {}


def run_one(cmd, env=None):
    env = dict(env or os.environ)
    env.update(EXTRA_ENV)
    busy = wait_for_quiet_cpus()
    load = loadavg()
    t0 = time.time()
    machine0, own0 = stat_busy_seconds(), children_cpu_seconds()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, env=env, cwd=HERE)
        out, err, rc = p.stdout, p.stderr, p.returncode
    except subprocess.TimeoutExpired as e:
        out, err, rc = e.stdout or "", f"timed out after {TIMEOUT_S} s", -1
        if isinstance(out, bytes):
            out = out.decode(errors="replace")
    wall = max(1e-3, time.time() - t0)
    others = max(0.0, (stat_busy_seconds() - machine0) - (children_cpu_seconds() - own0)) / wall
    record = None
    for line in reversed(out.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                record = json.loads(line)
                break
            except json.JSONDecodeError:
                pass
    if record is None:
        tail = (err or out).strip().splitlines()[-3:]
        record = {"error": f"exit {rc}: " + " | ".join(tail)}
    record["load_before"] = round(load, 2)
    record["busy_before"] = busy
    # CPUs kept busy by other processes while this one ran (machine busy time minus this
    # configuration's own CPU time, over its wall time): the contention its timings suffered.
    record["others_busy"] = round(others, 2)
    record["wall_seconds"] = round(time.time() - t0, 1)
    return record


def measure(cmd, env=None):
    """run_one, again (up to QUIET['retries'] more times, before the deadline) while other
    processes kept more than QUIET['busy'] CPUs busy during the run; keeps the least disturbed."""
    best = run_one(cmd, env)
    tries = 1
    while ("error" not in best and best["others_busy"] > QUIET["busy"] and tries <= QUIET["retries"]
           and time.time() < QUIET["deadline"]):
        log(f"  others kept {best['others_busy']} CPUs busy during the run: again")
        r = run_one(cmd, env)
        tries += 1
        if "error" not in r and r["others_busy"] < best["others_busy"]:
            best = r
    best["attempts"] = tries
    return best


def affinity_prefix():
    # Two threads in every system; pin to two CPUs where the machine has more.
    if (os.cpu_count() or 2) > 2:
        return ["taskset", "-c", "0,1"]
    return []


# Measured steps per model: more where a step is short (the median of 20 steps of ~0.1 s is
# steadier than of 5), the minimum of 5 for gpt-large (~2 s a step). --steps sets all.
MODEL_STEPS = {"mlp": 20, "gpt": 20, "gpt-large": 5, "nanogpt": 30, "resnet": 10, "resnet-110": 5}


def steps_for(model, a):
    return a.steps if a.steps else MODEL_STEPS.get(model, 5)


def remat_cmd(model, policy, a, save_init=None):
    cmd = affinity_prefix() + [RUNNER, "--model", model, "--policy", policy, "--steps", str(steps_for(model, a)), "--warmup",
                               str(a.warmup), "--threads", str(a.threads)]
    if save_init:
        cmd += ["--save-init", save_init]
    return cmd


def peer_cmd(script, model, policy, init, a):
    cmd = affinity_prefix() + [PY, os.path.join(HERE, script), "--model", model, "--policy", policy, "--init", init,
                               "--steps", str(steps_for(model, a)), "--warmup", str(a.warmup)]
    if script.startswith("torch"):
        cmd += ["--threads", str(a.threads)]
    return cmd


def jax_env():
    env = dict(os.environ)
    env["JAX_PLATFORMS"] = "cpu"
    # One host device; XLA's CPU client sizes its intra-op pool from the CPUs it may run on
    # (two, under taskset where the machine has more).
    env.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=true")
    return env


def budgets_for(el, sa):
    if sa > 0 and (sa - el) / sa > 0.1:
        return [int(el + f * (sa - el)) for f in BUDGET_FRACTIONS]
    return [int(f * sa) for f in BELOW_FRACTIONS]


# Runs of every configuration per model (fresh processes, one pass over all configurations after
# another, so that a disturbance hits different configurations in different passes); the report
# gives the median over the passes. --repeats sets all.
MODEL_REPEATS = {"mlp": 3, "gpt": 3, "gpt-large": 1, "nanogpt": 3, "resnet": 2, "resnet-110": 1}


def repeats_for(model, a):
    return a.repeats if a.repeats else MODEL_REPEATS.get(model, 1)


def summary(r):
    return {k: r.get(k) for k in ["median_step_seconds", "median_step_cpu_seconds", "rss_peak_growth_bytes",
                                  "alloc_peak_bytes", "alloc_peak_saved_bytes", "others_busy", "attempts"]}


def merge_repeat(record, again):
    """Adds another pass's run of the same configuration to record; the headline numbers become
    the medians over the passes (each pass's own numbers stay under 'passes')."""
    if "error" in again:
        record.setdefault("pass_errors", []).append(again["error"])
        return
    record.setdefault("passes", [summary(record)]).append(summary(again))
    for key in ["median_step_seconds", "median_step_cpu_seconds", "rss_peak_growth_bytes", "alloc_peak_bytes",
                "alloc_peak_saved_bytes", "others_busy"]:
        values = [p[key] for p in record["passes"] if p.get(key) is not None]
        if values:
            record[key] = statistics.median(values)


def run_model(model, a, tmp, results):
    init = os.path.join(tmp, f"{model}.safetensors")
    spec = MODELS[model]
    if spec["kind"] == "resnet":
        n = spec["stages"] * spec["blocks"] + 2  # the chain: stem, blocks, head
    else:
        n = spec["depth"] if spec["kind"] == "mlp" else spec["layers"]
    k = max(1, round(math.sqrt(n)))
    resnet = spec["kind"] == "resnet"
    selective = "selective:conv2d" if resnet else "selective:matmul"
    configs = []  # (record, command, environment) of the first pass, run again by later passes

    def show(record, system, policy, prefix=""):
        if "error" in record:
            log(f"{prefix}{model:9s} {system:7s} {policy:22s} ERROR {record['error'][:200]}")
        else:
            log(f"{prefix}{model:9s} {system:7s} {policy:22s} {record['median_step_seconds']:8.4f} s  rss "
                f"+{record['rss_peak_growth_bytes'] / 2**20:8.1f} MiB  loss0 {record['first_loss']:.7f}  "
                f"(others busy {record['others_busy']}, tries {record.get('attempts', 1)})")

    def add(system, policy, cmd, env=None, record=None, **extra):
        if record is None:
            record = measure(cmd, env)
        record.setdefault("system", system)
        record.setdefault("model", model)
        record["label"] = policy
        record.update(extra)
        results.append(record)
        configs.append((record, cmd, env))
        show(record, system, policy)
        return record

    sa = add("remat", "save-all", remat_cmd(model, "save-all", a, save_init=init))
    if "error" in sa:
        log(f"{model}: remat save-all failed; skipping the model")
        return
    el = add("remat", "every-layer", remat_cmd(model, "every-layer", a))
    add("remat", selective, remat_cmd(model, selective, a))
    if model in ("gpt", "gpt-large", "nanogpt"):  # also keeps the attention output and its row statistics
        add("remat", ATTENTION_SELECTIVE, remat_cmd(model, ATTENTION_SELECTIVE, a))
    add("remat", f"every-k:{k}", remat_cmd(model, f"every-k:{k}", a))
    if not resnet:  # the optimizer inside the backward: one gradient alive at a time
        add("remat", "every-layer+fused-optimizer", remat_cmd(model, "every-layer", a) + ["--fuse-optimizer"])
    if "error" not in el:
        for b in budgets_for(el["alloc_peak_saved_bytes"], sa["alloc_peak_saved_bytes"]):
            pol = f"budget:{b}"
            r = measure(remat_cmd(model, pol, a))
            m = re.search(r"smallest feasible budget .*?: (\d+) bytes", r.get("error", ""))
            if m:  # below what the planner can do: run at the smallest feasible budget instead
                pol = f"budget:{m.group(1)}"
                r = None
            add("remat", pol, remat_cmd(model, pol, a), record=r, budget_bytes=int(pol.split(":")[1]))
    for pol in (RESNET_TORCH_POLICIES if resnet else TORCH_POLICIES):
        add("pytorch", pol, peer_cmd("torch_runner.py", model, pol, init, a))
    for pol in ([] if resnet else JAX_POLICIES):
        add("jax", pol, peer_cmd("jax_runner.py", model, pol, init, a), env=jax_env())

    for p in range(2, repeats_for(model, a) + 1):
        for record, cmd, env in configs:
            if "error" in record:
                continue
            if "--save-init" in cmd:  # the weights file exists: do not write it again
                i = cmd.index("--save-init")
                cmd = cmd[:i] + cmd[i + 2:]
            again = measure(cmd, env)
            merge_repeat(record, again)
            show(again, record["system"], record["label"], prefix=f"pass {p}: ")


# ---------------------------------------------------------------- report

def sh(cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60, shell=True).stdout.strip()
    except Exception:  # noqa: BLE001
        return ""


def environment():
    env = {}
    cpu = sh("lscpu | sed -n 's/^Model name: *//p'") or platform.processor()
    fam = sh("lscpu | sed -n 's/^CPU family: *//p'")
    mod = sh("lscpu | sed -n 's/^Model: *//p'")
    env["cpu"] = f"{cpu} (family {fam}, model {mod})" if fam else cpu
    env["cpus"] = os.cpu_count()
    env["memory"] = sh("free -g | awk '/^Mem:/ {print $2 \" GiB\"}'")
    env["kernel"] = platform.release()
    env["python"] = platform.python_version()
    try:
        with open(os.path.join(SNAPSHOT, "COMMIT")) as f:
            env["remat_commit"] = f.read().strip() + " (libremat built from it by run.sh)"
    except OSError:
        env["remat_commit"] = sh(f"git -C {ROOT} rev-parse --short HEAD")
    env["compiler"] = sh("c++ --version | head -1")
    for pkg in ["libdnnl2", "libopenblas0-pthread", "libopenblas0"]:
        v = sh(f"dpkg-query -W -f='${{Version}}' {pkg} 2>/dev/null")
        if v:
            env[pkg] = v
    env["torch"] = sh(f"{PY} -c 'import torch; print(torch.__version__)'")
    env["torch_onednn"] = sh(f"{PY} -c \"import torch; print(torch.__config__.show())\" | "
                             "sed -n 's/.*MKL-DNN \\(v[0-9.]*\\).*/\\1/p; s/.*Math Kernel Library Version \\([0-9.]*\\).*/MKL \\1/p' | "
                             "tr '\\n' ' '")
    env["jax"] = sh(f"JAX_PLATFORMS=cpu {PY} -c 'import jax, jaxlib; print(jax.__version__, jaxlib.__version__)'")
    env["numpy"] = sh(f"{PY} -c 'import numpy; print(numpy.__version__)'")
    return env


def mib(b):
    return b / 2**20


def fmt_mib(b):
    return "–" if b is None else f"{mib(b):.1f}"


def check_losses(results):
    """The loss of the first step (the initial weights) must agree with remat save-all's."""
    ref = {r["model"]: r["first_loss"] for r in results
           if r.get("system") == "remat" and r.get("label") == "save-all" and "first_loss" in r}
    failures = []
    for r in results:
        if "first_loss" not in r or r["model"] not in ref:
            continue
        rel = abs(r["first_loss"] - ref[r["model"]]) / max(abs(ref[r["model"]]), 1e-30)
        r["loss_rel_diff"] = rel
        r["loss_ok"] = rel <= LOSS_RTOL
        if not r["loss_ok"]:
            failures.append(f"{r['model']} {r['system']} {r['label']}: first loss {r['first_loss']:.8g} vs remat "
                            f"{ref[r['model']]:.8g} (relative {rel:.2e} > {LOSS_RTOL:g})")
    return failures


def ok(r):
    return "error" not in r and "median_step_seconds" in r


def ratio_line(model, what, num, den, key, limit, unit="s"):
    """A target 'num / den <= limit' on the field `key` of two records, as a table row."""
    if not num or not den or not den.get(key):
        return None
    ratio = num[key] / den[key]
    fmt = (lambda v: f"{v:.4f} s") if unit == "s" else (lambda v: f"{fmt_mib(v)} MiB")
    return (f"| {model} | {what} (<= {limit:g}x) | {fmt(num[key])} vs {fmt(den[key])} ({ratio:.2f}x) | "
            f"{'met' if ratio <= limit else 'MISSED'} |")


def speed_targets(model, rs, get):
    """The speed and memory targets of docs/performance.md, where this run has the configurations."""
    lines = []
    sa = get("remat", "save-all")
    if model in ("gpt", "gpt-large", "nanogpt"):
        lines.append(ratio_line(model, "remat save-all step vs PyTorch eager without checkpointing (SDPA)", sa,
                                get("pytorch", "none"), "median_step_seconds", 0.8))
    if model == "mlp":
        lines.append(ratio_line(model, "remat save-all step vs JAX jit without checkpointing", sa, get("jax", "none"),
                                "median_step_seconds", 0.9))
    if model in ("gpt", "nanogpt", "gpt-large"):
        lines.append(ratio_line(model, "remat every-layer step vs save-all", get("remat", "every-layer"), sa,
                                "median_step_seconds", 1.2))
        for label in ("selective:matmul", ATTENTION_SELECTIVE):
            sel = get("remat", label)
            lines.append(ratio_line(model, f"remat {label} step vs save-all", sel, sa, "median_step_seconds", 1.05))
            lines.append(ratio_line(model, f"remat {label} saved bytes vs save-all", sel, sa,
                                    "alloc_peak_saved_bytes", 0.5, unit="bytes"))
    fused = [r for r in rs if r["system"] == "remat" and r["label"].endswith("+fused-optimizer")]
    peers = [r for r in rs if r["system"] != "remat"]
    for f in fused:
        worse = [p for p in peers if p["rss_peak_growth_bytes"] <= f["rss_peak_growth_bytes"]]
        lines.append(f"| {model} | remat {f['label']} peak RSS growth below every PyTorch and JAX configuration | "
                     f"{fmt_mib(f['rss_peak_growth_bytes'])} MiB (allocator: {fmt_mib(f['alloc_peak_bytes'])} MiB total) vs "
                     f"smallest peer {fmt_mib(min((p['rss_peak_growth_bytes'] for p in peers), default=None))} MiB | "
                     f"{'met' if peers and not worse else 'MISSED'} |")
    return [line for line in lines if line]


def targets(results, models):
    lines = []
    for model in models:
        rs = [r for r in results if r["model"] == model and ok(r)]
        get = lambda s, p: next((r for r in rs if r["system"] == s and r["label"] == p), None)  # noqa: E731
        lines.extend(speed_targets(model, rs, get))
        sa, tn = get("remat", "save-all"), get("pytorch", "none")
        if sa and tn:
            met = sa["median_step_seconds"] <= tn["median_step_seconds"]
            lines.append(f"| {model} | remat save-all no slower than PyTorch without checkpointing | "
                         f"{sa['median_step_seconds']:.4f} s vs {tn['median_step_seconds']:.4f} s "
                         f"({sa['median_step_seconds'] / tn['median_step_seconds']:.2f}x) | {'met' if met else 'MISSED'} |")
        el, ts = get("remat", "every-layer"), get("pytorch", "per-stage")
        if el and ts:
            met = el["rss_peak_growth_bytes"] <= ts["rss_peak_growth_bytes"]
            lines.append(f"| {model} | remat every-layer peak no larger than PyTorch per-stage checkpoint peak | "
                         f"{fmt_mib(el['rss_peak_growth_bytes'])} MiB vs {fmt_mib(ts['rss_peak_growth_bytes'])} MiB RSS "
                         f"(remat allocator: {fmt_mib(el['alloc_peak_bytes'])} MiB) | {'met' if met else 'MISSED'} |")
        tb = get("pytorch", "per-block")
        if el and tb:
            met = el["rss_peak_growth_bytes"] <= tb["rss_peak_growth_bytes"]
            lines.append(f"| {model} | remat every-layer peak no larger than PyTorch per-block checkpoint peak | "
                         f"{fmt_mib(el['rss_peak_growth_bytes'])} MiB vs {fmt_mib(tb['rss_peak_growth_bytes'])} MiB RSS "
                         f"(remat allocator: {fmt_mib(el['alloc_peak_bytes'])} MiB) | {'met' if met else 'MISSED'} |")
        # The budget curve: remat's budget points (which run from every-layer's saved peak to
        # save-all's) must dominate every peer point: for each PyTorch / JAX point (memory m,
        # time t), some budget point with memory <= m and time <= t.
        curve = [r for r in rs if r["system"] == "remat" and r["label"].startswith("budget:")]
        missed = []
        for p in rs:
            if p["system"] == "remat":
                continue
            dom = [c for c in curve if c["rss_peak_growth_bytes"] <= p["rss_peak_growth_bytes"]
                   and c["median_step_seconds"] <= p["median_step_seconds"]]
            if not dom:
                missed.append(f"{p['system']} {p['label']} ({fmt_mib(p['rss_peak_growth_bytes'])} MiB, "
                              f"{p['median_step_seconds']:.4f} s)")
        if curve:
            lines.append(f"| {model} | remat budget curve at or below every PyTorch and JAX point | "
                         + ("all dominated" if not missed else "not dominated: " + "; ".join(missed))
                         + f" | {'met' if not missed else 'MISSED'} |")
    return lines


def write_markdown(path, results, env, a, models, started, finished, loss_failures, svg_name, notes=None):
    L = []
    date = started.strftime("%Y-%m-%d")
    L.append(f"# remat against PyTorch and JAX, {date}")
    L.append("")
    L.append("Produced by `bench/peers/run.sh` (see `bench/peers/README.md`). Every row is a fresh process.")
    L.append("")
    L.append("## Machine and versions")
    L.append("")
    L.append("| | |")
    L.append("|---|---|")
    for k in ["cpu", "cpus", "memory", "kernel", "compiler", "remat_commit", "libdnnl2", "libopenblas0-pthread",
              "libopenblas0", "python", "torch", "torch_onednn", "jax", "numpy"]:
        if env.get(k):
            L.append(f"| {k} | {env[k]} |")
    L.append(f"| threads | {a.threads} in remat and PyTorch (remat::set_num_threads({a.threads}); "
             f"torch.set_num_threads({a.threads})); XLA on "
             f"{'taskset -c 0,1' if affinity_prefix() else 'the machine’s 2 CPUs'} |")
    L.append(f"| run | {started:%Y-%m-%d %H:%M} to {finished:%H:%M}, {a.warmup} warm-up + measured steps per "
             "configuration: " + ", ".join(f"{m} {r['steps']}" for m in models
                                           for r in [next((x for x in results if x['model'] == m and 'steps' in x), {'steps': '?'})])
             + " |")
    if EXTRA_ENV:
        L.append("| environment of every benchmark process | " + " ".join(f"`{k}={v}`" for k, v in EXTRA_ENV.items())
                 + " |")
    busy = [r["others_busy"] for r in results if "others_busy" in r]
    if busy:
        L.append(f"| CPUs kept busy by other processes during each configuration (column `others`) | min "
                 f"{min(busy):.2f}, median {sorted(busy)[len(busy) // 2]:.2f}, max {max(busy):.2f} of 2. Before "
                 f"each configuration the run waited (up to {QUIET['max_wait']:.0f} s) for other work to use under "
                 f"{QUIET['busy']} CPUs, and ran a configuration again (up to {QUIET['retries']} times) when "
                 "more was used during it, keeping the least disturbed run |")
    loads = [r["load_before"] for r in results if "load_before" in r]
    if loads:
        L.append(f"| load average (1 min) before each configuration | min {min(loads):.2f}, median "
                 f"{sorted(loads)[len(loads) // 2]:.2f}, max {max(loads):.2f} (this run's own previous configuration "
                 "included) |")
    L.append("")
    L.append("## What is measured")
    L.append("")
    L.append("- **Step**: drop the gradients, forward, loss, backward, SGD update (lr 1e-4, no momentum), float32, "
             "identical in all three systems (JAX: one jitted function with the parameters donated, compiled before "
             "the baseline). **median step** is the median over the measured steps after the warm-up steps (the "
             "first steps under a remat budget profile the model and the next one plans, so remat's budget runs warm up "
             "for BudgetPlanner::kProfilingSteps + 1 = 3 steps).")
    L.append("- **Passes**: every configuration of a model runs in " + ", ".join(
        f"{m} {max(len(r.get('passes', [])), 1)}" for m in models
        for r in [next((x for x in results if x['model'] == m and 'error' not in x), {})])
             + " fresh process(es), one pass over all of the model's configurations after another; the "
             "tables give the median over the passes of each process's median step time, step CPU time and peaks.")
    L.append("- **RSS peak**: the resident-set high-water mark (VmHWM in /proc/self/status) at the end minus "
             "the same after setup (model, inputs and optimizer built, weights loaded, JAX step compiled, nothing "
             "run yet), with the high-water mark reset to the current RSS just before the baseline "
             "(`echo 5 > /proc/self/clear_refs`). It includes everything the steps add: activations, gradients, "
             "temporaries, allocator slack, library workspaces.")
    L.append("- **alloc peak / saved peak** (remat only): remat's accounted allocator, exact: the peak of all live "
             "tensor bytes over the measured steps above the baseline (gradients, activations, temporaries), and the "
             "peak of bytes held for the backward pass.")
    L.append("- **step CPU**: the process's CPU time (all threads, user + system) over the same step, median; "
             "threads spin-waiting in a parallel runtime count. On a loaded machine it shows the work better than the "
             "wall time does.")
    L.append(f"- **first loss**: the loss of step 1 (the shared initial weights); it must agree with remat save-all's "
             f"to {LOSS_RTOL:g} relative.")
    L.append("- Models: `mlp` 64 layers of tanh(h W^T + b), width 512, batch 128, loss mean(h^2); `gpt` the "
             "default model of `remat train` (4 layers, width 128, 4 heads, seq 64, batch 32, vocab 114, random "
             "token ids); `gpt-large` 8 layers, width 256, 8 heads, seq 256, batch 20, vocab 114 (about 1 GiB of "
             "saved activations under save-all); `nanogpt` nanoGPT's CPU configuration of shakespeare_char (4 "
             "layers, width 128, 4 heads, seq 64, batch 12, vocab 65). All GPTs: pre-norm blocks, fused causal "
             "attention (remat's scaled_dot_product_attention, PyTorch's F.scaled_dot_product_attention as in "
             "nanoGPT, JAX's jax.nn.dot_product_attention), exact GELU, mean cross entropy. `resnet` / `resnet-110`: the pre-activation CIFAR "
             "ResNet-20 / ResNet-110 of remat::nn::ResNet (3 stages of 3 / 18 blocks, width 16, batch 32, 32x32 "
             "synthetic images, batch norm in training mode, mean cross entropy); remat's chain is stem, blocks, head; "
             "PyTorch `per-stage` checkpoints each residual stage (`bn/step`: batch-norm updates per step, from "
             "num_batches_tracked: PyTorch's checkpoint re-runs the batch norms, remat updates once).")
    L.append("- Policies. remat: `save-all`, `every-layer`, `selective:matmul`, `every-k:K` (K = round(sqrt(N))), "
             "`budget:B` for B from every-layer's saved peak to save-all's (the MLP: below save-all's, since there "
             "every-layer keeps as much as save-all). PyTorch: `none`, `per-block` (checkpoint(use_reentrant=False) "
             "per block), `sequential` (checkpoint_sequential, round(sqrt(N)) segments), `selective` (per-block, "
             "MUST_SAVE aten.mm/addmm/bmm, PREFER_RECOMPUTE the rest). JAX: `none`, `per-block` (jax.checkpoint per "
             "block), `dots` (jax.checkpoint with checkpoint_dots).")
    L.append("")
    if loss_failures:
        L.append("## LOSS CHECK FAILED")
        L.append("")
        for f in loss_failures:
            L.append(f"- {f}")
        L.append("")
    else:
        L.append(f"Loss check: every configuration's first loss agrees with remat save-all's to {LOSS_RTOL:g} "
                 "relative (column `Δloss`).")
        L.append("")
    L.append("## Results")
    L.append("")
    L.append(f"![step time against peak memory]({svg_name})")
    L.append("")
    for model in models:
        rs = [r for r in results if r["model"] == model]
        if not rs:
            continue
        spec = MODELS[model]
        L.append(f"### {model}: " + ", ".join(f"{k} {v}" for k, v in spec.items() if k != "kind"))
        L.append("")
        base = next((r for r in rs if r["system"] == "remat" and r["label"] == "save-all" and ok(r)), None)
        bn = spec["kind"] == "resnet"  # batch-norm updates per step
        L.append("| system | policy | median step (s) | vs remat save-all | step CPU (s) | RSS peak (MiB) "
                 "| remat alloc peak (MiB) | remat saved peak (MiB) | first loss | Δloss | others |"
                 + (" bn/step |" if bn else ""))
        L.append("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|" + ("---:|" if bn else ""))
        for r in rs:
            if not ok(r):
                L.append(f"| {r['system']} | {r['label']} | error: {r.get('error', '?')[:160]} | | | | | | | | |"
                         + (" |" if bn else ""))
                continue
            rel = f"{r['median_step_seconds'] / base['median_step_seconds']:.2f}x" if base else ""
            pol = r["label"]
            if pol.startswith("budget:"):
                pol = f"budget:{mib(int(pol.split(':')[1])):.1f}MiB"
            L.append(f"| {r['system']} | {pol} | {r['median_step_seconds']:.4f} | {rel} | "
                     f"{r.get('median_step_cpu_seconds', float('nan')):.3f} | "
                     f"{fmt_mib(r['rss_peak_growth_bytes'])} | {fmt_mib(r.get('alloc_peak_bytes'))} | "
                     f"{fmt_mib(r.get('alloc_peak_saved_bytes'))} | {r['first_loss']:.6f} | "
                     f"{r.get('loss_rel_diff', float('nan')):.1e} | {r.get('others_busy', float('nan')):.2f} |"
                     + (f" {r.get('bn_batches_tracked_per_step', float('nan')):.1f} |" if bn else ""))
        L.append("")
    L.append("## Targets")
    L.append("")
    L.append("| model | target | measured | |")
    L.append("|---|---|---|---|")
    L.extend(targets(results, models))
    L.append("")
    L.append("Peak memory in the targets is the RSS peak, the measure common to the three systems.")
    L.append("")
    if notes:
        with open(notes) as f:
            L.append(f.read().rstrip())
        L.append("")
    with open(path, "w") as f:
        f.write("\n".join(L))


def plot(path, results, models, title):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"remat": "tab:red", "pytorch": "tab:blue", "jax": "tab:green"}
    markers = {"save-all": "s", "none": "s", "every-layer": "o", "per-block": "o", "selective:matmul": "^",
               "selective:conv2d": "^", ATTENTION_SELECTIVE: "v", "selective": "^", "dots": "^", "sequential": "D", "per-stage": "D"}
    fig, axes = plt.subplots(1, len(models), figsize=(6 * len(models), 5), squeeze=False)
    for ax, model in zip(axes[0], models):
        rs = [r for r in results if r["model"] == model and ok(r)]
        curve = sorted((r for r in rs if r["system"] == "remat" and r["label"].startswith("budget:")),
                       key=lambda r: r.get("budget_bytes", 0))
        if curve:
            ax.plot([mib(r["rss_peak_growth_bytes"]) for r in curve], [r["median_step_seconds"] for r in curve],
                    "-", color=colors["remat"], marker=".", label="remat budget:B sweep")
        for r in rs:
            if r["label"].startswith("budget:"):
                continue
            m = "v" if r["label"].startswith("every-k") else markers.get(r["label"], "x")
            ax.scatter(mib(r["rss_peak_growth_bytes"]), r["median_step_seconds"], color=colors[r["system"]],
                       marker=m, s=50, label=f"{r['system']} {r['label']}", zorder=3)
        ax.set_title(model)
        ax.set_xlabel("peak RSS growth over setup (MiB)")
        ax.set_ylabel("median step time (s)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, format=os.path.splitext(path)[1].lstrip(".") or "svg")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="mlp,gpt,gpt-large,nanogpt")
    ap.add_argument("--steps", type=int, default=0,
                    help="measured steps per configuration (default: 20 for mlp and gpt, 5 for gpt-large)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2,
                    help="threads of remat and PyTorch (JAX takes the CPUs it may run on); 1 is steadier on a "
                         "machine that other work shares")
    ap.add_argument("--repeats", type=int, default=0,
                    help="passes over all configurations of a model (default: 3 for mlp and gpt, 1 for gpt-large); "
                         "the report gives the median over the passes")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results"))
    ap.add_argument("--quiet-busy", type=float, default=0.3,
                    help="before each configuration, wait until other processes keep fewer CPUs than this busy")
    ap.add_argument("--quiet-max-wait", type=float, default=120,
                    help="seconds to wait at most for that before each configuration (0: measure, do not wait)")
    ap.add_argument("--retries", type=int, default=2,
                    help="runs of a configuration again when other processes kept more CPUs than --quiet-busy busy "
                         "during it (the least disturbed run is kept)")
    ap.add_argument("--max-minutes", type=float, default=25,
                    help="after this many minutes, stop waiting for quiet CPUs and stop retrying")
    ap.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                    help="set in every benchmark process of every system (e.g. MALLOC_MMAP_THRESHOLD_=131072)")
    ap.add_argument("--resume", metavar="JSON", help="continue an interrupted run: keep the models it finished")
    ap.add_argument("--render", metavar="JSON", help="only rewrite the .md and .svg from a results .json")
    ap.add_argument("--notes", metavar="FILE", help="markdown appended to the report (analysis written after a run)")
    ap.add_argument("--tag", default="", help="appended to the output names: peers-DATE-TAG.*")
    a = ap.parse_args()
    QUIET.update(busy=a.quiet_busy, max_wait=a.quiet_max_wait, retries=a.retries)
    for kv in a.env:
        k, _, v = kv.partition("=")
        EXTRA_ENV[k] = v
    if a.warmup < 1:
        ap.error("--warmup must be at least 1 (remat's budget runs warm up for at least 3 steps on their own)")
    models = [m.strip() for m in a.models.split(",") if m.strip()]
    for m in models:
        if m not in MODELS:
            ap.error(f"unknown model {m}")
    if a.render:
        with open(a.render) as f:
            saved = json.load(f)
        EXTRA_ENV.update(saved.get("extra_env", {}))
        QUIET.update(saved.get("quiet", {}))
        results = saved["results"]
        a.steps, a.warmup, a.threads = saved["steps"], saved["warmup"], saved.get("threads", 2)
        models = [m for m in models if any(r["model"] == m for r in results)]
        started = datetime.datetime.fromisoformat(saved["started"])
        finished = datetime.datetime.fromisoformat(saved["finished"])
        stem = a.render[:-len(".json")]
        loss_failures = check_losses(results)
        env = saved["environment"]
        # a run stopped before its end wrote no machine block: the file still renders
        cpu = env.get("cpu", "CPU not recorded (the run was stopped before the end)")
        plot(stem + ".svg", results, models, f"remat vs PyTorch vs JAX, {cpu}, {a.threads} thread(s), {started:%Y-%m-%d}")
        write_markdown(stem + ".md", results, env, a, models, started, finished, loss_failures,
                       os.path.basename(stem) + ".svg", a.notes)
        return 1 if loss_failures else 0
    if not os.access(RUNNER, os.X_OK):
        sys.exit(f"run.py: {RUNNER} is missing; run bench/peers/run.sh")
    started = datetime.datetime.now()
    QUIET["deadline"] = time.time() + 60 * a.max_minutes
    results = []
    os.makedirs(a.out, exist_ok=True)
    stem = os.path.join(a.out, f"peers-{started:%Y-%m-%d}" + (f"-{a.tag}" if a.tag else ""))
    if a.resume:  # keep the models a previous (interrupted) run finished
        with open(a.resume) as f:
            saved = json.load(f)
        done = set(saved.get("models_done", [])) & set(models)
        results = [r for r in saved["results"] if r["model"] in done]
        started = datetime.datetime.fromisoformat(saved["started"])
        stem = a.resume[:-len(".json")]
        log(f"resuming {a.resume}: keeping {', '.join(sorted(done)) or 'nothing'}")
    else:
        done = set()

    def save(env=None, finished=None):
        with open(stem + ".json", "w") as f:
            json.dump({"environment": env or {}, "extra_env": EXTRA_ENV, "quiet": QUIET, "started": started.isoformat(),
                       "finished": (finished or datetime.datetime.now()).isoformat(), "steps": a.steps, "threads": a.threads,
                       "warmup": a.warmup, "models_done": sorted(done), "results": results}, f, indent=1)

    with tempfile.TemporaryDirectory(prefix="remat-peers-") as tmp:
        for model in models:
            if model in done:
                continue
            run_model(model, a, tmp, results)
            done.add(model)
            save()  # after every model, so that an interrupted run can --resume
    finished = datetime.datetime.now()
    loss_failures = check_losses(results)
    env = environment()
    save(env, finished)
    plot(stem + ".svg", results, models, f"remat vs PyTorch vs JAX, {env['cpu']}, {a.threads} thread(s), {started:%Y-%m-%d}")
    write_markdown(stem + ".md", results, env, a, models, started, finished, loss_failures,
                   os.path.basename(stem) + ".svg", a.notes)
    log(f"wrote {stem}.md, .svg, .json ({(finished - started).total_seconds() / 60:.1f} min)")
    for f in loss_failures:
        log("LOSS CHECK FAILED: " + f)
    return 1 if loss_failures else 0


if __name__ == "__main__":
    sys.exit(main())
