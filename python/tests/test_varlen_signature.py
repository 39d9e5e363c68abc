"""The "varlen" backend adapts to every torch.nn.attention.varlen.varlen_attn signature.

torch 2.10 takes ``is_causal`` (no scale, no window_size, no enable_gqa); 2.11 takes ``scale`` and
``window_size`` (no enable_gqa); later versions add ``enable_gqa``. Fakes of the three
signatures, computing plain float64 attention on CPU with the alignment their convention implies
(bottom-right, FlashAttention's), stand in for ``varlen_attn``; the backend must give the math
backend's output, lse and dQ/dK/dV for keys longer than queries, GQA and a non-default scale.
"""

import math

import pytest

torch = pytest.importorskip("torch")
varlen_mod = pytest.importorskip("torch.nn.attention.varlen")

from wlb.torch import attention  # noqa: E402


class FakeAuxRequest:
    def __init__(self, lse=False):
        self.lse = lse


def reference(q, k, v, cu_q, cu_k, scale, window_size):
    """Plain attention per segment under FlashAttention's window_size (left, right), -1 for
    unbounded: query i sees keys [i + n_k - n_q - left, i + n_k - n_q + right]; (-1, 0) is
    bottom-right causal (keys 0..n_k-n_q+i)."""
    assert q.shape[1] == k.shape[1], "the fake kernel got unequal heads without enable_gqa"
    outs, lses = [], []
    cq, ck = cu_q.tolist(), cu_k.tolist()
    for i in range(len(cq) - 1):
        qs, ks, vs = q[cq[i]:cq[i + 1]], k[ck[i]:ck[i + 1]], v[ck[i]:ck[i + 1]]
        n_q, n_k = qs.shape[0], ks.shape[0]
        s = torch.einsum("nhd,mhd->hnm", qs, ks) * scale
        left, right = window_size
        last = (n_k - n_q + torch.arange(n_q))[:, None]
        key = torch.arange(n_k)[None, :]
        allowed = torch.ones(n_q, n_k, dtype=torch.bool)
        if right >= 0:
            allowed &= key <= last + right
        if left >= 0:
            allowed &= key >= last - left
        s = s.masked_fill(~allowed, float("-inf"))
        lses.append(torch.logsumexp(s, dim=-1))
        outs.append(torch.einsum("hnm,mhd->nhd", torch.softmax(s, dim=-1), vs))
    return torch.cat(outs, dim=0), torch.cat(lses, dim=1)  # lse: (H, T_q), as FlashAttention


def default_scale(q, scale):
    return 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale


def make_fakes(calls):
    def v2_10(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal=False,
              return_aux=None):
        calls.append(dict(is_causal=is_causal, return_aux=return_aux, q=query, k=key))
        out, lse = reference(query, key, value, cu_seq_q, cu_seq_k, default_scale(query, None),
                             (-1, 0) if is_causal else (-1, -1))
        return (out, lse) if return_aux is not None and return_aux.lse else out

    def v2_11(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None,
              scale=None, window_size=(-1, -1)):
        calls.append(dict(window_size=window_size, scale=scale, return_aux=return_aux, q=query,
                          k=key))
        assert isinstance(window_size, tuple)  # torch tests window_size == (-1, 0)
        out, lse = reference(query, key, value, cu_seq_q, cu_seq_k, default_scale(query, scale),
                             window_size)
        return (out, lse) if return_aux is not None and return_aux.lse else out

    def later(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None,
              scale=None, window_size=(-1, -1), enable_gqa=False, seqused_k=None):
        calls.append(dict(window_size=window_size, scale=scale, enable_gqa=enable_gqa,
                          return_aux=return_aux, q=query, k=key))
        if query.shape[1] != key.shape[1]:
            assert enable_gqa, "unequal heads need enable_gqa=True"
            group = query.shape[1] // key.shape[1]
            key = key.repeat_interleave(group, dim=1)
            value = value.repeat_interleave(group, dim=1)
        assert isinstance(window_size, tuple)
        out, lse = reference(query, key, value, cu_seq_q, cu_seq_k, default_scale(query, scale),
                             window_size)
        return (out, lse) if return_aux is not None and return_aux.lse else out

    return {"2.10": v2_10, "2.11": v2_11, "later": later}


@pytest.fixture
def fake_varlen(monkeypatch):
    """Installs one fake varlen_attn (by name) and returns the list of its recorded calls."""
    calls = []
    fakes = make_fakes(calls)

    def install(name):
        monkeypatch.setattr(varlen_mod, "varlen_attn", fakes[name], raising=False)
        monkeypatch.setattr(varlen_mod, "AuxRequest", FakeAuxRequest, raising=False)
        return calls

    return install


def segments(seed):
    """Random segments whose keys are at least as long as their queries (often longer)."""
    gen = torch.Generator().manual_seed(seed)
    lq, lk = [], []
    for _ in range(int(torch.randint(2, 6, (1,), generator=gen))):
        n_q = int(torch.randint(1, 9, (1,), generator=gen))
        n_k = n_q + int(torch.randint(0, 12, (1,), generator=gen))
        lq.append(n_q)
        lk.append(n_k)
    lq[0], lk[0] = 1, 7  # a single query over a longer key prefix
    lq[-1] = lk[-1]      # and a segment with n_q == n_k
    cu_q = torch.tensor([0] + lq, dtype=torch.int32).cumsum(0).to(torch.int32)
    cu_k = torch.tensor([0] + lk, dtype=torch.int32).cumsum(0).to(torch.int32)
    return cu_q, cu_k, max(lq), max(lk), gen


