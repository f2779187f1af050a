"""Every shipped plan and the Triton tile settings of the GPU space under compute-sanitizer
(memcheck), one row per item in a CSV: ``clean``, ``wrong`` (no finding, but the output
breaks the correctness rule on a padded input), ``memcheck`` (the sanitizer's first
finding: kind, kernel, line), ``error`` (a CUDA or Python error without a finding) or
``unsupported`` (the support rules refuse it).

A finding corrupts the CUDA context, so each child process runs items in order until one
fails; the parent records that item and starts a new child at the next one. Shards run
in parallel (compilation is CPU work; the GPU work per item is small).

    python3 scripts/memcheck_sweep.py --out memcheck.csv [--shards 4] [--deadline 400]
    python3 scripts/memcheck_sweep.py --list        # the items, without running them

Items: each admitted entry of ``--table`` at its case's shape (batch cut to 16, plus the
full batch for entries with a batch above 16), then the fused-layer, fused-block and
flash-attention tiles of ``search_spaces/gpu.py`` at head dims 8-128.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FP16 = {"attention": "triton", "attn_precision": "fp16", "gemm_precision": "fp16"}
TILES = (32, 64, 128)


def _shape(b: int, s: int, d: int, h: int, ffn: int, layers: int) -> str:
    return f"{b},{s},{d},{h},{ffn},{layers}"


def table_items(table: str) -> list[tuple[str, str, dict]]:
    sys.path.insert(0, str(ROOT))
    from autotune.runtime.table import load_table

    items = []
    for key, entry in sorted(load_table(table).entries.items(), key=lambda kv: str(kv[0])):
        if not entry.get("admitted"):
            continue
        b, s, d, h, ffn, layers = key[:6]
        plan = dict(entry["plan"])
        if s * d > 100_000 * 512:
            continue  # case 14: judged by `autotune long`, not here
        items.append((f"table case {entry['case']}", _shape(min(b, 16), s, d, h, ffn, 2), plan))
        if b > 16:
            full = _shape(b, s, d, h, ffn, layers)
            items.append((f"table case {entry['case']} full", full, plan))
    return items


def space_items() -> list[tuple[str, str, dict]]:
    items = []
    dims = {8: (128, 16), 32: (128, 4), 64: (128, 2), 128: (128, 1)}  # head dim: d, heads
    for hd, (d, h) in dims.items():
        full = hd == 32  # every setting at the common head dim, a cross-section elsewhere
        for bm, bn, warps, stages in itertools.product(
            TILES, TILES, (4, 8), (1, 2, 3) if full else (2,)
        ):
            if not full and bn == 64:
                continue
            tiles = {"attn_block_m": bm, "attn_block_n": bn, "attn_warps": warps}
            tiles["attn_stages"] = stages
            shape = _shape(4, 128, d, h, d, 1)
            items.append((f"heads hd{hd}", shape, dict(FP16, fused_layer="heads", **tiles)))
            if full:
                items.append((f"rows hd{hd}", _shape(2, 256, d, h, d, 1),
                              dict(FP16, fused_layer="rows", **tiles)))  # fmt: skip
    for rb, rw in itertools.product((16, 32, 64, 128), (2, 4, 8)):
        for d, h in ((128, 4), (32, 4)):
            plan = dict(FP16, fused_layer="heads", row_block=rb, row_warps=rw)
            items.append((f"post rows d{d}", _shape(4, 128, d, h, d, 1), plan))
    for bm, warps, stages in itertools.product(TILES, (4, 8), (1, 2, 3)):
        plan = dict(FP16, fused_block=True, attn_block_m=bm, attn_warps=warps, attn_stages=stages)
        items.append(("fused block", _shape(4, 128, 128, 4, 128, 1), plan))
    return items


CHILD = r"""
import json, os, sys, dataclasses, torch
from autotune.build import build_candidate, not_supported_reasons
from autotune.core.cases import parse_custom
from autotune.core.device import detect_device
from autotune.core.reference import (
    build_reference, check_outputs, generate_random_case, official_settings)
from autotune.plan import Plan
items = json.load(open(sys.argv[1]))
device = detect_device("auto")
where = device.torch_device
refs = {}
for i in range(int(sys.argv[2]), len(items)):
    label, shape, plan_dict = items[i]
    config = parse_custom(shape).config
    plan = dataclasses.replace(Plan.from_dict(plan_dict), cuda_graph=False)
    why = not_supported_reasons(plan, config, device)
    if why:
        print(f"SKIP {i} {'; '.join(why)[:200]}", flush=True)
        continue
    print(f"START {i}", flush=True)
    if os.environ.get("SWEEP_FAIL_ITEM") == str(i):  # the parent's restart path, tested
        raise RuntimeError(f"injected failure at item {i}")
    if shape not in refs:
        refs = {shape: build_reference(config, where).eval()}
    ref = refs[shape]
    x, padded = generate_random_case(config, where, seed=3, padding_ratio=0.3)
    general = torch.rand(padded.shape, device=where) > 0.2
    general[:, 0] = True
    with official_settings(), torch.inference_mode():
        cand = build_candidate(plan, config, device, ref.state_dict())
        got = cand(x, padded)
        cand(x, general)
        small = x.shape[0] * x.shape[1] <= 4096
        report = "not compared"
        if small:
            r = check_outputs(got, ref(x, padded))
            report = ("PASS " if r.passed else "WRONG ") + r.summary()
        if where.type == "cuda":
            torch.cuda.synchronize()
    del cand, got
    print(f"OK {i} {report}", flush=True)
