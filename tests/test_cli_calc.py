"""``kvscope calc``, ``calc offload``, ``calc cliff`` and ``kvscope simulate`` through the real CLI."""

from __future__ import annotations

import json

import pytest

from kvscope.app.cli import main

GIB = 1 << 30
LLAMA_ON_80 = [
    "calc",
    "--preset",
    "llama3-8b",
    "--memory-gib",
    "80",
    "--weights-gib",
    "16",
    "--overhead-gib",
    "0",
    "--input-tokens",
    "1024",
    "--output-tokens",
    "1024",
]


def run_json(capsys, *argv: str) -> dict:
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def run_error(capsys, *argv: str) -> str:
    assert main(list(argv)) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0, "errors are one line"
    return err


def test_calc_json_shows_the_llama3_8b_figures(capsys):
    r = run_json(capsys, *LLAMA_ON_80, "--max-model-len", "3072")
    assert r["kv_bytes_per_token"] == 131_072
    assert r["avg_tokens_per_request"] == 1536
    assert r["kv_bytes_per_request"] == 192 << 20
    assert r["kv_budget_bytes"] == 64 * GIB
    assert r["max_avg_batch"] == 341
    assert r["max_batch_max_reservation"] == 170
    assert r["tokens_in_budget"] == 512 * 1024
    assert r["by_kv_heads"]["MHA"] == {
        "kv_heads": 32,
        "kv_bytes_per_token": 524_288,
        "kv_bytes_per_request": 768 << 20,
        "max_avg_batch": 85,
        "max_batch_max_reservation": 42,
        "tokens_in_budget": 128 * 1024,
    }
    assert r["by_kv_heads"]["GQA"]["max_avg_batch"] == 341
    assert r["by_kv_heads"]["MQA"]["kv_bytes_per_token"] == 16_384
    assert r["by_kv_dtype"]["fp8_e4m3"]["max_avg_batch"] == 682
    assert "kv_bytes_total" not in r


def test_calc_defaults_to_1_5_gib_overhead_and_the_models_context_for_reservation(capsys):
    argv = [a for a in LLAMA_ON_80 if a not in ("--overhead-gib", "0")]
    r = run_json(capsys, *argv)
    assert r["overhead_bytes"] == 1.5 * GIB
    assert r["kv_budget_bytes"] == 62.5 * GIB
    assert r["max_model_len"] == 8192
    assert r["max_batch_max_reservation"] == 62  # 62.5 GiB / (8192 x 128 KiB), floored


def test_calc_weights_from_parameters_and_their_dtype(capsys):
    argv = [*LLAMA_ON_80[:3], "--device", "h100-80", "--overhead-gib", "0"]
    fp16 = run_json(capsys, *argv)
    int4 = run_json(capsys, *argv, "--weight-dtype", "int4")
    assert fp16["weights_bytes"] == 2 * 8_030_261_248
    assert int4["weights_bytes"] == 8_030_261_248 // 2
    assert fp16["memory_bytes"] == round(79.65 * GIB)
    assert int4["max_avg_batch"] > fp16["max_avg_batch"]


def test_calc_70b_class_mha_shape_needs_160_gib_for_16_by_4096_tokens(capsys):
    r = run_json(
        capsys,
        "calc",
        *("--layers", "80", "--q-heads", "64", "--kv-heads", "64", "--head-dim", "128"),
        *("--params", "70B", "--device", "h200-141", "--seq-len", "4096", "--batch", "16"),
    )
    assert r["kv_bytes_total"] == 160 * GIB
    assert r["model"]["params"] == 70_000_000_000
    assert r["by_kv_heads"]["MHA"]["kv_bytes_per_token"] == r["kv_bytes_per_token"]


