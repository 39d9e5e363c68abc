#!/usr/bin/env python3
"""PyTorch's own attention on the shapes of wlb_cuda_attention_bench, for a side-by-side ratio.

Configs (--configs): uniform "<L>" configs are --tokens // L documents of L tokens each; "mix" is
the micro-batch of many lengths written by attention_bench --dump_mix (--mix-lengths JSON list).
Every document is causal, bf16, head_dim --head-dim, --heads query heads, --kv-heads KV heads,
softmax scale 1/sqrt(head_dim).

Backends (--backends, default flash,cudnn,efficient,varlen):
  flash, cudnn, efficient, default: torch.nn.functional.scaled_dot_product_attention under
      torch.nn.attention.sdpa_kernel (default: no restriction), rows "torch_sdpa_<backend>".
      Run on uniform configs only, as ONE (B, H, L, D) call with is_causal=True (exactly
      per-document causal attention). On a mix they are not run: the script writes a row with a
      "skipped" field (the reason) and no timing fields; it never times one SDPA call per length.
  varlen: torch.nn.attention.varlen.varlen_attn on the packed THD batch (total_tokens, heads,
      head_dim) with int32 cu_seqlens on the device, row "torch_varlen". Run on every config
      (uniform configs use the uniform boundaries), so it is the varlen baseline for the mix and
      comparable with SDPA on uniform configs. The call adapts to the installed signature
      (inspect.signature, printed at start): causal via is_causal=True when that parameter
      exists, else window_size=(-1, 0) (a tuple: torch compares it with == (-1, 0)); scale when
      accepted (else its default, which is the same 1/sqrt(head_dim)); GQA via enable_gqa when
      accepted, else a kv_heads != heads config is reported unavailable. A missing module or
      function gives a row with "error": "varlen unavailable: <reason>".

Inputs are filled on the device (torch.rand with a CUDA generator, mapped to [-1, 1]). Forward is
timed alone (no_grad); backward is torch.autograd.grad of an already computed forward with a
fixed random dout. CUDA events, --warmup untimed iterations then the median of --iters.
FLOPs as attention_bench counts them (useful causal pairs): 4 * D * H * sum_docs L (L + 1) / 2
forward, 2.5x that backward; TFLOP/s are comparable with the C++ bench's.

--check (default on; --no-check to skip): before timing, every (config, backend) that runs has
its forward compared with a float32 math reference on the first --check-tokens tokens (default
4096; a document cut there keeps its causal prefix, which depends on nothing after it), a few ms
per row. The relative L2 error (the largest over the checked documents) is the row's
"max_rel_err"; above 2e-2 the row gets "error": "check failed: ..." and no timings (a wrong call
is no baseline), and the script exits 1.

A backend that refuses a shape is a row with "error" (exit status unaffected). Output is line-
buffered and every JSON line is flushed as written, so a run killed by `timeout` keeps its rows.
Exit status: 0, 1 when a check failed, 2 for bad arguments, 3 without PyTorch or a CUDA device.

  python3 torch_attention_bench.py --mix-lengths mix.json --json out.jsonl \\
      [--configs 512,2048,8192,16384,mix --tokens 131072 --heads 16 --head-dim 128 \\
       --backends flash,cudnn,efficient,varlen]
"""
import argparse
import contextlib
import importlib
import inspect
import json
import math
import statistics
import sys

SDPA_BACKENDS = ("flash", "cudnn", "efficient", "default")
VARLEN_BACKEND = "varlen"
DEFAULT_BACKENDS = "flash,cudnn,efficient,varlen"
CHECK_TOLERANCE = 2e-2
# varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, ...) in every version.
VARLEN_POSITIONAL = 7
MIX_SKIP_REASON = ("SDPA backends run uniform configs only (one (B, H, L, D) call); "
                   "the mix is timed by torch_varlen")


# ---- pure functions (no torch) ------------------------------------------------------------------

def parse_backends(text):
    """'flash,cudnn,varlen' -> ['flash', 'cudnn', 'varlen'] (order kept, duplicates dropped)."""
    names = []
    for name in (s.strip() for s in text.split(",")):
        if not name:
            continue
        if name not in SDPA_BACKENDS + (VARLEN_BACKEND,):
            raise ValueError(f"unknown backend '{name}' (known: "
                             f"{', '.join(SDPA_BACKENDS + (VARLEN_BACKEND,))})")
        if name not in names:
            names.append(name)
    if not names:
        raise ValueError("no backends given")
    return names


