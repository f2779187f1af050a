"""Summarise an Nsight Compute source page (``ncu -i R --page source --csv --print-source
sass``): where one kernel's warps were sampled, by stall reason, by opcode and by SASS
instruction (the PC sampling of the SourceCounters section); with ``--against`` another
kernel's page beside it, reason by reason and opcode by opcode (the samples of two pages
taken at one sampling interval count time: the difference says where a slower kernel's
extra time went).

With ``--producers`` each listed instruction stalled on a scoreboard (long: global or
local memory; short: shared memory, special functions, shuffles) names what it waits for,
read from the SASS text: the nearest earlier variable-latency instruction that writes one
of its source registers, or the nearest earlier memory instruction that still reads a
register it overwrites (a store's data, an address). Session 33 found two such waits by
hand: descriptors reloaded from local memory (``LDL``) before each ``R2UR``, and a
reciprocal waiting for 16 loads to take the address register it reused.

    python3 scripts/ncu_summary.py docs/logs/s31/ncu_src_c6_heads.csv [--top 30]
    python3 scripts/ncu_summary.py ncu_src_c6_post.csv --producers
    python3 scripts/ncu_summary.py ncu_src_c6_heads.csv --against ncu_src_c6_heads_pipeline.csv
"""

from __future__ import annotations

import argparse
import csv
import re
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


def _num(v: str) -> float:
    try:
        return float(v)
    except ValueError:
        return 0.0


def stall_columns(head: list[str]) -> list[tuple[int, str]]:
    """The page's stall reason columns (all samples, not the Not Issued ones)."""
    return [(i, h) for i, h in enumerate(head) if h.startswith("stall_") and "Not Issued" not in h]


def tallies(head: list[str], body: list[list[str]]) -> tuple[float, Counter, Counter]:
    """A page's samples: in all, by stall reason, by opcode (without its guard predicate
    and modifiers)."""
    src = head.index("Address") + 1  # the SASS text follows the address
    n_at = head.index("# Samples")
    stalls = stall_columns(head)
    total = sum(_num(r[n_at]) for r in body)
    by_reason = Counter({h[6:]: sum(_num(r[i]) for r in body) for i, h in stalls})
    ops: Counter = Counter()
    for r in body:
        words = [w for w in r[src].split() if not w.startswith("@")]
        ops[words[0].split(".")[0] if words else "?"] += _num(r[n_at])
    return total, by_reason, ops


# SASS without a destination register: stores, copies, barriers, branches, fences
_NO_DEST = ("ST", "RED", "LDGSTS", "BAR", "BRA", "BSSY", "BSYNC", "WARPGROUP", "FENCE",
            "MEMBAR", "DEPBAR", "EXIT", "NOP", "CALL", "RET", "ERRBAR", "LDGDEPBAR")  # fmt: skip
# variable latency: their results are tracked by a scoreboard
_VARIABLE = ("LD", "MUFU", "SHFL", "S2R", "ATOM", "RED", "HGMMA", "I2F", "F2I", "F2F",
             "POPC", "FLO", "BREV")  # fmt: skip
_MEMORY = ("LD", "ST", "ATOM", "RED")
_REG = re.compile(r"\bR(\d+)(\.64)?\b")


def _width(opcode: str) -> int:
    """Registers an instruction's data operand spans, from its opcode's modifiers."""
    if opcode.startswith("HGMMA"):
        shape = re.match(r"HGMMA\.(\d+)x(\d+)x", opcode)
        return int(shape.group(2)) // 2 if shape else 1
    if re.search(r"\.M88\.4|\.128", opcode):
        return 4
    if re.search(r"\.M88\.2|\.64", opcode):
        return 2
    return 1


def operands(sass: str) -> tuple[str, set[int], set[int]]:
    """An instruction's opcode (with modifiers, without its guard), the registers it
    writes and the registers it reads (``RZ`` neither; a ``.64`` register is a pair; the
    data operand as wide as the opcode's modifiers say)."""
    words = sass.replace(";", "").split(None, 1)
    if words and words[0].startswith("@"):
        words = words[1].split(None, 1) if len(words) > 1 else []
    if not words:
        return "?", set(), set()
    opcode, rest = words[0], (words[1] if len(words) > 1 else "")
    parts = [p.strip() for p in rest.split(",")]
    width = _width(opcode)

    def regs(text: str, data: bool) -> set[int]:
        out: set[int] = set()
        for m in _REG.finditer(text):
            base = int(m.group(1))
            n = 2 if m.group(2) else (width if data and "[" not in text else 1)
            out.update(range(base, base + n))
        return out

    if opcode.startswith(_NO_DEST) or not parts or not _REG.match(parts[0]):
        return opcode, set(), set().union(*(regs(p, True) for p in parts)) if parts else set()
    dest = regs(parts[0], True)
    reads = set().union(*(regs(p, True) for p in parts[1:])) if parts[1:] else set()
    return opcode, dest, reads


