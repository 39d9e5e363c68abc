"""Shared helpers of the wlb Python tests: seeded streams and the C++ build's binaries."""

import os
import pathlib

import numpy as np
import pytest

import wlb

REPO = pathlib.Path(__file__).resolve().parents[2]
BUILD = pathlib.Path(os.environ.get("WLB_BUILD_DIR", REPO / "build"))


def binary(relative: str) -> pathlib.Path:
    """A binary of the CMake build (scripts/test.sh builds them); skips the test when absent."""
    path = BUILD / relative
    if not path.is_file():
        pytest.skip(f"{path} not built (run scripts/test.sh, or set WLB_BUILD_DIR)")
    return path


def random_lengths(rng: np.random.Generator, context: int, total_tokens: int) -> np.ndarray:
    """Mostly short documents and a tail up to 2.5 x the context (so some are split)."""
    lengths = []
    total = 0
    while total < total_tokens:
        if rng.random() < 0.1:
            d = int(rng.integers(context // 4, int(context * 2.5) + 1))
        else:
            d = int(rng.integers(1, max(2, context // 8)))
        lengths.append(d)
        total += d
    return np.asarray(lengths, dtype=np.int64)


def stream(seed: int):
    """A seeded random configuration and its steps of pieces: (config dict, list of Documents)."""
    rng = np.random.default_rng(seed)
    context = int(rng.integers(16, 2048))
    n = int(rng.integers(1, 9))
    steps = int(rng.integers(1, 12))
    lengths = random_lengths(rng, context, steps * n * context)
    pieces = wlb.make_documents(lengths, context)
    config = {"context": context, "micro_batches": n}
    return config, lengths, wlb.split_into_steps(pieces, n * context)
