"""The hardware table the planner and the cost estimate read: accelerators and fabrics."""

from __future__ import annotations

import pytest

from ito.core.hardware import ACCELERATORS, FABRIC_LINKS, FABRICS, device_matches


def test_fp8_support_follows_compute_capability_8_9() -> None:
    for accel in ACCELERATORS.values():
        capability = accel.compute_capability
        has_fp8 = capability is not None and capability >= (8, 9)
        assert accel.fp8 is has_fp8 is (accel.peak_fp8_flops is not None), accel.name
        if accel.peak_fp8_flops is not None:
            assert accel.peak_fp8_flops == pytest.approx(2 * accel.peak_bf16_flops, rel=1e-3)


def test_reported_memory_is_close_to_the_nominal_size() -> None:
    for accel in ACCELERATORS.values():
        nominal = accel.memory_gb * 10**9
        assert 0.9 * nominal <= accel.memory_bytes <= 1.1 * nominal, accel.name
        assert 0 < accel.kernel_efficiency <= 1 and accel.link_bandwidth > 0


def test_rail_fabrics_scale_with_the_gpus_and_ethernet_is_shared() -> None:
    assert set(FABRICS) == set(FABRIC_LINKS)
    assert FABRIC_LINKS["infiniband"].node_bandwidth(8) == 8 * 50e9
    assert FABRIC_LINKS["roce"].node_bandwidth(4) == 4 * 50e9
    assert FABRIC_LINKS["ethernet"].node_bandwidth(8) == 12.5e9
    assert FABRIC_LINKS["nvlink"].node_bandwidth(8) == 0.0
    assert not FABRIC_LINKS["nvlink"].inter_node


@pytest.mark.parametrize(
    ("accelerator", "device", "matches"),
    [
        ("h100", "NVIDIA H100 80GB HBM3", True),
        ("h100", "NVIDIA H100 NVL", True),
        ("a100", "NVIDIA A100-SXM4-80GB", True),
        ("h200", "NVIDIA H200", True),
        ("b200", "NVIDIA B200", True),
        ("h100", "NVIDIA A100-SXM4-80GB", False),
        ("h200", "NVIDIA GH200 480GB", False),
        ("h100", "NVIDIA H1000", False),
        ("a100", "NVIDIA A10", False),
    ],
)
def test_a_cuda_device_name_matches_only_its_own_accelerator(
    accelerator: str, device: str, matches: bool
) -> None:
    assert device_matches(accelerator, device) is matches