"""


def run_shard(items: list, shard: int, out_dir: Path, deadline: float, sanitizer: list[str]):
    """Run one shard's items to the end (or the deadline); yields result rows."""
    path = out_dir / f"items_{shard}.json"
    path.write_text(json.dumps(items))
    start = 0
    while start < len(items) and time.time() < deadline:
        log = out_dir / f"shard{shard}_from{start}.log"
        with log.open("w") as fh:
            try:
                proc = subprocess.run(
                    [*sanitizer, sys.executable, "-c", CHILD, str(path), str(start)],
                    stdout=subprocess.PIPE,
                    stderr=fh,
                    text=True,
                    timeout=max(5.0, deadline - time.time()),
                    check=False,
                    cwd=ROOT,
                )
                stdout, returncode = proc.stdout, proc.returncode
            except subprocess.TimeoutExpired as exc:  # the deadline: the item is not judged
                out = exc.stdout or ""
                stdout = out.decode() if isinstance(out, bytes) else out
                returncode = None
        started = None
        for line in stdout.splitlines():
            word, _, rest = line.partition(" ")
            idx, _, detail = rest.partition(" ")
            if word == "START":
                started = int(idx)
            elif word in ("OK", "SKIP"):
                i = int(idx)
                verdict = "clean" if word == "OK" else "unsupported"
                if word == "OK" and detail.startswith("WRONG"):
                    verdict = "wrong"  # no memcheck finding, but outputs over the rule
                yield (*items[i], verdict, detail)
                started = None
                start = i + 1
        if returncode is None:
            break  # the deadline: unfinished items are reported "not run"
        if returncode == 0 and started is None:
            break
        if started is None:  # failed before any item started
            yield ("child", "", {}, "error", f"exit {returncode}; see {log.name}")
            break
        # compute-sanitizer reports on stdout, the child's tracebacks go to the log
        finding = _first_finding(stdout) or _first_finding(log.read_text(errors="replace"))
        verdict = "memcheck" if finding else "error"
        yield (*items[started], verdict, finding or _last_line(log))
        start = started + 1


def _first_finding(text: str) -> str:
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("========= ") and ("Invalid" in line or "Program hit" in line):
            where = next((x.strip(" =") for x in lines[i + 1 : i + 3] if " at " in x), "")
            return f"{line.strip(' =')} {where}"
    return ""


def _last_line(log: Path) -> str:
    lines = [x for x in log.read_text(errors="replace").splitlines() if x.strip()]
    return lines[-1][:300] if lines else ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table", default=str(ROOT / "tables" / "h200.py"))
    parser.add_argument("--out", default="memcheck.csv")
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--deadline", type=float, default=400, help="seconds from start")
    parser.add_argument("--no-space", action="store_true", help="the table's plans only")
    parser.add_argument("--list", action="store_true")
    parser.add_argument("--limit", type=int, help="the first N items only")
    parser.add_argument("--no-sanitizer", action="store_true", help="plain runs (CPU tests)")
    args = parser.parse_args()
    items = table_items(args.table) + ([] if args.no_space else space_items())
    items = items[: args.limit] if args.limit else items
    if args.list:
        for label, shape, plan in items:
            print(label, shape, json.dumps(plan, sort_keys=True))
        print(len(items), "items")
        return 0
    sanitizer = []
    if not args.no_sanitizer:
        tool = shutil.which("compute-sanitizer") or "/usr/local/cuda/bin/compute-sanitizer"
        sanitizer = [tool, "--tool", "memcheck", "--error-exitcode", "9", "--print-limit", "4"]
    out = Path(args.out)
    logs = out.with_suffix(".logs")
    logs.mkdir(parents=True, exist_ok=True)
    deadline = time.time() + args.deadline
    shards = [items[i :: args.shards] for i in range(args.shards)]
    import concurrent.futures as cf

    rows = []
    with cf.ThreadPoolExecutor(len(shards)) as pool:
        futures = [
            pool.submit(lambda s, i: list(run_shard(s, i, logs, deadline, sanitizer)), s, i)
            for i, s in enumerate(shards)
        ]
        for f in futures:
            rows += f.result()
    done = {(r[0], r[1], json.dumps(r[2], sort_keys=True)) for r in rows}
    for label, shape, plan in items:
        if (label, shape, json.dumps(plan, sort_keys=True)) not in done:
            rows.append((label, shape, plan, "not run", "deadline"))
    with out.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["item", "shape", "plan", "verdict", "detail"])
        for label, shape, plan, verdict, detail in rows:
            w.writerow([label, shape, json.dumps(plan, sort_keys=True), verdict, detail])
    counts: dict[str, int] = {}
    for r in rows:
        counts[r[3]] = counts.get(r[3], 0) + 1
    print(" ".join(f"{k}={v}" for k, v in sorted(counts.items())), f"of {len(rows)} -> {out}")
    for r in rows:
        if r[3] in ("memcheck", "error", "wrong"):
            print(f"{r[3]}: {r[0]} {r[1]} {json.dumps(r[2], sort_keys=True)}: {r[4]}")
    os.sync()
    return 0


if __name__ == "__main__":
    sys.exit(main())
