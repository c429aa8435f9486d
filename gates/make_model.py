"""Write a deterministic synthetic GGUF (llama / qwen2 / gemma3 / mamba / jamba, and the architectures of
gates.fallback_archs) with a byte-level SPM vocabulary."""

from __future__ import annotations

import argparse
import hashlib
import sys
import zlib
from pathlib import Path

import numpy as np

from gates.fallback_archs import ARCHS as FALLBACK_ARCHS
from gates.fallback_archs import PAIR_MODELS

# SentencePiece token types as llama.cpp reads them (llama_token_type in llama-vocab.h).
TT_NORMAL, TT_UNKNOWN, TT_CONTROL, TT_BYTE = 1, 2, 3, 6
SPACE = "\u2581"  # SentencePiece's word-boundary marker

# Words the gates' prompts use; every prefix of "▁word" is added too, because llama.cpp's SPM
# tokenizer only merges adjacent pieces whose concatenation is itself a token.
WORDS = (
    "the pass key is remember it what there grass green sky blue sun yellow here we go again "
    "and of to a in that for on with as was at by this be from or an are not have one all "
    "number hello world once upon time story"
).split()

ALIGN = 32          # GGUF default data alignment (general.alignment is not written)
CHUNK_ELEMS = 1 << 22  # rows are generated in chunks of at most ~4M values: bounded RAM, fixed by shape alone


def build_vocab(n_vocab: int) -> tuple[list[str], list[float], list[int]]:
    """<unk> <s> </s>, the 256 byte tokens, word pieces, then two-letter filler up to n_vocab."""
    if n_vocab < 259:
        raise ValueError(f"--vocab must be >= 259 (3 specials + 256 byte tokens), got {n_vocab}")
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [TT_UNKNOWN, TT_CONTROL, TT_CONTROL] + [TT_BYTE] * 256
    pieces: list[str] = [SPACE]
    for w in WORDS:
        for piece in (SPACE + w, SPACE + w.capitalize()):
            for end in range(2, len(piece) + 1):
                pieces.append(piece[:end])
    letters = "abcdefghijklmnopqrstuvwxyz"
    pieces += [a + b for a in letters for b in letters]
    pieces += [SPACE + a for a in letters.upper()] + list(".,?!:;0123456789")
    seen = set(tokens)
    for p in pieces:
        if len(tokens) >= n_vocab:
            break
        if p not in seen:
            seen.add(p)
            tokens.append(p)
            types.append(TT_NORMAL)
    while len(tokens) < n_vocab:  # pad with unreachable pieces so any --vocab size works
        tokens.append(f"<extra_{len(tokens)}>")
        types.append(TT_NORMAL)
    # Longer pieces score higher so SPM prefers whole words; bytes and specials score 0.
    scores = [0.0 if t != TT_NORMAL else float(len(tok)) - i * 1e-4 for i, (tok, t) in enumerate(zip(tokens, types, strict=True))]
    return tokens, scores, types