def test_calc_human_output_is_an_aligned_table_with_the_figures(capsys):
    assert main([*LLAMA_ON_80, "--max-model-len", "3072"]) == 0
    out = capsys.readouterr().out
    assert "GiB = 2^30" in out
    assert "CUDA context, cuBLAS workspace and NCCL buffers cost 1-2 GiB" in out
    for line in ("KV bytes per token", "max average batch", "batch under max reservation"):
        assert any(row.startswith(line) for row in out.splitlines()), line
    assert "128 KiB" in out and "192 MiB" in out and "64.00" in out
    mha = next(row for row in out.splitlines() if row.startswith("MHA"))
    assert mha.split() == ["MHA", "32", "524,288", "85", "42", "131,072"]


def test_calc_reads_a_hugging_face_config(capsys, tmp_path):
    config = tmp_path / "config.json"
    config.write_text(
        json.dumps(
            {
                "model_type": "qwen2",
                "hidden_size": 3584,
                "intermediate_size": 18944,
                "num_attention_heads": 28,
                "num_key_value_heads": 4,
                "num_hidden_layers": 28,
                "vocab_size": 152064,
            }
        )
    )
    r = run_json(capsys, "calc", "--config", str(config), "--device", "a100-80")
    assert r["model"]["params"] == 7_615_616_512
    assert r["kv_bytes_per_token"] == 2 * 4 * 128 * 28 * 2


@pytest.mark.parametrize(
    "argv, message",
    [
        (["calc", "--device", "h100-80"], "name one model"),
        (["calc", "--preset", "llama3-8b", "--layers", "3"], "name one model"),
        (["calc", "--preset", "llama9"], "unknown model preset 'llama9'"),
        (["calc", "cliff", "--preset", "llama3-8b"], "the cliff needs a device"),
        (
            ["calc", "cliff", "--preset", "llama3-8b", "--memory-gib", "80"],
            "--tflops and --hbm-gbps",
        ),
        (["calc", "--preset", "llama3-8b", "--device", "tpu"], "unknown device 'tpu'"),
        (["calc", "--layers", "2", "--kv-heads", "2", "--head-dim", "8"], "also needs --q-heads"),
        (
            ["calc", "--layers", "2", "--q-heads", "4", "--kv-heads", "2", "--head-dim", "8"]
            + ["--device", "l4"],
            "the KV budget needs the weights' size",
        ),
        (["calc", "--preset", "llama3-8b", "--device", "l4", "--batch", "2"], "--batch needs"),
        (["calc", "--config", "/nonexistent/config.json", "--device", "l4"], "no config.json"),
        (["calc", "--gguf", "/nonexistent.gguf", "--device", "l4"], "no GGUF file"),
        (["calc", "offload", "--preset", "llama3-8b"], "--pcie-gbps and --tflops"),
    ],
)
def test_calc_bad_input_is_one_clear_line(capsys, argv, message):
    assert message in run_error(capsys, *argv)


@pytest.mark.parametrize(
    "argv",
    [
        ["calc", "--preset", "llama3-8b", "--device", ""],
        ["calc", "--preset", "llama3-8b", "--device", "  "],
        ["calc", "cliff", "--preset", "llama3-8b", "--device", ""],
        ["calc", "offload", "--preset", "llama3-8b", "--device", ""],
    ],
)
def test_a_blank_device_is_an_error_naming_the_flag(capsys, argv):
    """``--device ''`` had been taken as no device: a hint to add one, and exit 0."""
    err = run_error(capsys, *argv)
    assert err.startswith("kvscope: error: argument --device: needs a device name, got '")


def test_pure_size_question_needs_no_device_nor_parameter_count(capsys):
    shape = ("--layers", "80", "--q-heads", "64", "--kv-heads", "64", "--head-dim", "128")
    r = run_json(capsys, "calc", *shape, "--seq-len", "4096", "--batch", "16")
    assert r["kv_bytes_total"] == 160 * GIB
    assert r["kv_bytes_per_token"] == 2 * 64 * 128 * 80 * 2
    assert r["device"] is None and "kv_budget_bytes" not in r and "max_avg_batch" not in r
    assert r["by_kv_dtype"]["fp8_e4m3"]["kv_bytes_per_token"] == r["kv_bytes_per_token"] / 2
    assert main(["calc", *shape, "--seq-len", "4096", "--batch", "16"]) == 0
    out = capsys.readouterr().out
    total = next(row for row in out.splitlines() if row.startswith("KV for 16 x 4,096 tokens"))
    assert total.split()[-2:] == ["160", "GiB"]
    assert "add --device NAME" in out and "max average batch" not in out