def impl_name(backend):
    return "torch_varlen" if backend == VARLEN_BACKEND else f"torch_sdpa_{backend}"


def validate_lengths(lengths, source="mix lengths"):
    if not isinstance(lengths, list) or not lengths:
        raise ValueError(f"{source}: expected a non-empty JSON list of document lengths")
    for x in lengths:
        if isinstance(x, bool) or not isinstance(x, int) or x <= 0:
            raise ValueError(f"{source}: every length must be a positive integer, got {x!r}")
    return lengths


def uniform_lengths(length, tokens):
    """Documents of one length filling `tokens` (at least one), as attention_bench builds them."""
    if length <= 0:
        raise ValueError(f"document length must be positive, got {length}")
    return [length] * max(1, tokens // length)


def parse_configs(text, tokens, mix_lengths=None):
    """'512,2048,mix' -> [(name, lengths or None)]; lengths is None for a mix without a file."""
    configs = []
    for name in (s.strip() for s in text.split(",")):
        if not name:
            continue
        if name == "mix":
            configs.append((name, None if mix_lengths is None else list(mix_lengths)))
            continue
        try:
            length = int(name)
        except ValueError:
            raise ValueError(f"bad config '{name}' (a document length or 'mix')") from None
        configs.append((name, uniform_lengths(length, tokens)))
    return configs


def is_uniform(lengths):
    return len(set(lengths)) == 1


def cu_seqlens(lengths):
    """Cumulative document boundaries [0, l0, l0 + l1, ...], checked to fit int32."""
    cu = [0]
    for length in lengths:
        cu.append(cu[-1] + length)
    if cu[-1] >= 2 ** 31:
        raise ValueError(f"{cu[-1]} tokens do not fit int32 cu_seqlens")
    return cu


def attention_flops(lengths, heads, head_dim):
    """(forward, backward) useful FLOPs of per-document causal attention, as attention_bench."""
    pairs = sum(length * (length + 1) // 2 for length in lengths)
    fwd = 4.0 * head_dim * heads * pairs
    return fwd, 2.5 * fwd


def tflops(flops, ms):
    return flops / ms / 1e9


def check_segments(lengths, budget):
    """The leading (doc, offset, length) pieces of at most `budget` tokens in all (>= 1 token).

    The last document may be cut: with causal attention its first rows depend only on its first
    keys, so a prefix of a document checks exactly the same output rows as the whole one.
    """
    segments, offset, left = [], 0, max(1, budget)
    for doc, length in enumerate(lengths):
        if left <= 0:
            break
        take = min(length, left)
        segments.append((doc, offset, take))
        offset += length
        left -= take
    return segments


def _positional_capacity(sig):
    count = 0
    for p in sig.parameters.values():
        if p.kind is inspect.Parameter.VAR_POSITIONAL:
            return math.inf
        if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD):
            count += 1
    return count


def varlen_call_kwargs(sig, *, causal=True, scale=None, gqa=False):
    """Keyword arguments for varlen_attn(q, k, v, cu_q, cu_k, max_q, max_k, **kwargs).

    wlb.torch.attention.varlen_attention adapts to the same signatures for training; this bench
    keeps its own small copy because it runs where the wlb package is not installed (the GPU
    machine) and must time PyTorch's kernel as is: no K/V head expansion or q pre-scaling, so a
    signature that cannot express the call is reported, not worked around.

    Returns (kwargs, None), or (None, reason) when this signature cannot express the call.
    Handles both forms seen so far:
      2.10: varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal=False,
                        return_aux=None)
      later: varlen_attn(..., max_k, *, return_aux=None, scale=None, window_size=(-1, -1), ...)
             which derives causal from window_size == (-1, 0) (so it must be that tuple).
    """
    params = sig.parameters
    if _positional_capacity(sig) < VARLEN_POSITIONAL:
        return None, (f"signature {sig} takes fewer than {VARLEN_POSITIONAL} positional "
                      "arguments (query, key, value, cu_seq_q, cu_seq_k, max_q, max_k)")
    kwargs = {}
    if "is_causal" in params:
        kwargs["is_causal"] = bool(causal)
    elif "window_size" in params:
        kwargs["window_size"] = (-1, 0) if causal else (-1, -1)
    else:
        return None, f"signature {sig} has neither is_causal nor window_size"
    if scale is not None and "scale" in params:
        kwargs["scale"] = float(scale)
    if gqa:
        if "enable_gqa" in params:
            kwargs["enable_gqa"] = True
        else:
            return None, (f"kv_heads != heads needs enable_gqa, which signature {sig} "
                          "does not accept")
    return kwargs, None


def format_call(kwargs):
    extra = "".join(f", {k}={v!r}" for k, v in kwargs.items())
    return f"varlen_attn(q, k, v, cu_seq, cu_seq, max_len, max_len{extra})"


def format_versions(info):
    return ", ".join(f"{k} {v}" for k, v in info.items())


# ---- torch ---------------------------------------------------------------------------------------

def load_varlen():
    """(function, inspect.Signature, None) or (None, None, reason)."""
    try:
        module = importlib.import_module("torch.nn.attention.varlen")
    except Exception as e:  # ImportError, or anything a half-installed torch raises
        return None, None, f"torch.nn.attention.varlen: {type(e).__name__}: {e}"
    fn = getattr(module, "varlen_attn", None)
    if fn is None:
        return None, None, "torch.nn.attention.varlen has no varlen_attn"
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError) as e:
        return None, None, f"inspect.signature(varlen_attn): {type(e).__name__}: {e}"
    return fn, sig, None


