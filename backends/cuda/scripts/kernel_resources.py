#!/usr/bin/env python3
"""Registers, stack frame and spills of every kernel in wlb's CUDA sources, from ptxas -v.

  kernel_resources.py [--nvcc NVCC] [--arch 90] [--raw PATH] [--no-spill REGEX] [FILE.cu ...]
  kernel_resources.py --log PTXAS_LOG [--no-spill REGEX]

Compiles each FILE.cu (default: the flash kernels, backends/cuda/src/flash_fwd.cu and
flash_bwd.cu) for sm_ARCH with the flags of the wlb_cuda target and `-Xptxas -v`, and prints a
Markdown table: kernel (demangled, namespaces dropped), registers per thread, stack frame, spill
store and spill load bytes. These are compile-time facts of ptxas, exact without a GPU; what
they cost at run time (local-memory traffic) only a profiler on a GPU shows. --log parses a saved
ptxas log instead (e.g. a build with -DWLB_CUDA_PTXAS_VERBOSE=ON); --raw saves the compiler's
output. --no-spill REGEX exits 1 when a kernel whose name matches REGEX spills (stores or loads),
and when no kernel matches at all, so a check cannot pass on an empty table.

  backends/cuda/scripts/kernel_resources.py --raw ptxas.log
  backends/cuda/scripts/kernel_resources.py --no-spill 'FlashBackwardKernel<64'
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
DEFAULT_FILES = ["backends/cuda/src/flash_fwd.cu", "backends/cuda/src/flash_bwd.cu"]

_ENTRY = re.compile(r"Compiling entry function '([^']+)'")
_PROPERTIES = re.compile(r"Function properties for (\S+)")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")


def parse(log):
    """[(mangled name, registers, stack frame, spill stores, spill loads)] of the entry functions
    (kernels), in the log's order.

    ptxas prints, per kernel, "Compiling entry function 'NAME'", "Function properties for NAME",
    the frame and spill line, then "Used N registers". Non-inlined device functions get a
    "Function properties" record of their own, with no register count: they are skipped (their
    frame is part of the calling kernel's). A kernel whose record is incomplete is an error: a
    partial table would hide it.
    """
    kernels, entry, name, frame = [], None, None, None
    for line in log.splitlines():
        m = _ENTRY.search(line)
        if m:
            if entry is not None:
                raise ValueError(f"ptxas log: no register count for {entry}")
            entry, name, frame = m.group(1), None, None
            continue
        m = _PROPERTIES.search(line)
        if m:
            name, frame = m.group(1), None
            continue
        m = _FRAME.search(line)
        if m and name is not None and name == entry:
            frame = tuple(int(x) for x in m.groups())
            continue
        m = _USED.search(line)
        if m and entry is not None:
            if frame is None:
                raise ValueError(f"ptxas log: no stack frame line for {entry}")
            kernels.append((entry, int(m.group(1))) + frame)
            entry, name, frame = None, None, None
    if entry is not None:
        raise ValueError(f"ptxas log: no register count for {entry}")
    return kernels


def readable(mangled):
    """The demangled name without namespaces, `void` and the parameter list (c++filt when found)."""
    cxxfilt = shutil.which("c++filt")
    if cxxfilt is None:
        return mangled
    name = subprocess.run([cxxfilt, mangled], capture_output=True, text=True,
                          check=True).stdout.strip()
    name = re.sub(r"^void ", "", name)
    name = re.sub(r"\([^()]*\)$", "", name)  # the parameter list
    name = re.sub(r"[A-Za-z_:]*\(anonymous namespace\)::", "", name)
    name = name.replace("wlb::cuda::detail::", "").replace("wlb::cuda::", "")
    return name


def table(kernels):
    lines = ["| kernel | registers | stack frame B | spill stores B | spill loads B |",
             "|---|---|---|---|---|"]
    for name, regs, frame, stores, loads in kernels:
        lines.append(f"| `{readable(name)}` | {regs} | {frame} | {stores} | {loads} |")
    return "\n".join(lines)


def compile_log(nvcc, arch, files):
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for f in files:
            cmd = [nvcc, "-std=c++20", "-O3", "-DNDEBUG", f"-arch=sm_{arch}", "-lineinfo",
                   "--expt-relaxed-constexpr", "-I", os.path.join(REPO, "backends/cuda"),
                   "-I", os.path.join(REPO, "backends/cuda/include"), "-Xptxas", "-v", "-c",
                   os.path.join(REPO, f) if not os.path.isabs(f) else f,
                   "-o", os.path.join(tmp, "k.o")]
            r = subprocess.run(cmd, capture_output=True, text=True)
            shown = [c.replace(tmp, "$TMP").replace(REPO + os.sep, "") for c in cmd]
            out.append(f"$ {' '.join(shown)}\n")
            out.append(r.stdout + r.stderr)
            if r.returncode != 0:
                sys.stderr.write("".join(out))
                raise SystemExit(f"kernel_resources.py: {nvcc} failed on {f} ({r.returncode})")
    return "".join(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="*", help="CUDA sources, relative to the repository root")
    ap.add_argument("--nvcc", default=os.environ.get("CUDACXX") or "nvcc")
    ap.add_argument("--arch", default="90", help="compute capability without the dot (sm_ARCH)")
    ap.add_argument("--log", help="parse this ptxas -v log instead of compiling")
    ap.add_argument("--raw", help="write the compiler output here")
    ap.add_argument("--no-spill", metavar="REGEX",
                    help="exit 1 if a kernel matching REGEX spills, or if none matches")
    args = ap.parse_args(argv)
    if args.log and args.files:
        ap.error("--log and source files are exclusive")
    if args.log:
        with open(args.log) as f:
            log = f.read()
    else:
        log = compile_log(args.nvcc, args.arch, args.files or DEFAULT_FILES)
    if args.raw:
        with open(args.raw, "w") as f:
            f.write(log)
    kernels = parse(log)
    if not kernels:
        raise SystemExit("kernel_resources.py: no kernel in the ptxas output (was -v passed?)")
    print(table(kernels))
    if args.no_spill:
        pattern = re.compile(args.no_spill)
        matched = [k for k in kernels if pattern.search(readable(k[0])) or pattern.search(k[0])]
        if not matched:
            print(f"no-spill check: no kernel matches '{args.no_spill}'")
            return 1
        spilling = [k for k in matched if k[3] > 0 or k[4] > 0]
        for k in spilling:
            print(f"no-spill check: {readable(k[0])} spills {k[3]} B stored, {k[4]} B loaded")
        print(f"no-spill check '{args.no_spill}': {len(matched)} kernels, {len(spilling)} spill")
        return 1 if spilling else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