def test_preset_without_device_gives_bytes_per_token_and_per_request(capsys):
    r = run_json(capsys, "calc", "--preset", "llama3-8b")
    assert r["kv_bytes_per_token"] == 131_072 and r["kv_bytes_per_request"] == 192 << 20
    assert r["by_kv_heads"]["MHA"] == {
        "kv_heads": 32,
        "kv_bytes_per_token": 524_288,
        "kv_bytes_per_request": 768 << 20,
    }


SEED_H100 = ("--memory-gib", "80", "--weights-gib", "16", "--overhead-gib", "0")
SEED_SPEEDS = ("--tflops", "1000", "--hbm-gbps", "3000")


def test_cliff_with_the_seed_notes_round_h100_figures(capsys):
    r = run_json(
        capsys,
        "calc",
        "cliff",
        "--preset",
        "llama3-8b",
        "--device",
        "h100-80",
        *SEED_H100,
        *SEED_SPEEDS,
    )
    assert r["kv_budget_bytes"] == 64 * GIB
    assert round(r["compute_bound_batch"]) == 333
    fp16, fp8 = r["scenarios"]["fp16 KV"], r["scenarios"]["fp8_e4m3 KV"]
    assert fp16["batch_at_input_output"] == 341 and fp8["batch_at_input_output"] == 682
    assert fp16["cliff_context_len"] == 2092
    assert fp8["cliff_context_len"] == 4185
    assert fp16["batches"][r["contexts"].index(2048)] == 341


def test_cliff_with_the_presets_own_h100_figures(capsys):
    r = run_json(capsys, "calc", "cliff", "--preset", "llama3-8b", "--device", "h100-80")
    assert r["tflops"] == 989 and r["hbm_gbps"] == 3350
    assert r["compute_bound_batch"] == pytest.approx(989e12 / 3350e9)  # 295
    assert r["kv_budget_bytes"] == round(79.65 * GIB) - 2 * 8_030_261_248 - 1.5 * GIB
    fp16 = r["scenarios"]["fp16 KV"]
    assert fp16["batch_at_input_output"] == 337
    # 63.19 GiB / 128 KiB = 517,632 tokens over 296 requests of 0.75 L tokens
    assert fp16["cliff_context_len"] == 2331
    assert r["contexts"] == [1 << p for p in range(10, 18)]
    assert main(["calc", "cliff", "--preset", "llama3-8b", "--device", "h100-80"]) == 0
    out = capsys.readouterr().out
    assert "989 TFLOP/s / 3,350 GB/s = 295" in out
    cliff_row = next(row for row in out.splitlines() if row.startswith("cliff at"))
    assert cliff_row.split()[2:] == ["2,331", "4,663"]


def test_cliff_with_an_infllm_resident_budget_and_int4_kv(capsys):
    argv = ["calc", "cliff", "--preset", "llama3-8b", "--device", "h100-80", *SEED_H100]
    r = run_json(capsys, *argv, *SEED_SPEEDS, "--kv-dtype", "int4", "--resident-tokens", "1024")
    assert list(r["scenarios"]) == [
        "fp16 KV",
        "int4 KV",
        "fp16 KV, InfLLM 1,024 resident",
        "int4 KV, InfLLM 1,024 resident",
    ]
    infllm = r["scenarios"]["fp16 KV, InfLLM 1,024 resident"]
    assert infllm["cliff_context_len"] is None  # 512 requests of 1,024 tokens at any length
    assert infllm["batches"][-1] == 512
    quarter = run_json(capsys, *argv, *SEED_SPEEDS, "--resident-tokens", "25%")
    assert quarter["scenarios"]["fp16 KV, InfLLM 25% resident"]["batch_at_input_output"] == 1365


