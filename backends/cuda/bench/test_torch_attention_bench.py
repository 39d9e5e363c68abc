"""Tests of torch_attention_bench.py's logic that needs no GPU and no PyTorch.

  python3 -m pytest backends/cuda/bench/test_torch_attention_bench.py -q
"""
import inspect
import os
import subprocess
import sys
import types

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "torch_attention_bench.py")
sys.path.insert(0, HERE)
import torch_attention_bench as tab  # noqa: E402


# Fake varlen_attn functions with the signatures of the versions the script must handle.
def varlen_2_10(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal=False,
                return_aux=None):
    return ("2.10", is_causal)


def varlen_later(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None,
                 scale=None, window_size=(-1, -1), k_cache=None, v_cache=None):
    # As torch does it: causal only when window_size compares equal to the tuple (-1, 0).
    return ("later", window_size == (-1, 0), scale)


def varlen_later_gqa(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None,
                     scale=None, window_size=(-1, -1), enable_gqa=False):
    return ("gqa", window_size == (-1, 0), scale, enable_gqa)


def varlen_no_causal(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, scale=None):
    return None


def varlen_too_few(query, key, value, cu_seq_q, cu_seq_k, max_q):
    return None


POSITIONAL = ("q", "k", "v", "cu", "cu", 512, 512)


def call(fn, **kw):
    kwargs, reason = tab.varlen_call_kwargs(inspect.signature(fn), **kw)
    assert reason is None, reason
    return kwargs, fn(*POSITIONAL, **kwargs)


def test_module_imports_without_torch():
    code = f"import sys; sys.path.insert(0, {HERE!r}); import torch_attention_bench; " \
           "print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_kwargs_2_10_signature_uses_is_causal_and_no_scale():
    kwargs, result = call(varlen_2_10, causal=True, scale=0.088)
    assert kwargs == {"is_causal": True}
    assert result == ("2.10", True)


def test_kwargs_later_signature_uses_window_tuple_and_scale():
    kwargs, result = call(varlen_later, causal=True, scale=0.088)
    assert kwargs == {"window_size": (-1, 0), "scale": 0.088}
    assert type(kwargs["window_size"]) is tuple  # a list would compare unequal: not causal
    assert result == ("later", True, 0.088)


def test_kwargs_non_causal():
    assert call(varlen_2_10, causal=False)[0] == {"is_causal": False}
    kwargs, result = call(varlen_later, causal=False)
    assert kwargs == {"window_size": (-1, -1)} and result[1] is False


def test_kwargs_scale_none_is_not_passed():
    assert "scale" not in call(varlen_later, causal=True, scale=None)[0]


def test_gqa_needs_enable_gqa():
    for fn in (varlen_2_10, varlen_later):
        kwargs, reason = tab.varlen_call_kwargs(inspect.signature(fn), causal=True, gqa=True)
        assert kwargs is None and "enable_gqa" in reason
    kwargs, result = call(varlen_later_gqa, causal=True, scale=0.1, gqa=True)
    assert kwargs == {"window_size": (-1, 0), "scale": 0.1, "enable_gqa": True}
    assert result == ("gqa", True, 0.1, True)
    # Without GQA the flag is not passed even when accepted.
    assert "enable_gqa" not in call(varlen_later_gqa, causal=True)[0]


def test_unusable_signatures_give_reasons():
    kwargs, reason = tab.varlen_call_kwargs(inspect.signature(varlen_no_causal), causal=True)
    assert kwargs is None and "is_causal" in reason and "window_size" in reason
    kwargs, reason = tab.varlen_call_kwargs(inspect.signature(varlen_too_few), causal=True)
    assert kwargs is None and "positional" in reason


def test_var_positional_signature_is_accepted():
    def fn(*args, is_causal=False):
        return is_causal
    assert call(fn, causal=True)[1] is True


def test_format_call():
    assert tab.format_call({"window_size": (-1, 0), "scale": 0.5}) == (
        "varlen_attn(q, k, v, cu_seq, cu_seq, max_len, max_len, window_size=(-1, 0), scale=0.5)")


def test_load_varlen_with_fake_modules(monkeypatch):
    mod = types.ModuleType("torch.nn.attention.varlen")
    mod.varlen_attn = varlen_later
    monkeypatch.setitem(sys.modules, "torch.nn.attention.varlen", mod)
    fn, sig, reason = tab.load_varlen()
    assert fn is varlen_later and reason is None and "window_size" in sig.parameters

    empty = types.ModuleType("torch.nn.attention.varlen")
    monkeypatch.setitem(sys.modules, "torch.nn.attention.varlen", empty)
    fn, sig, reason = tab.load_varlen()
    assert fn is None and sig is None and "no varlen_attn" in reason


