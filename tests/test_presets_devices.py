"""Device presets found from the name the driver reports, by longest fragment, and a
visible note when a GPU has no row of its own."""

from __future__ import annotations

import pytest

from kvscope.engine.device import preset_for_name
from kvscope.engine.presets import DEVICES, device_preset, match_driver_name


@pytest.mark.parametrize(
    "driver_name, preset",
    [
        ("NVIDIA H200", "h200-141"),
        ("NVIDIA H200 NVL", "h200-nvl"),
        ("NVIDIA H100 NVL", "h100-nvl"),
        ("NVIDIA H100 PCIe", "h100-pcie"),
        ("NVIDIA H100 80GB HBM3", "h100-80"),
        ("NVIDIA H100 SXM5 80GB", "h100-80"),
        ("NVIDIA GH200 480GB", "gh200"),
        ("NVIDIA GH200 144G HBM3e", "gh200-144"),
        ("NVIDIA A100-SXM4-40GB", "a100-40"),
        ("NVIDIA A100-PCIE-40GB", "a100-40"),
        ("NVIDIA A100-SXM4-80GB", "a100-80"),
        ("NVIDIA A100 80GB PCIe", "a100-80-pcie"),
        ("NVIDIA L40S", "l40s"),
        ("NVIDIA L4", "l4"),
        ("NVIDIA GeForce RTX 4090", "rtx-4090"),
        ("NVIDIA RTX 6000 Ada Generation", "rtx-6000-ada"),
    ],
)
def test_driver_names_pick_the_row_of_their_longest_fragment(driver_name, preset):
    assert match_driver_name(driver_name) is DEVICES[preset]
    assert device_preset(driver_name) is DEVICES[preset]
    assert preset_for_name(driver_name) == (DEVICES[preset], None)


def test_every_listed_driver_name_finds_its_own_row():
    for device in DEVICES.values():
        for name in device.nvml_names:
            assert match_driver_name(name) is device, name


@pytest.mark.parametrize(
    "driver_name", ["NVIDIA L40", "Quadro RTX 6000", "NVIDIA B200", "Tesla T4"]
)
def test_a_fragment_matches_whole_words_only(driver_name):
    # "l4" is not a word of "L40", "h200" not of "B200", "rtx 6000 ada" needs "ada".
    assert match_driver_name(driver_name) is None


def test_an_unknown_gpu_falls_back_with_a_note_naming_both():
    preset, note = preset_for_name("NVIDIA B200")
    assert preset is DEVICES["h100-80"]
    assert "NVIDIA B200" in note and "h100-80" in note and "--cost-device" in note
    assert preset_for_name("NVIDIA B200", fallback="h200-141")[0] is DEVICES["h200-141"]
    assert preset_for_name("cpu") == (DEVICES["cpu"], None)


def test_the_new_rows_carry_their_datasheet_peaks():
    rows = {name: (DEVICES[name].fp16_tflops, DEVICES[name].hbm_gbps) for name in DEVICES}
    assert rows["h200-nvl"] == (835, 4800) and rows["h100-nvl"] == (835, 3900)
    assert rows["l40s"] == (362, 864) and rows["rtx-6000-ada"] == (364, 960)
    assert DEVICES["gh200"].pcie_gbps == 450  # NVLink-C2C, not PCIe
