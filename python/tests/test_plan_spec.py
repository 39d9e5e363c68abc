"""Packer(...) keyword arguments are a wlb::PlanSpec, as wlb-plan's flags are: every packing option
wlb-plan has (masked cost presets, --profile-cost table) gives the same plan in Python, bad values
are errors naming them, and packer_names() is the packer registry wlb-plan --help lists."""

import json
import subprocess

import numpy as np
import pytest

import wlb
from conftest import binary, random_lengths

CONTEXT, N = 4096, 4
PROFILE = "seq_len,latency(ms)\n128,0.02\n1024,0.1\n8192,3.1\n65536,190\n"


def cli_steps(exe, docs, *flags):
    out = subprocess.run([str(exe), f"--docs={docs}", f"--context={CONTEXT}",
                          f"--micro-batches={N}", "--format=json", "--timing=false", *flags],
                         check=True, capture_output=True, text=True, timeout=300).stdout
    return json.loads(out)


def python_steps(lengths, packer):
    steps = []
    for arrivals in wlb.split_into_steps(wlb.make_documents(lengths, CONTEXT), N * CONTEXT):
        steps += packer.push(arrivals)
    return steps + packer.flush()


@pytest.fixture
def stream(tmp_path):
    lengths = random_lengths(np.random.default_rng(23), CONTEXT, 10 * N * CONTEXT)
    docs = tmp_path / "lengths.txt"
    docs.write_text("\n".join(map(str, lengths)) + "\n")
    return lengths, docs


@pytest.mark.parametrize("cost", ["llama2-7b-swa4k", "llama2-7b-chunk8k", "llama2-7b-causal"])
@pytest.mark.parametrize("name", ["wlb", "wlb-refine"])
def test_masked_cost_plans_as_wlb_plan(stream, cost, name):
    exe = binary("tools/wlb-plan")
    lengths, docs = stream
    expected = cli_steps(exe, docs, f"--packer={name}", f"--cost={cost}")
    packer = wlb.Packer(name, context=CONTEXT, micro_batches=N, cost=cost)
    assert packer.cost is None  # mask-aware FLOPs: no polynomial
    steps = python_steps(lengths, packer)
    assert len(steps) == len(expected["steps"])
    assert [json.loads(s.to_json()) for s in steps] == expected["steps"]
    assert wlb.summarize(steps)["imbalance_mean"] == expected["summary"]["imbalance_mean"]


def test_profile_cost_table_plans_as_wlb_plan(stream, tmp_path):
    exe = binary("tools/wlb-plan")
    lengths, docs = stream
    profile = tmp_path / "profile.csv"
    profile.write_text(PROFILE)
    expected = cli_steps(exe, docs, "--packer=wlb-refine", f"--cost={profile}",
                         "--profile-cost=table")
    packer = wlb.Packer("wlb-refine", context=CONTEXT, micro_batches=N, cost=str(profile),
                        profile_cost="table")
    assert packer.cost is None  # the tabulated cost, not the fit
    steps = python_steps(lengths, packer)
    assert [json.loads(s.to_json()) for s in steps] == expected["steps"]
    fitted = wlb.Packer("wlb-refine", context=CONTEXT, micro_batches=N, cost=str(profile),
                        profile_cost="fit")
    assert fitted.cost is not None and fitted.cost.unit == "ms"


def test_bad_options_name_the_value(tmp_path):
    profile = tmp_path / "profile.csv"
    profile.write_text(PROFILE)
    cases = [
        ({"cost": str(profile), "profile_cost": "exact"},
         "--profile-cost must be fit or table, got 'exact'"),
        ({"profile_cost": "table"}, "--profile-cost is not used by this run: .*'llama2-7b'"),
        ({"cost": "llama2-7b-swa8k"}, "'llama2-7b-swa8k' is neither a readable profile file"),
        ({"cost": wlb.CostModel.from_preset("llama2-7b"), "profile_cost": "fit"},
         "profile_cost applies to a profile CSV"),
        ({"queues": 17}, r"--queues must be in \[0, 16\], got 17"),
        ({"max_tokens": -5}, "--max-tokens must be >= 0 .*got -5"),
        ({"delay_budget": 0.5}, "--delay-budget is not used by this run: .*the packer is 'wlb'"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=message):
            wlb.Packer("wlb", context=CONTEXT, **kwargs)


def test_packer_names_are_the_registry_wlb_plan_lists():
    exe = binary("tools/wlb-plan")
    help_text = subprocess.run([str(exe), "--help"], capture_output=True, text=True,
                               timeout=60).stdout
    listed = help_text.split("Packers (--packer):\n", 1)[1].split("\n\n", 1)[0]
    names = [line.split()[0] for line in listed.splitlines() if line.strip()]
    assert wlb.packer_names() == names
    assert names[:2] == ["original", "original-nextfit"] and "wlb-lookahead" in names
    for name in names:
        assert wlb.Packer(name, context=CONTEXT, micro_batches=N).name == name
