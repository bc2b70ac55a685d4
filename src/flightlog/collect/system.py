"""Host and accelerator-health metrics, added to metrics records on the writer thread.

CPU, RAM and disk come from psutil; GPU utilisation, temperature and power from NVML
(``nvidia-ml-py``) where present. This is a writer-thread processor, not a training
thread call: reading ``/proc`` and the driver costs tens of microseconds that the
training loop should not pay. Evaluation records are left alone.
"""

from __future__ import annotations

import os
import time
from typing import Any

from flightlog.protocol import METRICS, has_eval_metrics

MB = 2**20


class SystemStats:
    """Processor: adds cpu_percent, process_cpu_percent, ram_used_mb, ram_percent,
    process_rss_mb, disk_used_percent and (with NVML) gpu_utilization_pct,
    gpu_temperature_c, gpu_power_w to training metrics records.

    Sampled at most every ``min_interval_s`` seconds (each record gets the latest sample):
    a sample reads several ``/proc`` files, ~0.1–0.5 ms of writer time, and the CPU
    percentages are averages since the previous sample anyway."""

    __name__ = "system_stats"
    skip_emitted = True

    def __init__(self, disk_path: str | os.PathLike[str] = ".", *, nvml: bool = True, gpu_index: int | None = None, min_interval_s: float = 1.0) -> None:
        if min_interval_s < 0:
            raise ValueError(f"flightlog: min_interval_s must be >= 0, got {min_interval_s!r}")
        self.disk_path = os.fspath(disk_path)
        self.min_interval_s = min_interval_s
        self._last = -float("inf")
        self._latest: dict[str, Any] = {}
        try:
            import psutil
        except ImportError:
            psutil = None  # type: ignore[assignment]
        self.psutil = psutil
        if psutil is not None:
            self.process = psutil.Process()
            psutil.cpu_percent(None)  # prime: the first reading is since this call
            self.process.cpu_percent(None)
        self.nvml: Any = None
        self.handle: Any = None
        if nvml:
            self._init_nvml(gpu_index)

    def _init_nvml(self, gpu_index: int | None) -> None:
        try:
            import pynvml  # nvidia-ml-py

            pynvml.nvmlInit()
            index = gpu_index if gpu_index is not None else int(os.environ.get("LOCAL_RANK", "0"))
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            if visible:
                ids = [v.strip() for v in visible.split(",") if v.strip()]
                if index < len(ids) and ids[index].isdigit():
                    index = int(ids[index])
            self.handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            self.nvml = pynvml
        except Exception:  # no driver, no GPU, no package: skip quietly
            self.nvml = None

    @property
    def available(self) -> bool:
        return self.psutil is not None or self.nvml is not None

    def read(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        ps = self.psutil
        if ps is not None:
            vm = ps.virtual_memory()
            out["cpu_percent"] = ps.cpu_percent(None)
            out["process_cpu_percent"] = self.process.cpu_percent(None)
            out["ram_used_mb"] = round((vm.total - vm.available) / MB, 1)
            out["ram_percent"] = vm.percent
            out["process_rss_mb"] = round(self.process.memory_info().rss / MB, 1)
            try:
                out["disk_used_percent"] = ps.disk_usage(self.disk_path).percent
            except OSError:
                pass
        nv = self.nvml
        if nv is not None:
            try:
                out["gpu_utilization_pct"] = nv.nvmlDeviceGetUtilizationRates(self.handle).gpu
                out["gpu_temperature_c"] = nv.nvmlDeviceGetTemperature(self.handle, nv.NVML_TEMPERATURE_GPU)
                out["gpu_power_w"] = round(nv.nvmlDeviceGetPowerUsage(self.handle) / 1000.0, 1)
            except Exception:
                pass
        return out

    def __call__(self, record: dict[str, Any]) -> dict[str, Any]:
        if record.get("type") != METRICS or has_eval_metrics(record):
            return record
        now = time.monotonic()
        if now - self._last >= self.min_interval_s:
            self._last = now
            self._latest = self.read()
        latest = self._latest
        if record.keys().isdisjoint(latest):
            record.update(latest)
        else:  # the record's own values win
            for key, value in latest.items():
                record.setdefault(key, value)
        return record
