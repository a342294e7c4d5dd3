"""A run's GPU use in reports as text: mean utilisation and peak memory (its curves are html_report's `gpu_plot`).

A run without a GPU (none asked for, or none NVML could see) reads "no GPU", never 0 %.
"""

from __future__ import annotations

NO_GPU = "no GPU"


def gpu_text(utilization: float | None, peak_memory_bytes: int | None) -> str:
    """`37% · 7.0 GiB`: the run's mean GPU utilisation and its peak GPU memory; "no GPU" without one."""
    if utilization is None or peak_memory_bytes is None:
        return NO_GPU
    return f"{utilization:.0%} · {peak_memory_bytes / 2**30:.1f} GiB"  # mean utilisation · peak memory
