"""The GPU probe: "no GPU" (no NVIDIA device or driver) is 0 devices and GPU tests skip; an NVIDIA GPU that DALI
cannot use is a broken install, which fails loudly instead of passing for "no GPU". The failing probe is injected
(a fault this machine cannot produce: it has no GPU)."""

from __future__ import annotations

import pytest

from imgest.readback import pipelines


def _broken_probe() -> int:
    raise RuntimeError("CUDA driver version is insufficient for CUDA runtime version")


def test_a_gpu_dali_cannot_use_fails_loudly(monkeypatch: pytest.MonkeyPatch) -> None:
    import nvidia.dali.backend

    monkeypatch.setattr(nvidia.dali.backend, "GetCUDADeviceCount", _broken_probe)
    monkeypatch.setattr(pipelines, "nvidia_present", lambda: ["/dev/nvidia0"])
    with pytest.raises(pipelines.GpuProbeError, match=r"/dev/nvidia0.*CUDA driver version is insufficient"):
        pipelines.cuda_devices()


def test_no_gpu_at_all_is_zero_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    import nvidia.dali.backend

    monkeypatch.setattr(nvidia.dali.backend, "GetCUDADeviceCount", _broken_probe)
    monkeypatch.setattr(pipelines, "nvidia_present", lambda: [])
    assert pipelines.cuda_devices() == 0


def test_this_machine_answers_as_it_is() -> None:
    """No NVIDIA device here: exactly 0; with one, DALI sees it (a GPU it cannot see would have raised)."""
    found = pipelines.cuda_devices()
    assert (found == 0) == (not pipelines.nvidia_present())
