"""Rows of the eval tables as plain dicts (for --json) and as an aligned text table."""

from __future__ import annotations

from app.evals.compare import PasskeyRow, PerplexityRow


def passkey_table(rows: list[PasskeyRow]) -> list[dict]:
    return [
        {
            "tokens": r.num_tokens,
            "depth": r.depth,
            "mode": r.mode,
            "key": r.key,
            "answer": r.answer.strip(),
            "correct": r.correct,
            "resident_kv_bytes": r.resident_bytes,
            "resident_fraction": round(r.resident_fraction, 4),
        }
        for r in rows
    ]


def perplexity_table(rows: list[PerplexityRow]) -> list[dict]:
    full = {r.num_tokens: r.perplexity for r in rows if r.mode == "full"}
    return [
        {
            "tokens": r.num_tokens,
            "mode": r.mode,
            "perplexity": round(r.perplexity, 4),
            "vs_full_pct": round(100 * (r.perplexity / full[r.num_tokens] - 1), 2),
            "top1_agreement": round(r.top1_agreement, 4),
            "resident_kv_bytes": r.resident_bytes,
            "resident_fraction": round(r.resident_fraction, 4),
        }
        for r in rows
    ]


def render(table: list[dict]) -> str:
    if not table:
        return ""
    columns = list(table[0])
    cells = [[str(row[c]) for c in columns] for row in table]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(lines)
