"""Checkpoint interchange: the state blob is the C++ SaveState blob, byte for byte, so a
checkpoint written by C++ restores in Python and back (test/packer_state_tool is the C++ side)."""

import json
import subprocess

import numpy as np
import pytest

import wlb
from conftest import binary, random_lengths


def tool(*args):
    exe = binary("test/packer_state_tool")
    out = subprocess.run([str(exe), *map(str, args)], check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def python_steps(packer, steps):
    out = []
    for arrivals in steps:
        out += packer.push(arrivals)
    return out


@pytest.mark.parametrize("name", wlb.packer_names())
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_cpp_and_python_states_interchange(tmp_path, name, seed):
    rng = np.random.default_rng(seed)
    context, n = 2048, 3
    lengths = random_lengths(rng, context, 10 * n * context)
    lengths_file = tmp_path / "lengths.txt"
    lengths_file.write_text("\n".join(map(str, lengths)) + "\n")
    steps = wlb.split_into_steps(wlb.make_documents(lengths, context), n * context)
    k = len(steps) // 2

    # C++ packs [0, k) and saves; Python packs [0, k) and saves: the same bytes.
    cpp_state = tmp_path / "cpp.state"
    cpp_first = tool("save", lengths_file, name, context, n, k, cpp_state)
    packer = wlb.Packer(name, context=context, micro_batches=n)
    py_first = python_steps(packer, steps[:k])
    assert packer.save_state() == cpp_state.read_bytes()
    assert [json.loads(s.to_json()) for s in py_first] == cpp_first["steps"]

    # C++ blob -> Python: restores and plans the rest as C++ does.
    cpp_rest = tool("resume", lengths_file, name, context, n, k, cpp_state)
    resumed = wlb.Packer(name, context=context, micro_batches=n)
    resumed.restore_state(cpp_state.read_bytes())
    py_rest = python_steps(resumed, steps[k:]) + resumed.flush()
    assert [json.loads(s.to_json()) for s in py_rest] == cpp_rest["steps"]

    # Python blob -> C++.
    py_state = tmp_path / "py.state"
    py_state.write_bytes(packer.state_dict()["packer_state"])
    assert tool("resume", lengths_file, name, context, n, k, py_state) == cpp_rest