def torch_versions(torch):
    def guarded(f):
        try:
            v = f()
        except Exception as e:
            return f"unavailable ({type(e).__name__})"
        if isinstance(v, (tuple, list)):
            return ".".join(str(x) for x in v)
        return str(v)

    return {
        "torch": torch.__version__,
        "cuda": guarded(lambda: torch.version.cuda),
        "cudnn": guarded(lambda: torch.backends.cudnn.version()),
        "nccl": guarded(lambda: importlib.import_module("torch.cuda.nccl").version()),
        "device": guarded(lambda: torch.cuda.get_device_name()),
    }


def sdpa_context(backend):
    """sdpa_kernel restricted to one SDPA backend; no restriction for "default"."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    if backend == "default":
        return contextlib.nullcontext()
    table = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
             "efficient": SDPBackend.EFFICIENT_ATTENTION}
    return sdpa_kernel([table[backend]])


class Problem:
    """Device tensors (q, k, v with grad, dout; cu_seqlens for THD) of one (config, backend).

    layout "bhld": uniform documents as (B, H, L, D) for SDPA; "thd": packed (T, H, D) for varlen.
    """

    def __init__(self, torch, lengths, heads, kv_heads, dim, layout, seed):
        self.torch, self.lengths, self.layout = torch, lengths, layout
        gen = torch.Generator(device="cuda").manual_seed(seed)

        def rnd(h):
            if layout == "bhld":
                shape = (len(lengths), h, lengths[0], dim)
            else:
                shape = (sum(lengths), h, dim)
            # [0, 1) on the device, mapped in place to [-1, 1).
            return torch.rand(shape, device="cuda", dtype=torch.bfloat16,
                              generator=gen).mul_(2).sub_(1)

        self.q = rnd(heads).requires_grad_()
        self.k = rnd(kv_heads).requires_grad_()
        self.v = rnd(kv_heads).requires_grad_()
        self.dout = rnd(heads)
        self.cu = self.max_len = None
        if layout == "thd":
            self.cu = torch.tensor(cu_seqlens(lengths), dtype=torch.int32, device="cuda")
            self.max_len = max(lengths)

    def segment(self, t, doc, offset, length):
        """(heads, length, D) view of document `doc`'s first `length` tokens of tensor t."""
        if self.layout == "bhld":
            return t[doc, :, :length]
        return t[offset:offset + length].transpose(0, 1)


def reference_attention(torch, q, k, v, scale):
    """float32 causal attention of one document: q (H, L, D), k and v (Hk, L, D)."""
    q, k, v = q.float(), k.float(), v.float()
    if k.shape[0] != q.shape[0]:
        rep = q.shape[0] // k.shape[0]
        k, v = k.repeat_interleave(rep, dim=0), v.repeat_interleave(rep, dim=0)
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    length = q.shape[1]
    mask = torch.ones((length, length), dtype=torch.bool, device=q.device).triu_(1)
    scores.masked_fill_(mask, float("-inf"))
    return torch.matmul(torch.softmax(scores, dim=-1), v)


