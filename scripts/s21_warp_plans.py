"""Write the plans of scripts/h200_s21_warps.sh: per case, tables/h200.py's entry, the entry
with 8 warps in the attention kernel, in the row kernels and in both, and the chained rows
form (16-row tiles, 8 row warps). A plan the support rules refuse on the H200 is left out
with its reason.

    python3 scripts/s21_warp_plans.py OUT_DIR CASE [CASE ...]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from autotune.core.cases import get_case
from autotune.plan import parse_plan
from autotune.runtime import load_table


def variants(entry: dict, seq_len: int) -> dict[str, dict]:
    rows = {
        "attention": "triton",
        "fused_layer": "rows",
        "attn_precision": "fp16",
        "gemm_precision": "fp16",
        "attn_block_m": 32,
        "attn_block_n": min(64, seq_len),
        "attn_stages": 2,
        "row_block": 16,
        "row_warps": 8,
        "row_next_qkv": True,
        "cuda_graph": True,
    }
    return {
        "entry": entry,
        "aw8": dict(entry, attn_warps=8),
        "rw8": dict(entry, row_warps=8),
        "aw8rw8": dict(entry, attn_warps=8, row_warps=8),
        "rows_chain": rows,
    }


def main() -> None:
    out = Path(sys.argv[1])
    table = load_table("tables/h200.py")
    for case_id in sys.argv[2:]:
        entry = next(e["plan"] for e in table.entries.values() if e.get("case") == case_id)
        seq_len = get_case(case_id).config.seq_len
        for name, plan in variants(dict(entry), seq_len).items():
            parse_plan(json.dumps(plan))  # refuses unknown knobs and values
            path = out / f"s21_c{case_id}_{name}.json"
            path.write_text(json.dumps(plan))
            print(f"case {case_id} {name}: {json.dumps(plan, sort_keys=True)}")


if __name__ == "__main__":
    main()