def test_load_varlen_missing_module(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.nn.attention.varlen", None)  # import raises
    fn, sig, reason = tab.load_varlen()
    assert fn is None and sig is None and "torch.nn.attention.varlen" in reason
    assert "ModuleNotFoundError" in reason or "ImportError" in reason


def test_cu_seqlens():
    assert tab.cu_seqlens([3, 5, 2]) == [0, 3, 8, 10]
    assert tab.cu_seqlens([512] * 4) == [0, 512, 1024, 1536, 2048]
    with pytest.raises(ValueError):
        tab.cu_seqlens([2 ** 30, 2 ** 30])


def test_flops_match_attention_bench():
    fwd, bwd = tab.attention_flops([2, 3], heads=1, head_dim=1)
    assert fwd == 4.0 * (3 + 6) and bwd == 2.5 * fwd
    # 16K config: 8 documents of 16384 tokens, 16 heads, head_dim 128.
    fwd, bwd = tab.attention_flops(tab.uniform_lengths(16384, 131072), 16, 128)
    assert fwd == 4.0 * 128 * 16 * 8 * (16384 * 16385 // 2)
    assert tab.tflops(fwd, 10.0) == pytest.approx(fwd / 1e10)


def test_parse_configs():
    configs = tab.parse_configs("512, 16384,mix,200000", 131072, [100, 300])
    assert [c[0] for c in configs] == ["512", "16384", "mix", "200000"]
    assert configs[0][1] == [512] * 256
    assert configs[1][1] == [16384] * 8
    assert configs[2][1] == [100, 300]
    assert configs[3][1] == [200000]  # at least one document, as attention_bench
    assert tab.parse_configs("mix", 131072, None) == [("mix", None)]
    for bad in ("abc", "0", "-5"):
        with pytest.raises(ValueError):
            tab.parse_configs(bad, 131072)


def test_validate_lengths():
    assert tab.validate_lengths([1, 2]) == [1, 2]
    for bad in ([], [0], [1.5], [True], "12", [-3]):
        with pytest.raises(ValueError):
            tab.validate_lengths(bad)


def test_is_uniform():
    assert tab.is_uniform([512] * 3) and not tab.is_uniform([512, 513])


def test_parse_backends():
    assert tab.parse_backends(tab.DEFAULT_BACKENDS) == ["flash", "cudnn", "efficient", "varlen"]
    assert tab.parse_backends("varlen, flash,varlen") == ["varlen", "flash"]
    for bad in ("flash,math", "", " , "):
        with pytest.raises(ValueError):
            tab.parse_backends(bad)
    assert [tab.impl_name(b) for b in ("flash", "cudnn", "efficient", "default", "varlen")] == [
        "torch_sdpa_flash", "torch_sdpa_cudnn", "torch_sdpa_efficient", "torch_sdpa_default",
        "torch_varlen"]


def test_check_segments():
    assert tab.check_segments([512] * 10, 1024) == [(0, 0, 512), (1, 512, 512)]
    assert tab.check_segments([16384] * 8, 4096) == [(0, 0, 4096)]
    assert tab.check_segments([100, 3000, 5000], 4096) == [(0, 0, 100), (1, 100, 3000),
                                                           (2, 3100, 996)]
    assert tab.check_segments([10], 4096) == [(0, 0, 10)]


def test_parse_args_errors(tmp_path):
    mix = tmp_path / "mix.json"
    mix.write_text("[100, 200]\n")
    a = tab.parse_args(["--mix-lengths", str(mix), "--configs", "512,mix"])
    assert a.config_list == [("512", [512] * 256), ("mix", [100, 200])]
    assert a.check and a.backend_list == ["flash", "cudnn", "efficient", "varlen"]
    assert not tab.parse_args(["--no-check"]).check
    for argv in (["--backends", "nope"], ["--heads", "16", "--kv-heads", "5"],
                 ["--mix-lengths", str(tmp_path / "missing.json")], ["--configs", "x"]):
        with pytest.raises(SystemExit) as e:
            tab.parse_args(argv)
        assert e.value.code == 2


def test_script_help_and_without_torch():
    out = subprocess.run([sys.executable, SCRIPT, "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "--mix-lengths" in out.stdout
    import importlib.util
    if importlib.util.find_spec("torch") is not None:
        pytest.skip("PyTorch installed: the no-torch exit is not reachable here")
    out = subprocess.run([sys.executable, SCRIPT, "--configs", "512"], capture_output=True,
                         text=True)
    assert out.returncode == 3 and "PyTorch is not importable" in out.stdout


def fake_torch(monkeypatch, varlen_fn):
    """A stand-in torch module: enough for main() up to run_backend."""
    ns = types.SimpleNamespace
    torch = types.ModuleType("torch")
    torch.__version__ = "9.9.9+fake"
    torch.version = ns(cuda="13.0")
    torch.backends = ns(cudnn=ns(version=lambda: 91002))
    torch.cuda = ns(is_available=lambda: True, get_device_name=lambda: "Fake GPU",
                    empty_cache=lambda: None)
    nccl = types.ModuleType("torch.cuda.nccl")
    nccl.version = lambda: (2, 27, 7)
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setitem(sys.modules, "torch.cuda.nccl", nccl)
    varlen = types.ModuleType("torch.nn.attention.varlen")
    if varlen_fn is not None:
        varlen.varlen_attn = varlen_fn
    monkeypatch.setitem(sys.modules, "torch.nn.attention.varlen", varlen)


def test_main_rows_with_fake_torch(monkeypatch, tmp_path, capsys):
    real = tab.run_backend
    seen = []

    def run_backend(torch, backend, lengths, a, varlen, check):
        seen.append((backend, len(lengths), check))
        if backend != "varlen" and not tab.is_uniform(lengths):
            return real(torch, backend, lengths, a, varlen, check)  # skipped, touches no torch
        if backend == "cudnn":
            raise RuntimeError("No available kernel")
        if backend == "efficient":
            return {"max_rel_err": 0.5, "error": "check failed: relative L2 error 0.5"}
        return {"max_rel_err": 1e-3, "fwd_ms": 2.0, "bwd_ms": 5.0, "fwd_tflops": 100.0,
                "bwd_tflops": 100.0}

    monkeypatch.setattr(tab, "run_backend", run_backend)
    fake_torch(monkeypatch, varlen_later)
    mix = tmp_path / "mix.json"
    mix.write_text("[100, 3000, 7]")
    rows_path = tmp_path / "rows.jsonl"
    rc = tab.main(["--configs", "512,mix", "--mix-lengths", str(mix), "--json", str(rows_path)])
    assert rc == 1  # a check failed
    out = capsys.readouterr().out
    assert "torch 9.9.9+fake, cuda 13.0, cudnn 91002, nccl 2.27.7, device Fake GPU" in out
    assert "varlen_attn signature:" in out and "window_size" in out
    assert "varlen call: varlen_attn(q, k, v, cu_seq, cu_seq, max_len, max_len, " \
           "window_size=(-1, 0), scale=" in out
    rows = [tab.json.loads(line) for line in rows_path.read_text().splitlines()]
    by = {(r["config"], r["impl"]): r for r in rows}
    assert len(rows) == 8
    assert by[("512", "torch_sdpa_flash")]["fwd_tflops"] == 100.0
    assert "RuntimeError: No available kernel" in by[("512", "torch_sdpa_cudnn")]["error"]
    assert by[("512", "torch_sdpa_efficient")]["error"].startswith("check failed")
    for impl in ("torch_sdpa_flash", "torch_sdpa_cudnn", "torch_sdpa_efficient"):
        r = by[("mix", impl)]
        assert "skipped" in r and "fwd_tflops" not in r and "error" not in r
    v = by[("mix", "torch_varlen")]
    assert v["docs"] == 3 and v["tokens"] == 3107 and v["max_rel_err"] == 1e-3
    for r in rows:
        assert {"impl", "config", "docs", "tokens", "heads", "kv_heads", "head_dim",
                "torch"} <= set(r)
        assert r["torch"] == "9.9.9+fake" and r["heads"] == 16 and r["head_dim"] == 128
    assert all(check for _, _, check in seen)


def test_main_varlen_unavailable_rows(monkeypatch, tmp_path, capsys):
    fake_torch(monkeypatch, None)  # module without varlen_attn
    rows_path = tmp_path / "rows.jsonl"
    rc = tab.main(["--configs", "mix", "--mix-lengths", write_mix(tmp_path), "--json",
                   str(rows_path), "--backends", "flash,varlen"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "varlen unavailable: torch.nn.attention.varlen has no varlen_attn" in out
    rows = [tab.json.loads(line) for line in rows_path.read_text().splitlines()]
    assert [r["impl"] for r in rows] == ["torch_sdpa_flash", "torch_varlen"]
    assert "skipped" in rows[0]
    assert rows[1]["error"] == "varlen unavailable: torch.nn.attention.varlen has no varlen_attn"


def test_main_gqa_without_enable_gqa(monkeypatch, tmp_path, capsys):
    fake_torch(monkeypatch, varlen_2_10)
    rows_path = tmp_path / "rows.jsonl"
    rc = tab.main(["--configs", "mix", "--mix-lengths", write_mix(tmp_path), "--kv-heads", "4",
                   "--json", str(rows_path), "--backends", "varlen"])
    assert rc == 0
    assert "is_causal" in capsys.readouterr().out  # the 2.10 signature is printed
    (row,) = [tab.json.loads(line) for line in rows_path.read_text().splitlines()]
    assert row["impl"] == "torch_varlen" and row["kv_heads"] == 4
    assert row["error"].startswith("varlen unavailable: kv_heads != heads needs enable_gqa")


def write_mix(tmp_path):
    path = tmp_path / "mix.json"
    path.write_text("[5, 9]")
    return str(path)