def producers(body: list[list[str]], src: int, j: int, window: int = 400) -> list[str]:
    """What instruction ``j`` waits for, from the SASS before it (straight-line code: a
    producer later in a loop's body is not followed): for each register it reads, the
    nearest earlier writer if that is a variable-latency instruction; for each register it
    writes, the nearest earlier memory instruction that reads it (a store's data or an
    address, held until the memory pipe takes the instruction)."""
    _, writes, reads = operands(body[j][src])
    found: list[str] = []
    pending_raw, pending_war = set(reads), set(writes)
    for i in range(j - 1, max(-1, j - 1 - window), -1):
        opcode, w, r = operands(body[i][src])
        hit = w & pending_raw
        if hit:
            pending_raw -= hit
            if opcode.startswith(_VARIABLE):
                regs = ",".join(f"R{x}" for x in sorted(hit))
                found.append(f"{i}: {body[i][src].strip()[:60]} (writes {regs})")
        war = r & pending_war
        if war and opcode.startswith(_MEMORY):
            regs = ",".join(f"R{x}" for x in sorted(war))
            found.append(f"{i}: {body[i][src].strip()[:60]} (reads {regs}, overwritten here)")
        pending_war -= w | war
        if not pending_raw and not pending_war:
            break
    return found[:3]


def compare(a: tuple[float, Counter, Counter], b: tuple[float, Counter, Counter]) -> list[str]:
    """Lines of two pages side by side: samples by reason and by opcode in each, and the
    second's minus the first's as a share of the first's total (the reasons and opcodes
    where the second spent more time first)."""
    (ta, ra, oa), (tb, rb, ob) = a, b
    lines = [f"samples: {ta:.0f} -> {tb:.0f} ({tb / ta - 1:+.1%})" if ta else "no samples"]
    for title, ca, cb in (("reason", ra, rb), ("opcode", oa, ob)):
        keys = sorted(set(ca) | set(cb), key=lambda k: -abs(cb[k] - ca[k]))[:10]
        lines.append(f"by {title}, largest changes first (first, second, change / first's total):")
        for k in keys:
            if ca[k] or cb[k]:
                lines.append(
                    f"  {k:16s} {ca[k]:8.0f} {cb[k]:8.0f}  {(cb[k] - ca[k]) / max(ta, 1):+7.1%}"
                )
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=25, help="instructions to list (default 25)")
    ap.add_argument("--against", metavar="CSV", help="another page: the two side by side")
    ap.add_argument(
        "--producers",
        action="store_true",
        help="under each listed instruction stalled on a scoreboard, what it waits for",
    )
    args = ap.parse_args(argv)
    pages = []
    for path in [args.csv] + ([args.against] if args.against else []):
        try:
            pages.append(read(path))
        except (OSError, StopIteration) as e:
            why = e or "no header"
            fix = "export one with --page source --csv --print-source sass"
            print(f"ncu_summary: {path} is not an ncu source page ({why}); {fix}", file=sys.stderr)
            return 2
    if args.against:
        print(f"{args.csv} -> {args.against}")
        print("\n".join(compare(*(tallies(*p) for p in pages))))
        return 0
    head, body = pages[0]
    src = head.index("Address") + 1
    n_at = head.index("# Samples")
    stalls = stall_columns(head)
    total, by_reason, ops = tallies(head, body)
    print(f"{args.csv}: {len(body)} SASS instructions, {total:.0f} samples")
    if not total:
        return 0
    shares = [f"{k} {v / total:.1%}" for k, v in by_reason.most_common(9) if v]
    print("by reason: " + ", ".join(shares))
    print("by opcode: " + ", ".join(f"{k} {v / total:.1%}" for k, v in ops.most_common(12)))
    print(f"top {args.top} instructions (samples, share, first reasons):")
    ranked = sorted(range(len(body)), key=lambda j: -_num(body[j][n_at]))[: args.top]
    for j in ranked:
        r = body[j]
        why = sorted(((_num(r[i]), h[6:]) for i, h in stalls), reverse=True)[:3]
        reasons = " ".join(f"{h} {v / max(_num(r[n_at]), 1):.0%}" for v, h in why if v)
        n = _num(r[n_at])
        print(f"  {j:5d} {n:7.0f} {n / total:5.1%}  {r[src].strip()[:60]:60s} {reasons}")
        if args.producers and why and why[0][0] and why[0][1] in ("long_sb", "short_sb"):
            for line in producers(body, src, j):
                print(f"          waits on {line}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
