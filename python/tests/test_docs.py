"""Every fenced code block of README.md and docs/guides/*.md runs as a test, so the docs cannot rot.

- ```python: run in a fresh interpreter with the installed package (CPU, tiny models, nothing
  downloaded). A block preceded by `<!-- doc-test: continues -->` runs after the guide's previous
  Python block, in the same process (one program, blocks in order).
- ```sh / ```bash: run with bash (errexit, pipefail); `build/tools/wlb-plan` is the CMake build's.
- ```cpp / ```c++: compiled against include/ with `-fsyntax-only`, all in one translation unit
  (each block the body of its own function, `#include` lines hoisted; wlb.hpp costs about 10
  CPU-s per translation unit, so one for every file), with clang++ (or $CXX, or g++).
- Other fences (no language, text, json, cmake) are data or output, not code (NOT_CODE).

Every block runs in a scratch folder whose entries link to the repository's top-level entries
(`docs/...`, `examples/...` resolve; what a block writes stays in the scratch folder) and whose
`build` is the CMake tree (WLB_BUILD_DIR). A block that cannot run here says so right before its
fence, visibly: `<!-- doc-test: skip (needs a GPU) -->`; it is reported as a skip with that reason.
"""

import os
import pathlib
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from typing import List, Optional

import pytest

from conftest import BUILD, REPO, binary

FILES = ["README.md"] + sorted(
    str(p.relative_to(REPO)) for p in (REPO / "docs" / "guides").glob("*.md"))
RUN = {"python": "python", "sh": "shell", "bash": "shell", "cpp": "cpp", "c++": "cpp"}
NOT_CODE = {"", "text", "json", "cmake"}
FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", re.S | re.M)
MARKER = re.compile(r"<!--\s*doc-test:\s*(.*?)\s*-->\s*\Z", re.S)
SKIP = re.compile(r"skip \((.+)\)\Z", re.S)
TIMEOUT_S = 300


@dataclass
class Block:
    path: str
    line: int
    lang: str
    code: str
    skip: Optional[str] = None
    continues: bool = False
    follows: List["Block"] = field(default_factory=list)  # python blocks that continue this one

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"


def parse(path: str, text: Optional[str] = None):
    """(blocks, problems) of one markdown file (or of `text`): each fenced block with its marker."""
    text = (REPO / path).read_text() if text is None else text
    blocks, problems = [], []
    for match in FENCE.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        block = Block(path, line, match.group(1).strip().lower(), match.group(2))
        before = text[:match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = MARKER.search(before)
        if marker:
            directive = marker.group(1)
            skip = SKIP.match(directive)
            if skip:
                block.skip = skip.group(1).strip()
            elif directive == "continues" and block.lang == "python":
                block.continues = True
            else:
                problems.append(f"{block.where}: unknown doc-test marker {directive!r} (allowed: "
                                "'skip (REASON)', 'continues' before a python block)")
        elif "doc-test" in before:
            problems.append(f"{block.where}: malformed doc-test marker {before!r}")
        if block.lang not in RUN and block.lang not in NOT_CODE:
            problems.append(f"{block.where}: fence language {block.lang!r} is neither run "
                            f"({sorted(RUN)}) nor listed as not code ({sorted(NOT_CODE)})")
        blocks.append(block)
    marked = len(re.findall(r"^<!--\s*doc-test:", text, re.M))  # markers on a line of their own
    attached = sum(1 for b in blocks if b.skip is not None or b.continues)
    if marked != attached:
        problems.append(f"{path}: {marked} doc-test markers but {attached} sit right before a "
                        "fence (a marker must be the line just before its block)")
    return blocks, problems


def collect():
    """The tests: each python block (with the blocks continuing it), each shell block, the C++
    blocks that run here and those marked."""
    python, shell, cpp, cpp_skipped, problems = [], [], [], [], []
    for path in FILES:
        blocks, found = parse(path)
        problems += found
        previous = None
        for block in blocks:
            kind = RUN.get(block.lang)
            if kind == "python":
                if block.continues:
                    if previous is None:
                        problems.append(f"{block.where}: 'continues' but no python block before")
                    else:
                        previous.follows.append(block)
                    continue
                previous = block
                python.append(block)
            elif kind == "shell":
                shell.append(block)
            elif kind == "cpp":
                (cpp_skipped if block.skip is not None else cpp).append(block)
    return python, shell, cpp, cpp_skipped, problems


PYTHON, SHELL, CPP, CPP_SKIPPED, PROBLEMS = collect()


def params(blocks):
    return [pytest.param(b, id=b.where + "".join(f"+{f.line}" for f in b.follows))
            for b in blocks]


def test_every_block_is_run_or_marked():
    assert not PROBLEMS, "\n".join(PROBLEMS)
    # The examples users copy most: the front page's and the PyTorch guide's Python blocks run.
    for path in ("README.md", "docs/guides/pytorch.md", "docs/guides/calibration.md"):
        assert any(b.path == path and b.skip is None for b in PYTHON), path
    assert {b.path for b in CPP} >= {"README.md", "docs/guides/cpp.md"}


def test_bad_markers_and_languages_are_reported():
    text = ("<!-- doc-test: skip (needs a GPU) -->\n```sh\nnvidia-smi\n```\n"
            "<!-- doc-test: continues -->\n```python\nprint(1)\n```\n"
            "<!-- doc-test: skip (stray) -->\n\ntext\n"
            "<!-- doc-test: skip -->\n```python\n```\n"
            "<!-- doc-test: continues -->\n```sh\ntrue\n```\n"
            "```rust\nfn main() {}\n```\n")
    blocks, problems = parse("x.md", text)
    assert [(b.line, b.lang, b.skip, b.continues) for b in blocks] == [
        (2, "sh", "needs a GPU", False), (6, "python", None, True), (13, "python", None, False),
        (16, "sh", None, False), (19, "rust", None, False)]
    assert problems == [
        "x.md:13: unknown doc-test marker 'skip' (allowed: 'skip (REASON)', 'continues' before a "
        "python block)",
        "x.md:16: unknown doc-test marker 'continues' (allowed: 'skip (REASON)', 'continues' "
        "before a python block)",
        "x.md:19: fence language 'rust' is neither run (['bash', 'c++', 'cpp', 'python', 'sh']) "
        "nor listed as not code (['', 'cmake', 'json', 'text'])",
        "x.md: 5 doc-test markers but 2 sit right before a fence (a marker must be the line just "
        "before its block)"]


@pytest.fixture
def scratch(tmp_path):
    """A folder that looks like the repository root (links to its entries) with the build tree."""
    for entry in REPO.iterdir():
        if entry.name not in (".git", "build"):
            (tmp_path / entry.name).symlink_to(entry)
    (tmp_path / "build").symlink_to(BUILD.resolve())
    return tmp_path


def run(command, cwd, **kwargs):
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1",
               TOKENIZERS_PARALLELISM="false")
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=TIMEOUT_S, **kwargs)


