"""Summarise an Nsight Compute source page (``ncu -i R --page source --csv --print-source
sass``): where one kernel's warps were sampled, by stall reason, by opcode and by SASS
instruction (the PC sampling of the SourceCounters section).

    python3 scripts/ncu_summary.py docs/logs/s31/ncu_src_c6_heads.csv [--top 30]
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections import Counter


def read(path: str) -> tuple[list[str], list[list[str]]]:
    """The header and the SASS rows (those with an address) of the source page."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    head_at = next(i for i, r in enumerate(rows) if "Address" in r and "# Samples" in r)
    head = rows[head_at]
    addr = head.index("Address")
    body = [r for r in rows[head_at + 1 :] if len(r) == len(head) and r[addr].startswith("0x")]
    return head, body


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=25, help="instructions to list (default 25)")
    args = ap.parse_args(argv)
    try:
        head, body = read(args.csv)
    except (OSError, StopIteration) as e:
        why = e or "no header"
        fix = "export one with --page source --csv --print-source sass"
        print(f"ncu_summary: {args.csv} is not an ncu source page ({why}); {fix}", file=sys.stderr)
        return 2
    src = head.index("Address") + 1  # the SASS text follows the address
    n_at = head.index("# Samples")
    stalls = [
        (i, h) for i, h in enumerate(head) if h.startswith("stall_") and "Not Issued" not in h
    ]

    def num(v: str) -> float:
        try:
            return float(v)
        except ValueError:
            return 0.0

    total = sum(num(r[n_at]) for r in body)
    print(f"{args.csv}: {len(body)} SASS instructions, {total:.0f} samples")
    if not total:
        return 0
    by_reason = Counter({h[6:]: sum(num(r[i]) for r in body) for i, h in stalls})
    shares = [f"{k} {v / total:.1%}" for k, v in by_reason.most_common(9) if v]
    print("by reason: " + ", ".join(shares))
    ops = Counter()
    for r in body:  # the opcode without its guard predicate and modifiers
        words = [w for w in r[src].split() if not w.startswith("@")]
        ops[words[0].split(".")[0] if words else "?"] += num(r[n_at])
    print("by opcode: " + ", ".join(f"{k} {v / total:.1%}" for k, v in ops.most_common(12)))
    print(f"top {args.top} instructions (samples, share, first reasons):")
    ranked = sorted(range(len(body)), key=lambda j: -num(body[j][n_at]))[: args.top]
    for j in ranked:
        r = body[j]
        why = sorted(((num(r[i]), h[6:]) for i, h in stalls), reverse=True)[:3]
        reasons = " ".join(f"{h} {v / max(num(r[n_at]), 1):.0%}" for v, h in why if v)
        n = num(r[n_at])
        print(f"  {j:5d} {n:7.0f} {n / total:5.1%}  {r[src].strip()[:60]:60s} {reasons}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
