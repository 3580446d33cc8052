"""Rejection reasons of ``kvscope run``: one line per distinct reason, counted."""

from __future__ import annotations

from kvscope.app.run_job import group_reasons


def test_reasons_that_differ_only_in_numbers_are_one_line_with_their_range():
    budget = "needs more than the whole KV budget (34 pages x 16 tokens)"
    reasons = [
        f"prompt of 968 tokens {budget}",
        "empty prompt",
        f"prompt of 931 tokens {budget}",
        f"prompt of 940 tokens {budget}",
    ]
    assert group_reasons(reasons) == [
        (3, f"prompt of 931-968 tokens {budget}"),
        (1, "empty prompt"),
    ]


def test_identical_reasons_keep_their_numbers_and_no_reasons_give_no_lines():
    same = "prompt of 9000 tokens does not fit the model's context of 8192"
    assert group_reasons([same, same]) == [(2, same)]
    assert group_reasons([]) == []
