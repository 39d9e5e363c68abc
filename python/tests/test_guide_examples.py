"""The guides' and the README's runnable examples, run verbatim: every ```python block that follows
a `<!-- run: python/tests/test_guide_examples.py -->` line, each in a fresh interpreter (CPU,
tiny models, nothing downloaded)."""

import os
import pathlib
import re
import subprocess
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("accelerate")

REPO = pathlib.Path(__file__).resolve().parents[2]
MARK = "<!-- run: python/tests/test_guide_examples.py -->"
FILES = ("README.md", "docs/guides/pytorch.md", "docs/guides/calibration.md")


def examples():
    out = []
    for name in FILES:
        text = (REPO / name).read_text()
        for i, match in enumerate(re.finditer(re.escape(MARK) + r"\n```python\n(.*?)```", text,
                                              re.S)):
            out.append(pytest.param(match.group(1), id=f"{name}#{i}"))
    return out


def test_every_marked_file_has_examples():
    ids = {p.id.split("#")[0] for p in examples()}
    assert ids == set(FILES), ids


@pytest.mark.parametrize("code", examples())
def test_example_runs_verbatim(code, tmp_path):
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1",
               TOKENIZERS_PARALLELISM="false")
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