def tensor_plan(a: argparse.Namespace) -> list[tuple[str, tuple[int, ...], float, float]]:
    """(name, numpy shape, std, mean) for every tensor; numpy shape is ggml's ne reversed."""
    E, H, KV, D, V = a.n_embd, a.n_head, a.n_head_kv, a.head_dim, a.vocab
    q_dim, kv_dim = H * D, KV * D
    plan: list[tuple[str, tuple[int, ...], float, float]] = []
    # Embedding std 1 keeps the residual stream O(1) for llama/qwen2; gemma3 scales by sqrt(n_embd) itself.
    emb_std = 1.0 / np.sqrt(E) if a.arch == "gemma3" else 1.0
    if a.arch in FALLBACK_ARCHS or a.arch in PAIR_MODELS:
        return (FALLBACK_ARCHS.get(a.arch) or PAIR_MODELS[a.arch]).plan(a)
    plan.append(("token_embd.weight", (V, E), emb_std, 0.0))
    if a.arch == "mamba":
        return plan + mamba_layers(a) + [("output_norm.weight", (E,), 0.02, 1.0),
                                         ("output.weight", (V, E), 3.0 / np.sqrt(E), 0.0)]
    for i in range(a.layers):
        p = f"blk.{i}."
        if a.arch == "jamba" and not jamba_is_attention(i):
            plan += mamba_layer(a, i, jamba=True)
            plan += ffn_tensors(a, p)
            continue
        plan.append((p + "attn_norm.weight", (E,), 0.02, 1.0))
        # q/k std a bit above 1/sqrt(fan_in) so attention is not flat: a window/tail bug must move logits.
        plan.append((p + "attn_q.weight", (q_dim, E), 1.5 / np.sqrt(E), 0.0))
        plan.append((p + "attn_k.weight", (kv_dim, E), 1.5 / np.sqrt(E), 0.0))
        plan.append((p + "attn_v.weight", (kv_dim, E), 1.0 / np.sqrt(E), 0.0))
        if a.arch == "qwen2":  # Qwen2 carries q/k/v biases
            plan.append((p + "attn_q.bias", (q_dim,), 0.1, 0.0))
            plan.append((p + "attn_k.bias", (kv_dim,), 0.1, 0.0))
            plan.append((p + "attn_v.bias", (kv_dim,), 0.1, 0.0))
        plan.append((p + "attn_output.weight", (E, q_dim), 1.0 / np.sqrt(q_dim), 0.0))
        if a.arch == "gemma3":
            plan.append((p + "attn_q_norm.weight", (D,), 0.02, 1.0))
            plan.append((p + "attn_k_norm.weight", (D,), 0.02, 1.0))
            plan.append((p + "post_attention_norm.weight", (E,), 0.02, 1.0))
        plan += ffn_tensors(a, p)
        if a.arch == "gemma3":
            plan.append((p + "post_ffw_norm.weight", (E,), 0.02, 1.0))
    plan.append(("output_norm.weight", (E,), 0.02, 1.0))
    # Logit std ~3: peaked enough that the top token is meaningful, flat enough that KLD sees every token.
    plan.append(("output.weight", (V, E), 3.0 / np.sqrt(E), 0.0))
    return plan


def ffn_tensors(a: argparse.Namespace, p: str) -> list[tuple[str, tuple[int, ...], float, float]]:
    E, F = a.n_embd, a.n_ff
    return [(p + "ffn_norm.weight", (E,), 0.02, 1.0),
            (p + "ffn_gate.weight", (F, E), 1.0 / np.sqrt(E), 0.0),
            (p + "ffn_up.weight", (F, E), 1.0 / np.sqrt(E), 0.0),
            (p + "ffn_down.weight", (E, F), 1.0 / np.sqrt(F), 0.0)]


def jamba_is_attention(il: int) -> bool:
    """jamba (hybrid): odd layers are attention layers (KV cache), even layers Mamba layers (recurrent state)."""
    return il % 2 == 1



def add_ssm_keys(w, a) -> None:
    """The Mamba (SSM) hyperparameters, shared by the mamba and jamba models."""
    w.add_ssm_conv_kernel(a.ssm_conv)
    w.add_ssm_inner_size(2 * a.n_embd)
    w.add_ssm_state_size(a.ssm_state)
    w.add_ssm_time_step_rank(a.ssm_dt_rank)

def mamba_layers(a: argparse.Namespace) -> list[tuple[str, tuple[int, ...], float, float]]:
    """A Mamba (recurrent, no KV cache) layer stack: llama.cpp supports only d_inner = 2 x n_embd."""
    plan: list[tuple[str, tuple[int, ...], float, float]] = []
    for i in range(a.layers):
        plan += mamba_layer(a, i)
    return plan