def max_relative_error(torch, problem, out, scale, budget):
    """Largest relative L2 error over the checked documents (see check_segments)."""
    worst = 0.0
    with torch.no_grad():
        for doc, offset, length in check_segments(problem.lengths, budget):
            seg = lambda t: problem.segment(t, doc, offset, length)  # noqa: E731
            ref = reference_attention(torch, seg(problem.q), seg(problem.k), seg(problem.v), scale)
            err = (seg(out).float() - ref).norm() / ref.norm().clamp_min(1e-30)
            worst = max(worst, float(err))
    return worst


def time_forward_backward(torch, fwd, inputs, dout, warmup, iters):
    start = torch.cuda.Event(enable_timing=True)
    stop = torch.cuda.Event(enable_timing=True)
    fwd_ms, bwd_ms = [], []
    for i in range(warmup + iters):
        torch.cuda.synchronize()
        start.record()
        with torch.no_grad():
            fwd()
        stop.record()
        torch.cuda.synchronize()
        if i >= warmup:
            fwd_ms.append(start.elapsed_time(stop))
    for i in range(warmup + iters):
        out = fwd()
        torch.cuda.synchronize()
        start.record()
        torch.autograd.grad(out, inputs, dout)
        stop.record()
        torch.cuda.synchronize()
        del out
        if i >= warmup:
            bwd_ms.append(start.elapsed_time(stop))
    return statistics.median(fwd_ms), statistics.median(bwd_ms)


def run_backend(torch, backend, lengths, a, varlen, check):
    """Row fields of one (config, backend): timings and max_rel_err, or error, or skipped.

    Raises what torch raises for a shape a backend refuses (the caller records it). The device
    tensors live in this frame only, so they are freed when it returns or its exception is dropped.
    """
    fields = {}
    scale = 1.0 / math.sqrt(a.head_dim)
    gqa = a.kv_heads != a.heads
    if backend == VARLEN_BACKEND:
        fn, sig, reason = varlen
        kwargs = None
        if fn is not None:
            kwargs, reason = varlen_call_kwargs(sig, causal=True, scale=scale, gqa=gqa)
        if kwargs is None:
            return {"error": f"varlen unavailable: {reason}"}
        fields["varlen_call"] = format_call(kwargs)
        problem = Problem(torch, lengths, a.heads, a.kv_heads, a.head_dim, "thd", a.seed)

        def fwd():
            out = fn(problem.q, problem.k, problem.v, problem.cu, problem.cu, problem.max_len,
                     problem.max_len, **kwargs)
            return out[0] if isinstance(out, (tuple, list)) else out

        context = contextlib.nullcontext()
    else:
        if not is_uniform(lengths):
            return {"skipped": MIX_SKIP_REASON}
        problem = Problem(torch, lengths, a.heads, a.kv_heads, a.head_dim, "bhld", a.seed)
        extra = {"enable_gqa": True} if gqa else {}
        F = torch.nn.functional

        def fwd():
            return F.scaled_dot_product_attention(problem.q, problem.k, problem.v,
                                                  is_causal=True, scale=scale, **extra)

        context = sdpa_context(backend)
    with context:
        if check:
            with torch.no_grad():
                out = fwd()
            err = max_relative_error(torch, problem, out, scale, a.check_tokens)
            del out
            fields["max_rel_err"] = err
            if not err <= CHECK_TOLERANCE:  # NaN fails too
                fields["error"] = (f"check failed: relative L2 error {err:.3g} > "
                                   f"{CHECK_TOLERANCE} vs float32 causal reference on the "
                                   f"first {a.check_tokens} tokens")
                return fields
        fwd_ms, bwd_ms = time_forward_backward(
            torch, fwd, (problem.q, problem.k, problem.v), problem.dout, a.warmup, a.iters)
    fwd_flops, bwd_flops = attention_flops(lengths, a.heads, a.head_dim)
    fields.update(fwd_ms=fwd_ms, bwd_ms=bwd_ms, fwd_tflops=tflops(fwd_flops, fwd_ms),
                  bwd_tflops=tflops(bwd_flops, bwd_ms))
    return fields


