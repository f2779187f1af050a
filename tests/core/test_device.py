from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from autotune.core.device import detect_device


def test_a_gpu_is_described_by_its_own_properties(monkeypatch) -> None:
    """A model on cuda:1 of a host with two kinds of GPU is checked against GPU 1's name,
    capability and shared memory, not GPU 0's (stand-ins for torch.cuda: CI has no GPU)."""
    gpus = {
        0: SimpleNamespace(
            name="GPU zero", major=8, minor=0, total_memory=1, multi_processor_count=2
        ),
        1: SimpleNamespace(
            name="GPU one", major=9, minor=0, total_memory=3, multi_processor_count=4
        ),
    }
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", gpus.__getitem__)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    assert detect_device("cuda", 0).name == "GPU zero"
    one = detect_device("cuda", 1)
    assert (one.name, one.capability, one.multiprocessors) == ("GPU one", (9, 0), 4)
    assert detect_device("cuda").name == "GPU one"  # no index: the current GPU
    assert detect_device("cpu", 1).type == "cpu"


def test_asking_for_a_gpu_without_one_says_the_fix(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="--gpu cpu"):
        detect_device("cuda")