def mamba_layer(a: argparse.Namespace, i: int, jamba: bool = False) -> list[tuple[str, tuple[int, ...], float, float]]:
    """One Mamba layer; jamba's also has RMS norms on dt, B and C."""
    E, DI, DS, DC, R = a.n_embd, 2 * a.n_embd, a.ssm_state, a.ssm_conv, a.ssm_dt_rank
    plan: list[tuple[str, tuple[int, ...], float, float]] = []
    p = f"blk.{i}."
    plan.append((p + "attn_norm.weight", (E,), 0.02, 1.0))
    plan.append((p + "ssm_in.weight", (2 * DI, E), 1.0 / np.sqrt(E), 0.0))
    plan.append((p + "ssm_conv1d.weight", (DI, DC), 1.0 / np.sqrt(DC), 0.0))
    plan.append((p + "ssm_conv1d.bias", (DI,), 0.1, 0.0))
    plan.append((p + "ssm_x.weight", (R + 2 * DS, DI), 1.0 / np.sqrt(DI), 0.0))
    plan.append((p + "ssm_dt.weight", (DI, R), 1.0 / np.sqrt(R), 0.0))
    plan.append((p + "ssm_dt.bias", (DI,), 0.1, -2.0))
    # A = -exp(A_log) in the converters: negative, so the state decays and the scan stays bounded
    plan.append((p + "ssm_a", (DI, DS), 0.1, -1.0))
    plan.append((p + "ssm_d", (DI,), 0.1, 1.0))
    plan.append((p + "ssm_out.weight", (E, DI), 1.0 / np.sqrt(DI), 0.0))
    if jamba:
        plan.append((p + "ssm_dt_norm.weight", (R,), 0.02, 1.0))
        plan.append((p + "ssm_b_norm.weight", (DS,), 0.02, 1.0))
        plan.append((p + "ssm_c_norm.weight", (DS,), 0.02, 1.0))
    return plan


def tensor_dtype(name: str, shape: tuple[int, ...], dtype: str) -> np.dtype:
    # 1-D tensors (norms, biases) stay f32 like llama.cpp's converters write them, and so do Mamba's conv and A
    # (ggml's ssm_conv and ssm_scan read them as f32).
    f32 = (len(shape) == 1 or dtype == "f32" or "ssm_conv1d" in name or name.endswith("ssm_a")
           or name.endswith("compressor_ape.weight"))  # glm5-next adds its k-pool position bias to f32 keys
    return np.dtype(np.float32) if f32 else np.dtype(np.float16)