def say(*args):
    print(*args, flush=True)


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=131072)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=16)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--configs", default="512,2048,8192,16384,mix")
    ap.add_argument("--mix-lengths", help="JSON list written by attention_bench --dump_mix")
    ap.add_argument("--backends", default=DEFAULT_BACKENDS,
                    help="comma list of flash, cudnn, efficient, default (SDPA) and varlen")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--check", action=argparse.BooleanOptionalAction, default=True,
                    help="compare each backend's forward with a float32 reference (default on)")
    ap.add_argument("--check-tokens", type=int, default=4096,
                    help="leading tokens of each config that --check compares")
    ap.add_argument("--json", help="append one JSON line per (config, backend)")
    a = ap.parse_args(argv)
    if a.heads <= 0 or a.kv_heads <= 0 or a.heads % a.kv_heads:
        ap.error("--heads and --kv-heads must be positive, heads a multiple of kv_heads")
    if a.iters <= 0 or a.warmup < 0 or a.tokens <= 0 or a.head_dim <= 0 or a.check_tokens <= 0:
        ap.error("--iters, --tokens, --head-dim, --check-tokens must be positive, --warmup >= 0")
    try:
        a.backend_list = parse_backends(a.backends)
        mix = None
        if a.mix_lengths:
            with open(a.mix_lengths) as f:
                mix = validate_lengths(json.load(f), a.mix_lengths)
        a.config_list = parse_configs(a.configs, a.tokens, mix)
    except (OSError, ValueError) as e:
        ap.error(str(e))
    return a


def main(argv=None):
    try:
        sys.stdout.reconfigure(line_buffering=True)
    except (AttributeError, ValueError):
        pass
    a = parse_args(argv)
    try:
        import torch
    except Exception as e:
        say(f"PyTorch is not importable ({type(e).__name__}: {e}); nothing measured")
        return 3
    if not torch.cuda.is_available():
        say("no CUDA device visible to PyTorch; nothing measured")
        return 3
    versions = torch_versions(torch)
    say(format_versions(versions))
    varlen = load_varlen()
    fn, sig, reason = varlen
    if fn is None:
        say(f"varlen unavailable: {reason}")
    else:
        say(f"varlen_attn signature: {fn.__module__}.{fn.__name__}{sig}")
        kwargs, why = varlen_call_kwargs(sig, causal=True, scale=1.0 / math.sqrt(a.head_dim),
                                         gqa=a.kv_heads != a.heads)
        say(f"varlen call: {format_call(kwargs)}" if kwargs else f"varlen unavailable: {why}")
    out = open(a.json, "a") if a.json else None
    say(f"{'config':8} {'backend':9} {'fwd_ms':>9} {'fwd_TF':>7} {'bwd_ms':>9} {'bwd_TF':>7} "
        f"{'rel_err':>9}")
    check_failed = False
    for config, lengths in a.config_list:
        if lengths is None:
            say(f"{config:8} skipped: no --mix-lengths file given")
            continue
        for backend in a.backend_list:
            row = {"impl": impl_name(backend), "config": config, "docs": len(lengths),
                   "tokens": sum(lengths), "heads": a.heads, "kv_heads": a.kv_heads,
                   "head_dim": a.head_dim, "torch": versions["torch"],
                   "cuda": versions["cuda"], "cudnn": versions["cudnn"],
                   "device": versions["device"]}
            try:
                fields = run_backend(torch, backend, lengths, a, varlen, a.check)
            except Exception as e:  # a backend that refuses the shape is reported, not fatal
                fields = {"error": f"{type(e).__name__}: {e}"[:400]}
            row.update(fields)
            if str(row.get("error", "")).startswith("check failed"):
                check_failed = True
            err = f"{row['max_rel_err']:9.2e}" if "max_rel_err" in row else f"{'':9}"
            if "fwd_ms" in row:
                say(f"{config:8} {backend:9} {row['fwd_ms']:9.3f} {row['fwd_tflops']:7.1f} "
                    f"{row['bwd_ms']:9.3f} {row['bwd_tflops']:7.1f} {err}")
            elif "skipped" in row:
                say(f"{config:8} {backend:9} skipped: {row['skipped']}")
            else:
                say(f"{config:8} {backend:9} error: {row['error']} {err.strip()}")
            try:
                torch.cuda.empty_cache()
            except Exception:  # after a sticky CUDA error; the next rows report it
                pass
            if out:
                out.write(json.dumps(row) + "\n")
                out.flush()
    if out:
        out.close()
    return 1 if check_failed else 0


if __name__ == "__main__":
    sys.exit(main())