def test_cliff_flags_before_the_subcommand_carry_over_and_a_plot_is_written(capsys, tmp_path):
    target = tmp_path / "cliff.html"
    argv = ["calc", "--preset", "llama3-8b", *SEED_H100, "cliff", *SEED_SPEEDS]
    r = run_json(capsys, *argv, "--max-context", "8192", "--plot", str(target))
    assert r["kv_budget_bytes"] == 64 * GIB and r["contexts"] == [1024, 2048, 4096, 8192]
    html = target.read_text()
    assert (
        "plotly" in html.lower() and "cliff at 2,092" in html and "compute-bound batch 333" in html
    )


@pytest.mark.parametrize("value", ["x", "0", "150%"])
def test_cliff_rejects_a_resident_budget_that_is_not_a_count_or_a_fraction(capsys, value):
    assert main(["calc", "cliff", "--preset", "llama3-8b", "--resident-tokens", value]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvscope: error: argument --resident-tokens") and err.count("\n") == 1


def test_calc_reports_when_weights_do_not_fit(capsys):
    r = run_json(capsys, "calc", "--preset", "llama3-70b", "--device", "rtx-4090")
    assert r["fits"] is False
    assert r["kv_budget_bytes"] == 0 and r["max_avg_batch"] == 0


def test_offload_8b_over_30_gbps_pcie_reloads_about_12x_cheaper(capsys):
    r = run_json(
        capsys,
        *("calc", "offload", "--params", "8e9", "--kv-width", "1024", "--layers", "32"),
        *("--dtype", "fp16", "--pcie-gbps", "30", "--tflops", "300"),
    )
    assert r["recompute_over_load"] == pytest.approx(12.2, abs=0.05)
    assert r["kv_bytes_per_token"] == 2 * 1024 * 32 * 2


def test_offload_from_presets_and_human_verdict(capsys):
    r = run_json(capsys, "calc", "offload", "--preset", "llama3-8b", "--device", "h100-80")
    expected = 64e9 * 8_030_261_248 / (2 * 1024 * 32 * 989e12)
    assert r["recompute_over_load"] == pytest.approx(expected)
    assert main(["calc", "offload", "--preset", "smollm2-135m", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "T_recompute / T_load" in out and "cheaper than" in out


def test_simulate_json_has_three_allocators_in_order(capsys):
    r = run_json(capsys, "simulate", "--requests", "60")
    assert list(r) == ["max_reservation", "doubling", "paged"]
    for figures in r.values():
        assert {"utilization", "max_batch", "external_fragmentation", "bytes_copied"} <= set(
            figures
        )
    assert (
        r["paged"]["utilization"]
        > r["doubling"]["utilization"]
        > r["max_reservation"]["utilization"]
    )
    assert r["max_reservation"]["max_batch"] == 16384 // 2048


def test_simulate_budget_in_gib_page_size_and_a_jsonl_trace(capsys, tmp_path):
    trace = tmp_path / "trace.jsonl"
    trace.write_text("\n".join(json.dumps({"prompt_len": 100, "output_len": 28}) for _ in range(8)))
    argv = ["simulate", "--trace", str(trace), "--kv-gib", "0.125", "--max-model-len", "128"]
    r = run_json(capsys, *argv, "--page-size", "128")
    # 0.125 GiB / 128 KiB per token = 1024 slots: eight 128-token requests fit exactly
    assert r["paged"]["capacity_slots"] == 1024
    assert r["paged"]["max_batch"] == r["max_reservation"]["max_batch"] == 8
    assert r["paged"]["utilization"] == pytest.approx(r["max_reservation"]["utilization"])


def test_simulate_writes_an_html_plot_and_rejects_other_formats(capsys, tmp_path):
    target = tmp_path / "sim.html"
    assert main(["simulate", "--requests", "20", "--plot", str(target)]) == 0
    html = target.read_text()
    assert "plotly" in html.lower() and "token-slot utilization" in html
    assert "paged" in capsys.readouterr().out
    # checked with the arguments, before the simulation: a wrong suffix, or no name at all
    # (which had written nothing and said nothing), on each command that plots
    for command in (["simulate"], ["replay", "t.jsonl"], ["calc", "cliff"]):
        for name in (str(tmp_path / "x.svg"), ""):
            err = run_error(capsys, *command, "--plot", name)
            assert f"--plot: needs a file name ending in .html or .png, got {name!r}" in err


def test_simulate_bad_trace_names_the_line(capsys, tmp_path):
    trace = tmp_path / "bad.jsonl"
    trace.write_text('{"prompt_len": 1, "output_len": 1}\n{"prompt_len": 0, "output_len": 1}\n')
    assert "bad.jsonl:2: prompt_len" in run_error(capsys, "simulate", "--trace", str(trace))


def test_simulate_a_budget_past_what_it_lays_out_is_one_line(capsys):
    """--kv-gib 1e12 had been a MemoryError (a list of every page, then an array of
    them for the page map); the largest budget it lays out still runs, quickly: pages
    never handed out are a counter."""
    err = run_error(capsys, "simulate", "--kv-gib", "1e12")
    assert "token slots of this model's KV" in err and "268,435,456" in err
    assert "at most 268,435,456" in run_error(capsys, "simulate", "--budget-tokens", str(10**11))
    r = run_json(capsys, "simulate", "--requests", "20", "--budget-tokens", str(1 << 28))
    assert r["paged"]["capacity_slots"] == 1 << 28 and r["paged"]["max_batch"] >= 20


def test_cliff_chart_labels_sit_on_their_lines_on_log_axes(capsys):
    """plotly reads annotation positions on log axes as log10: the labels must be converted."""
    import math

    from kvscope.app.cliff import cliff_figure

    assert main(["calc", "cliff", "--preset", "llama3-8b", "--device", "h100-80", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    fig = cliff_figure(report)
    hline = next(n for n in fig.layout.annotations if "compute-bound" in n.text)
    assert hline.y == pytest.approx(math.log10(report["compute_bound_batch"]))
    cliff = report["scenarios"]["fp16 KV"]["cliff_context_len"]
    vline = next(n for n in fig.layout.annotations if f"{cliff:,}" in n.text)
    assert vline.x == pytest.approx(math.log10(cliff))


def test_seq_len_is_used_throughout_and_an_mha_model_gets_a_real_gqa_row(capsys):
    shape = ("--layers", "80", "--q-heads", "64", "--kv-heads", "64", "--head-dim", "128")
    argv = ["calc", *shape, "--params", "70B", "--device", "h200-141"]
    r = run_json(capsys, *argv, "--seq-len", "4096", "--batch", "16")
    assert r["avg_tokens_per_request"] == 4096 and r["input_tokens"] is None
    assert r["tokens_in_budget"] // 4096 == r["max_avg_batch"]
    gqa = r["by_kv_heads"]["GQA"]
    assert gqa["kv_heads"] == 8 and gqa["kv_bytes_per_token"] == r["kv_bytes_per_token"] / 8
    assert main([*argv, "--seq-len", "4096", "--batch", "16"]) == 0
    out = capsys.readouterr().out
    assert "4,096 tokens per sequence" in out and "1,024 in" not in out
    gqa_row = next(line for line in out.splitlines() if line.startswith("GQA"))
    assert gqa_row.split()[1] == "8"


@pytest.mark.parametrize(
    "argv, fragment",
    [
        # head_dim 10^23 had printed KV bytes per token 27 digits wide, and exit 0.
        (["--layers", "32", "--q-heads", "32", "--kv-heads", "8", "--head-dim", "1" + "0" * 23],
         "argument --head-dim: must be at most 65,536"),
        (["--layers", "65537", "--q-heads", "32", "--kv-heads", "8", "--head-dim", "128"],
         "argument --layers: must be at most 65,536"),
        (["--preset", "llama3-8b", "--seq-len", str(2**40 + 1)],
         "argument --seq-len: must be at most 1,099,511,627,776"),
        (["offload", "--kv-width", "1" + "0" * 20, "--layers", "3", "--params", "8B"],
         "argument --kv-width: must be at most 16,777,216"),
        # --resident-tokens 1e30 had made each InfLLM column 50 characters wide.
        (["cliff", "--preset", "llama3-8b", "--device", "h100-80", "--resident-tokens", "1e30"],
         "argument --resident-tokens: must be at most 1,099,511,627,776 tokens (2^40)"),
        (["cliff", "--preset", "llama3-8b", "--device", "h100-80", "--max-context", str(2**40 + 1)],
         "argument --max-context: must be at most 1,099,511,627,776"),
    ],
)  # fmt: skip
def test_calc_refuses_sizes_no_model_has_naming_the_flag_and_the_limit(capsys, argv, fragment):
    assert fragment in run_error(capsys, "calc", *argv)


def test_calc_takes_sizes_up_to_the_limits(capsys):
    cliff = ["calc", "cliff", "--preset", "llama3-8b", "--device", "h100-80"]
    r = run_json(capsys, *cliff, "--resident-tokens", str(2**40), "--max-context", str(2**40))
    assert len(r["contexts"]) == 31 and r["contexts"][-1] == 2**40
    flags = ("--layers", "--q-heads", "--kv-heads", "--head-dim")
    shape = [arg for flag in flags for arg in (flag, "65536")]
    assert run_json(capsys, "calc", *shape)["kv_bytes_per_token"] == 2 * 2**48 * 2  # fp16


@pytest.mark.parametrize(
    "flags, fragment",
    [
        (["--weights-gib", "16"], "--weights-gib needs a device"),
        (["--weights-gib", "16", "--overhead-gib", "0"], "--weights-gib and --overhead-gib need"),
        (["--activation-gib", "2"], "--activation-gib needs a device"),
        (["--weight-dtype", "int4"], "--weight-dtype needs a device"),
    ],
)
def test_budget_flags_without_a_device_are_an_error_not_ignored(capsys, flags, fragment):
    """Without a device calc prints no budget, so ``--weights-gib 16`` had changed nothing,
    silently; with one it sizes the budget."""
    err = run_error(capsys, "calc", "--preset", "llama3-8b", *flags)
    assert fragment in err and "--device NAME or --memory-gib N" in err
    r = run_json(capsys, "calc", "--preset", "llama3-8b", "--device", "h100-80", *flags)
    assert "kv_budget_bytes" in r


@pytest.mark.parametrize(
    ("before", "what", "named"),
    [
        (["--weights-gib", "30"], "offload", "--weights-gib does"),
        (
            ["--memory-gib", "80", "--input-tokens", "10"],
            "offload",
            "--memory-gib, --input-tokens do",
        ),
        (["--max-model-len", "4096", "--batch", "3"], "cliff", "--max-model-len, --batch do"),
    ],
)
def test_calc_flags_a_subcommand_would_ignore_are_an_error(capsys, before, what, named):
    """Given before the subcommand they reach its namespace, and had been ignored silently
    (``calc --weights-gib 30 offload``); the model flags still carry over."""
    argv = ["calc", "--preset", "llama3-8b", *before, what, "--device", "h100-80"]
    assert run_error(capsys, *argv) == (f"kvscope: error: {named} not apply to calc {what}")
    assert run_json(capsys, "calc", "--preset", "llama3-8b", what, "--device", "h100-80")
