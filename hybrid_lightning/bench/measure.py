"""What the benchmark sections measure with: interleaved wall-clock medians and peak memory."""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable
from typing import NamedTuple

import torch


class Timing(NamedTuple):
    wall: float  # seconds of wall-clock time
    cpu: float  # seconds of CPU time of this process (all its threads), which other processes do not inflate


def interleaved_medians(fns: dict[str, Callable[[], object]], reps: int) -> dict[str, Timing]:
    """Median wall-clock and CPU seconds of each function over ``reps`` calls, made round-robin (a, b, c,
    a, b, c, ...) so that a change in the machine's load falls on all of them alike. Call each once
    before, to warm up."""
    times: dict[str, list[Timing]] = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            sync()
            wall, cpu = time.perf_counter(), time.process_time()
            fn()
            sync()
            times[name].append(Timing(time.perf_counter() - wall, time.process_time() - cpu))
    return {
        name: Timing(statistics.median(t.wall for t in ts), statistics.median(t.cpu for t in ts))
        for name, ts in times.items()
    }


@contextlib.contextmanager
def one_thread():
    """torch computes on one CPU thread inside the block, on as many as before after it."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def peak_memory(fn: Callable[[], object], device: torch.device) -> int:
    """Peak bytes of tensor memory that ``fn`` allocates on top of what is allocated when it starts.

    On CUDA from the caching allocator's statistics; on CPU from the allocation events of the PyTorch
    profiler (``profile_memory=True``), whose running total counts exactly the tensors allocated under it."""
    if device.type == "cuda":
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated(device) - base
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    allocation = torch._C._profiler._EventType.Allocation
    totals = [0]
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        stack.extend(node.children)
        if node.tag == allocation and node.extra_fields.device.type == "cpu":
            totals.append(node.extra_fields.total_allocated)  # running total since the profiler started
    return max(totals)
