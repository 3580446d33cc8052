"""Rows of the eval tables as plain dicts (for --json) and as an aligned text table."""

from __future__ import annotations

from kvscope.app.evals.compare import PasskeyRow, PerplexityRow


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


def render(table: list[dict], header: bool = True) -> str:
    """Aligned text rows (fixed minimum widths, so rows printed case by case line up)."""
    if not table:
        return ""
    columns = list(table[0])
    widths = [max(len(c), 8) for c in columns]
    lines = [_line(columns, widths)] if header else []
    lines += [_line([str(row[c]) for c in columns], widths) for row in table]
    return "\n".join(lines)


def _line(cells: list[str], widths: list[int]) -> str:
    return "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()