def tensors(seed, h_q, h_kv, d=8):
    cu_q, cu_k, max_q, max_k, gen = segments(seed)
    q = torch.randn(int(cu_q[-1]), h_q, d, dtype=torch.float64, generator=gen)
    k = torch.randn(int(cu_k[-1]), h_kv, d, dtype=torch.float64, generator=gen)
    v = torch.randn(int(cu_k[-1]), h_kv, d, dtype=torch.float64, generator=gen)
    return q, k, v, cu_q, cu_k, max_q, max_k


def run_backend(fn, q, k, v, cu_q, cu_k, max_q, max_k, scale, d_out):
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    out, lse = fn(q, k, v, cu_q, cu_k, max_q, max_k, scale)
    assert not lse.requires_grad
    (out * d_out).sum().backward()
    return out.detach(), lse, q.grad, k.grad, v.grad


@pytest.mark.parametrize("version", ["2.10", "2.11", "later"])
@pytest.mark.parametrize("heads", [(4, 2), (3, 3)])
@pytest.mark.parametrize("custom_scale", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_varlen_backend_matches_math_on_every_signature(fake_varlen, version, heads,
                                                        custom_scale, seed):
    calls = fake_varlen(version)
    h_q, h_kv = heads
    q, k, v, cu_q, cu_k, max_q, max_k = tensors(seed, h_q, h_kv)
    scale = 0.37 if custom_scale else attention.default_scale(q.shape[-1])
    d_out = torch.randn(q.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(9))

    want = run_backend(attention.math_attention, q, k, v, cu_q, cu_k, max_q, max_k, scale, d_out)
    got = run_backend(attention.varlen_attention, q, k, v, cu_q, cu_k, max_q, max_k, scale, d_out)
    for name, a, b in zip(("out", "lse", "dq", "dk", "dv"), got, want):
        assert a.shape == b.shape, name
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10, msg=name)

    (call,) = calls
    assert isinstance(call["return_aux"], FakeAuxRequest) and call["return_aux"].lse
    if version == "2.10":
        assert call["is_causal"] is True
        # No scale parameter: the scale is folded into q unless it is the default 1/sqrt(D).
        if custom_scale:
            torch.testing.assert_close(call["q"], q * (scale * math.sqrt(q.shape[-1])))
        else:
            assert torch.equal(call["q"], q)
        assert call["k"].shape[1] == h_q  # heads expanded for GQA
    else:
        assert call["window_size"] == (-1, 0) and isinstance(call["window_size"], tuple)
        assert call["scale"] == scale
        assert torch.equal(call["q"], q)
    if version == "2.11":
        assert call["k"].shape[1] == h_q  # heads expanded for GQA
    if version == "later":
        assert call["enable_gqa"] == (h_q != h_kv)
        assert call["k"].shape[1] == h_kv  # the kernel does GQA itself


@pytest.mark.parametrize("version", ["2.11", "later"])
@pytest.mark.parametrize("window", [1, 3, 50])
def test_varlen_backend_sliding_window_is_window_size(fake_varlen, version, window):
    """A sliding window of w keys reaches varlen_attn as window_size=(w - 1, 0) and gives the
    math backend's windowed output and gradients."""
    calls = fake_varlen(version)
    q, k, v, cu_q, cu_k, max_q, max_k = tensors(window, 4, 2)
    scale = attention.default_scale(q.shape[-1])
    d_out = torch.randn(q.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(5))

    def run(fn):
        return run_backend(lambda *a: fn(*a, window=window), q, k, v, cu_q, cu_k, max_q, max_k,
                           scale, d_out)

    for name, a, b in zip(("out", "lse", "dq", "dk", "dv"), run(attention.varlen_attention),
                          run(attention.math_attention)):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10, msg=name)
    assert calls[0]["window_size"] == (window - 1, 0)


def test_varlen_backend_refuses_a_window_without_window_size(fake_varlen):
    fake_varlen("2.10")
    q, k, v, cu_q, cu_k, max_q, max_k = tensors(0, 2, 2)
    with pytest.raises(RuntimeError, match="no window_size.*sliding window of 4 keys"):
        attention.varlen_attention(q, k, v, cu_q, cu_k, max_q, max_k, 0.3, window=4)
    assert not attention._varlen_has_window()
    fake_varlen("2.11")
    assert attention._varlen_has_window()


def test_varlen_backend_without_return_aux_names_the_torch_version(monkeypatch):
    def no_aux(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal=False):
        raise AssertionError("must not be called")

    monkeypatch.setattr(varlen_mod, "varlen_attn", no_aux, raising=False)
    monkeypatch.setattr(varlen_mod, "AuxRequest", FakeAuxRequest, raising=False)
    q, k, v, cu_q, cu_k, max_q, max_k = tensors(0, 2, 2)
    with pytest.raises(RuntimeError) as info:
        attention.varlen_attention(q, k, v, cu_q, cu_k, max_q, max_k, 0.3)
    assert f"torch {torch.__version__}" in str(info.value)
    assert "return_aux" in str(info.value) and "backend='math'" in str(info.value)


def test_has_varlen_only_checks_importability(monkeypatch):
    monkeypatch.setattr(varlen_mod, "varlen_attn", make_fakes([])["2.10"], raising=False)
    assert attention.has_varlen()
