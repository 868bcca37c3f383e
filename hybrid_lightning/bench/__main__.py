from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch

from hybrid_lightning.bench import SECTIONS
from hybrid_lightning.fileio import write_owned
from hybrid_lightning.plan.precision import cpu_native_bf16

DEFAULT_OUT = Path("analysis/results/bench")
MARKER = ".hybrid-lightning-bench"  # in an output folder: the files the benchmarks wrote there (fileio.write_owned)


def markdown(result: dict) -> str:
    cols = result["columns"]
    lines = [f"## {result['title']}", "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for row in result["rows"]:
        lines.append("| " + " | ".join(_fmt(row.get(c, "")) for c in cols) + " |")
    if result.get("notes"):
        lines += ["", result["notes"]]
    return "\n".join(lines) + "\n"


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"
    return str(v)


def cpu_name() -> str:
    """The CPU's model name as Linux reports it (``/proc/cpuinfo``), else ``platform.processor()``."""
    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.exists() else []
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")),
                platform.processor())


def describe_machine() -> str:
    # the CPU, the vector ISA torch dispatches to (AVX2, AVX512, ...) and whether it has bf16 instructions:
    # ratios between kernels move with them
    bf16 = ", bf16 instructions" if cpu_native_bf16() else ""
    machine = (f"{platform.machine()} {cpu_name()} {torch.backends.cpu.get_cpu_capability()}{bf16}, "
               f"{torch.get_num_threads()} torch threads, torch {torch.__version__}")
    if hasattr(os, "getloadavg"):  # other processes distort timings on a shared machine: say how busy it was
        machine += f", load average {os.getloadavg()[0]:.1f} at the start"
    return machine


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m hybrid_lightning.bench", description=__doc__)
    p.add_argument("sections", nargs="*", help=f"sections to run (default: all): {sorted(SECTIONS)}")
    p.add_argument("--quick", action="store_true", help="small sizes, for a smoke test")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output folder (default: {DEFAULT_OUT})")
    p.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice, one per core)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    unknown = [s for s in args.sections if s not in SECTIONS]
    if unknown:
        p.error(f"unknown section(s) {unknown}; choose from {sorted(SECTIONS)}")
    for name in args.sections or list(SECTIONS):
        print(f"[bench] {name}: {SECTIONS[name]}", file=sys.stderr)
        t0, machine = time.perf_counter(), describe_machine()
        result = importlib.import_module(f"hybrid_lightning.bench.{name}").run(quick=args.quick)
        result["machine"], result["seconds"] = machine, round(time.perf_counter() - t0, 1)
        write_owned(args.out, MARKER, f"{name}.json", json.dumps(result, indent=1), "--out")
        print(markdown(result))
    write_index(args.out)
    return 0


def write_index(out: Path) -> None:
    """``out/README.md``: every section's table found in ``out`` (its ``<section>.json``), in section order; other
    JSON there (the GPU check's ``gpu.json``, with its own ``gpu.md``) is left out."""
    order = list(SECTIONS)  # (a), (b), ... then any other section found there
    results = {f.stem: json.loads(f.read_text()) for f in out.glob("*.json")}
    sections = sorted((name for name, result in results.items() if "columns" in result),
                      key=lambda s: (order.index(s) if s in order else len(order), s))
    body = ["# Benchmarks", "", "Regenerate with `python -m hybrid_lightning.bench` (sections: "
            + ", ".join(sections) + ").", ""]
    for name in sections:
        body += [markdown(results[name]), f"_{results[name]['machine']}; {results[name]['seconds']} s_", ""]
    write_owned(out, MARKER, "README.md", "\n".join(body), "--out")


if __name__ == "__main__":
    sys.exit(main())