def skip_if_marked(blocks):
    reasons = [f"{b.where}: {b.skip}" for b in blocks if b.skip is not None]
    if reasons:
        pytest.skip("; ".join(reasons))


@pytest.mark.parametrize("block", params(PYTHON))
def test_python_block(block, scratch):
    blocks = [block] + block.follows
    skip_if_marked(blocks)
    code = "".join(b.code for b in blocks)
    for name in ("torch", "torchdata", "transformers"):
        if re.search(rf"\b{name}\b", code):
            pytest.importorskip(name)
    if "WlbTrainer" in code:
        pytest.importorskip("accelerate")
    done = run([sys.executable, "-c", code], scratch)
    assert done.returncode == 0, f"{block.where}\n{done.stdout[-3000:]}{done.stderr[-3000:]}"


@pytest.mark.parametrize("block", params(SHELL))
def test_shell_block(block, scratch):
    skip_if_marked([block])
    if "wlb-plan" in block.code:
        binary("tools/wlb-plan")
    done = run(["bash", "-euo", "pipefail", "-c", block.code], scratch)
    assert done.returncode == 0, f"{block.where}\n{done.stdout[-3000:]}{done.stderr[-3000:]}"


def translation_unit(blocks) -> str:
    """The blocks' #include lines first, then each block as the body of its own function (errors
    point at the markdown's lines)."""
    includes, bodies = ["#include <cstdint>", "#include <string>", "#include <vector>"], []
    for i, block in enumerate(blocks):
        lines = block.code.splitlines()
        includes += [line for line in lines if line.startswith("#include")]
        body = "\n".join("" if line.startswith("#include") else line for line in lines)
        bodies.append(f"[[maybe_unused]] static void DocBlock{i}() {{\n"
                      f"#line {block.line + 1} \"{block.path}\"\n{body}\n}}")
    return "\n".join(dict.fromkeys(includes)) + "\n\n" + "\n\n".join(bodies) + "\n"


def test_cpp_blocks_compile(tmp_path):
    # clang++ first: its -Wdangling catches a range-for over a temporary StatusOr's value.
    compiler = os.environ.get("CXX") or shutil.which("clang++") or shutil.which("g++")
    if compiler is None:
        pytest.skip("no C++ compiler (g++ or clang++) on the PATH")
    source = tmp_path / "doc_blocks.cc"
    source.write_text(translation_unit(CPP))
    done = run([compiler, "-std=c++20", "-fsyntax-only", "-Wall", "-Werror", "-Wno-unused",
                f"-I{REPO / 'include'}", "-I/usr/include/eigen3", str(source)], tmp_path)
    assert done.returncode == 0, f"{source.read_text()}\n{done.stderr[-4000:]}"


@pytest.mark.parametrize("block", params(CPP_SKIPPED))
def test_cpp_block_marked(block):
    skip_if_marked([block])