def tensor_chunks(seed: int, name: str, shape: tuple[int, ...], std: float, mean: float, dt: np.dtype):
    """Yield the tensor's values row-chunk by row-chunk from an RNG keyed by (seed, name)."""
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    rows = shape[0] if len(shape) > 1 else 1
    cols = int(np.prod(shape)) // rows
    step = max(1, CHUNK_ELEMS // cols)
    for r0 in range(0, rows, step):
        n = min(step, rows - r0) * cols
        vals = rng.standard_normal(n, dtype=np.float32) * np.float32(std) + np.float32(mean)
        yield vals.astype(dt, copy=False)


def write_model(a: argparse.Namespace) -> dict:
    tokens, scores, types = build_vocab(a.vocab)
    try:
        import gguf
    except ImportError:  # the GPU machine has no network: the wheel must travel with the gates
        sys.exit("gates.make_model: the 'gguf' package is missing: pip install gguf (or carry its wheel)")
    fb = FALLBACK_ARCHS.get(a.arch) or PAIR_MODELS.get(a.arch)
    w = gguf.GGUFWriter(str(a.output), fb.gguf_arch if fb else a.arch)
    w.add_name(f"forktool-synthetic-{a.arch}")
    w.add_context_length(a.ctx)
    w.add_embedding_length(a.n_embd)
    w.add_block_count(a.layers + a.nextn)
    if fb:
        w.add_feed_forward_length(a.n_ff)
        fb.keys(w, a)
    elif a.arch == "mamba":
        w.add_feed_forward_length(0)
        w.add_head_count(0)
        add_ssm_keys(w, a)
    else:
        w.add_feed_forward_length(a.n_ff)
        w.add_head_count(a.n_head)
        if a.arch == "jamba":  # a Mamba layer is one with no KV heads
            w.add_head_count_kv([a.n_head_kv if jamba_is_attention(i) else 0 for i in range(a.layers)])
            add_ssm_keys(w, a)
        else:
            w.add_head_count_kv(a.n_head_kv)
        w.add_key_length(a.head_dim)
        w.add_value_length(a.head_dim)
        w.add_rope_dimension_count(a.head_dim)
        w.add_rope_freq_base(a.rope_base)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_file_type(1 if a.dtype == "f16" else 0)  # LLAMA_FTYPE_MOSTLY_F16 / ALL_F32
    if a.arch == "gemma3":
        # iSWA: layers with il % pattern < pattern-1 use the sliding window, the rest full attention.
        w.add_sliding_window(a.swa_window)
        w.add_sliding_window_pattern(a.swa_pattern)
        w.add_rope_freq_base_swa(10000.0)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)

    plan = tensor_plan(a)
    for name, shape, _std, _mean in plan:
        dt = tensor_dtype(name, shape, a.dtype)
        w.add_tensor_info(name, shape, dt, int(np.prod(shape)) * dt.itemsize)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    # Tensor data is streamed here (not via add_tensor) so a multi-GB model never sits in RAM.
    fout = w.fout[0]
    n_params = 0
    for name, shape, std, mean in plan:
        dt = tensor_dtype(name, shape, a.dtype)
        pad = (-fout.tell()) % ALIGN
        fout.write(b"\0" * pad)
        for chunk in tensor_chunks(a.seed, name, shape, std, mean, dt):
            chunk.tofile(fout)
        n_params += int(np.prod(shape))
    fout.write(b"\0" * ((-fout.tell()) % ALIGN))
    w.tensors[0].clear()  # data already written by hand; keep the writer from complaining
    w.close()
    h = hashlib.sha256()
    with open(a.output, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return {"path": str(a.output), "arch": a.arch, "n_params": n_params,
            "bytes": a.output.stat().st_size, "sha256": h.hexdigest()}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("-o", "--output", type=Path, required=True, help="GGUF file to write")
    p.add_argument("--arch", default="llama",
                   choices=("llama", "qwen2", "gemma3", "mamba", "jamba", *FALLBACK_ARCHS, *PAIR_MODELS),
                   help="mamba: a recurrent model (no KV cache), d_inner = 2 x n_embd; jamba: hybrid, Mamba and "
                        "attention layers alternating (needs --n-head x --head-dim == --n-embd); "
                        + ", ".join(FALLBACK_ARCHS) + ": the caches their own create_memory branch builds "
                        "(gates.fallback_archs; hy_v4-idx is hy_v4 with a DSA indexer); gemma4 and gemma4-assistant: "
                        "a target and the draft that shares its cache (the assistant with --n-embd 128, the target's "
                        "256 as its embedding_length_out)")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--n-embd", type=int, default=256)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--n-head-kv", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--n-ff", type=int, default=512)
    p.add_argument("--ctx", type=int, default=4096, help="n_ctx_train written to the file")
    p.add_argument("--vocab", type=int, default=512)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--ssm-state", type=int, default=16, help="mamba: state size")
    p.add_argument("--ssm-conv", type=int, default=4, help="mamba: conv kernel")
    p.add_argument("--ssm-dt-rank", type=int, default=16, help="mamba: time-step rank")
    p.add_argument("--dtype", choices=("f16", "f32"), default="f16", help="type of the 2-D weights")
    p.add_argument("--rope-base", type=float, default=10000.0)
    p.add_argument("--swa-window", type=int, default=128, help="gemma3 only: sliding window (tokens)")
    p.add_argument("--swa-pattern", type=int, default=2,
                   help="gemma3 only: every N-th layer is full attention (real Gemma 3 uses 6)")
    p.add_argument("--nextn", type=int, default=0, choices=(0, 1),
                   help="a NextN/MTP block after the --layers trunk layers (" + ", ".join(
                       f.name for f in FALLBACK_ARCHS.values() if f.mtp_memory) + "): what an MTP draft context runs")
    a = p.parse_args(argv)
    if a.nextn and not (a.arch in FALLBACK_ARCHS and FALLBACK_ARCHS[a.arch].mtp_memory):
        p.error(f"--nextn: {a.arch} has no MTP block here")
    if a.arch == "jamba" and a.n_head * a.head_dim != a.n_embd:
        p.error("jamba needs --n-head x --head-dim == --n-embd (llama.cpp's jamba loader assumes it)")
    if a.arch == "qwen2" and a.n_head * a.head_dim != a.n_embd:
        p.error("qwen2 needs --n-head x --head-dim == --n-embd (llama.cpp's qwen2 loader assumes it)")
    if a.n_head % a.n_head_kv:
        p.error("--n-head must be a multiple of --n-head-kv")
    if a.head_dim % 2:
        p.error("--head-dim must be even (RoPE rotates pairs)")
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    a.output.parent.mkdir(parents=True, exist_ok=True)
    info = write_model(a)
    print(f"wrote {info['path']}: {info['arch']}, {info['n_params']:,} params, {info['bytes']:,} bytes, "
          f"sha256 {info['sha256']}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
