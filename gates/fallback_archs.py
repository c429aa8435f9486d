"""Tiny synthetic models for the architectures whose own create_memory branch builds a cache without window storage.

Each entry writes the GGUF keys and tensors that the pinned llama.cpp's load_arch_hparams / load_arch_tensors for
that architecture require (src/models/<arch>.cpp), at toy sizes: two layers, the first dense, the last a MoE layer
with its sparse-attention indexer where the architecture has one, so the branch's cache is built with the layers it
was written for. gates.cpu gate d loads them in window mode and expects the fallback line naming `memory`.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

Plan = list[tuple[str, tuple[int, ...], float, float]]

# MLA geometry shared by the DeepSeek-style archs: the cache holds one K row per token of kv_lora + rope values
# (MLA as MQA, one KV head); queries are decompressed through wk_b / wv_b.
Q_LORA, KV_LORA, ROPE, NOPE, V_MLA = 64, 64, 16, 32, 32
K_MLA = NOPE + ROPE
IDX_HEADS, IDX_DIM, IDX_TOP_K = 2, 64, 8   # IDX_DIM a multiple of 64: the indexer keys get a 64-wide Hadamard rotation
N_EXPERT, N_EXPERT_USED, FF_EXP, N_SHARED = 4, 2, 64, 1
GATING_SIGMOID = 2                           # LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID


@dataclass(frozen=True)
class FallbackArch:
    name: str          # what --arch and --fallback-archs take
    gguf_arch: str     # general.architecture written to the file
    memory: str        # the memory type create_memory builds for it (named by the fallback line)
    keys: Callable[[object, argparse.Namespace], None]
    plan: Callable[[argparse.Namespace], Plan]
    mtp_memory: str | None = None  # the memory its MTP draft context gets (--nextn 1), where the model can have one


def w(name: str, *ne: int, std: float | None = None, mean: float = 0.0) -> tuple[str, tuple[int, ...], float, float]:
    """A tensor given in ggml order (ne0 first, as create_tensor spells it); numpy shape is the reverse."""
    if std is None:
        std = 1.0 / np.sqrt(ne[0]) if len(ne) > 1 else 0.1
    return (name, tuple(reversed(ne)), float(std), float(mean))


def norm(name: str, n: int) -> tuple[str, tuple[int, ...], float, float]:
    return w(name, n, std=0.02, mean=1.0)


def head(a: argparse.Namespace) -> Plan:
    E, V = a.n_embd, a.vocab
    return [w("token_embd.weight", E, V, std=1.0), norm("output_norm.weight", E),
            w("output.weight", E, V, std=3.0 / np.sqrt(E))]


def dense_ffn(a: argparse.Namespace, p: str) -> Plan:
    E, F = a.n_embd, a.n_ff
    return [w(p + "ffn_gate.weight", E, F), w(p + "ffn_up.weight", E, F), w(p + "ffn_down.weight", F, E)]


def moe_ffn(a: argparse.Namespace, p: str) -> Plan:
    E = a.n_embd
    return [w(p + "ffn_gate_inp.weight", E, N_EXPERT), w(p + "exp_probs_b.bias", N_EXPERT),
            w(p + "ffn_gate_exps.weight", E, FF_EXP, N_EXPERT), w(p + "ffn_up_exps.weight", E, FF_EXP, N_EXPERT),
            w(p + "ffn_down_exps.weight", FF_EXP, E, N_EXPERT),
            w(p + "ffn_gate_shexp.weight", E, FF_EXP * N_SHARED), w(p + "ffn_up_shexp.weight", E, FF_EXP * N_SHARED),
            w(p + "ffn_down_shexp.weight", FF_EXP * N_SHARED, E)]


def ffn(a: argparse.Namespace, i: int, p: str) -> Plan:
    """Leading layers dense, the last one MoE (leading_dense_block_count = layers - 1)."""
    return dense_ffn(a, p) if i < dense_lead(a) else moe_ffn(a, p)


def dense_lead(a: argparse.Namespace) -> int:
    return max(a.layers - 1, 0)


def mla_attn(a: argparse.Namespace, p: str, rope: int = ROPE) -> Plan:
    """DeepSeek MLA: low-rank q, compressed kv plus a shared rope key (rope 0: nope-only), per-head k/v
    decompression."""
    E, H = a.n_embd, a.n_head
    return [norm(p + "attn_q_a_norm.weight", Q_LORA), norm(p + "attn_kv_a_norm.weight", KV_LORA),
            w(p + "attn_q_a.weight", E, Q_LORA),
            w(p + "attn_q_b.weight", Q_LORA, H * (NOPE + rope), std=1.5 / np.sqrt(Q_LORA)),
            w(p + "attn_kv_a_mqa.weight", E, KV_LORA + rope, std=1.5 / np.sqrt(E)),
            w(p + "attn_k_b.weight", NOPE, KV_LORA, H), w(p + "attn_v_b.weight", KV_LORA, V_MLA, H),
            w(p + "attn_output.weight", H * V_MLA, E)]


def dsa_indexer(a: argparse.Namespace, p: str) -> Plan:
    E = a.n_embd
    return [norm(p + "indexer.k_norm.weight", IDX_DIM), w(p + "indexer.k_norm.bias", IDX_DIM),
            w(p + "indexer.proj.weight", E, IDX_HEADS), w(p + "indexer.attn_k.weight", E, IDX_DIM),
            w(p + "indexer.attn_q_b.weight", Q_LORA, IDX_HEADS * IDX_DIM)]


def mla_keys(wr, a: argparse.Namespace) -> None:
    """The MLA, MoE and DSA keys the DeepSeek-style loaders read (head_count_kv 1: MLA runs as MQA)."""
    arch = wr.arch
    wr.add_head_count(a.n_head)
    wr.add_head_count_kv(1)
    wr.add_key_length(KV_LORA + ROPE)
    wr.add_value_length(KV_LORA)
    wr.add_rope_dimension_count(ROPE)
    wr.add_uint32(f"{arch}.attention.q_lora_rank", Q_LORA)
    wr.add_uint32(f"{arch}.attention.kv_lora_rank", KV_LORA)
    wr.add_uint32(f"{arch}.attention.key_length_mla", K_MLA)
    wr.add_uint32(f"{arch}.attention.value_length_mla", V_MLA)
    moe_keys(wr, a)


def moe_keys(wr, a: argparse.Namespace) -> None:
    arch = wr.arch
    wr.add_uint32(f"{arch}.leading_dense_block_count", dense_lead(a))
    wr.add_uint32(f"{arch}.expert_count", N_EXPERT)
    wr.add_uint32(f"{arch}.expert_used_count", N_EXPERT_USED)
    wr.add_uint32(f"{arch}.expert_feed_forward_length", FF_EXP)
    wr.add_uint32(f"{arch}.expert_shared_count", N_SHARED)
    wr.add_uint32(f"{arch}.expert_gating_func", GATING_SIGMOID)
    wr.add_bool(f"{arch}.expert_weights_norm", True)
    wr.add_float32(f"{arch}.expert_weights_scale", 1.0)


def indexer_keys(wr, a: argparse.Namespace, types: list[int] | None = None) -> None:
    arch = wr.arch
    wr.add_uint32(f"{arch}.attention.indexer.head_count", IDX_HEADS)
    wr.add_uint32(f"{arch}.attention.indexer.key_length", IDX_DIM)
    wr.add_uint32(f"{arch}.attention.indexer.top_k", IDX_TOP_K)
    if types is not None:
        wr.add_array(f"{arch}.attention.indexer.types", types)


# --- deepseek32 / glm-dsa: MLA with a DSA lightning indexer on every layer -> llama_kv_cache_dsa -----------------

def nextn_head(a: argparse.Namespace, p: str) -> Plan:
    """The NextN/MTP wiring around an extra decoder block (the draft head reuses output_norm and output)."""
    E = a.n_embd
    return [w(p + "nextn.eh_proj.weight", 2 * E, E), norm(p + "nextn.enorm.weight", E), norm(p + "nextn.hnorm.weight", E)]


def dsa_plan(a: argparse.Namespace) -> Plan:
    plan = head(a)
    for i in range(a.layers + a.nextn):
        p = f"blk.{i}."
        plan += [norm(p + "attn_norm.weight", a.n_embd), *mla_attn(a, p), norm(p + "ffn_norm.weight", a.n_embd),
                 *dsa_indexer(a, p), *ffn(a, i, p)]
        if i >= a.layers:
            plan += nextn_head(a, p)
    return plan


def dsa_keys(wr, a: argparse.Namespace) -> None:
    mla_keys(wr, a)
    indexer_keys(wr, a)
    if a.nextn:
        wr.add_uint32(f"{wr.arch}.nextn_predict_layers", a.nextn)


# --- hy_v4: MLA with sinks, a sigmoid output gate and hyper-connections -------------------------------------------
HC = 2


def hy_v4_plan(a: argparse.Namespace, indexer: bool) -> Plan:
    E, H = a.n_embd, a.n_head
    plan = head(a) + [w("output_hc_fn.weight", HC * E, HC), w("output_hc_base.weight", HC),
                      w("output_hc_scale.weight", 1, std=0.1, mean=1.0)]
    for i in range(a.layers):
        p = f"blk.{i}."
        plan += [norm(p + "attn_norm.weight", E), w(p + "attn_sinks.weight", H), *mla_attn(a, p),
                 w(p + "attn_gate.weight", E, H * V_MLA)]
        if indexer and hy_v4_indexer_types(a)[i]:
            plan += dsa_indexer(a, p)
        for kind in ("attn", "ffn"):
            plan += [w(f"{p}hc_{kind}_fn.weight", HC * E, 2 * HC), w(f"{p}hc_{kind}_base.weight", 2 * HC),
                     w(f"{p}hc_{kind}_scale.weight", 2, std=0.1, mean=1.0)]
        plan += [norm(p + "ffn_norm.weight", E), *ffn(a, i, p)]
    return plan


def hy_v4_indexer_types(a: argparse.Namespace) -> list[int]:
    """Layer 0 owns an indexer ("full"); the others reuse the last top-k ("shared")."""
    return [1] + [0] * (a.layers - 1)


def hy_v4_keys(wr, a: argparse.Namespace, indexer: bool) -> None:
    mla_keys(wr, a)
    wr.add_uint32(f"{wr.arch}.hyper_connection.count", HC)
    wr.add_float32(f"{wr.arch}.hyper_connection.epsilon", 1e-6)
    wr.add_float32(f"{wr.arch}.hyper_connection.magnitude", 1.0)
    if indexer:
        indexer_keys(wr, a, hy_v4_indexer_types(a))


# --- minimax-m3: GQA attention with QK norms; MSA (block-sparse) indexer on its MoE layers -------------------------
MSA_BLOCK, MSA_TOP_K, MSA_LOCAL = 16, 4, 1


def minimax_m3_plan(a: argparse.Namespace) -> Plan:
    E, H, KV, D = a.n_embd, a.n_head, a.n_head_kv, a.head_dim
    plan = head(a)
    for i in range(a.layers):
        p = f"blk.{i}."
        plan += [norm(p + "attn_norm.weight", E), w(p + "attn_q.weight", E, H * D, std=1.5 / np.sqrt(E)),
                 w(p + "attn_k.weight", E, KV * D, std=1.5 / np.sqrt(E)), w(p + "attn_v.weight", E, KV * D),
                 w(p + "attn_output.weight", H * D, E), norm(p + "attn_q_norm.weight", D),
                 norm(p + "attn_k_norm.weight", D), norm(p + "ffn_norm.weight", E), *ffn(a, i, p)]
        if i >= dense_lead(a):
            plan += [w(p + "indexer.q_proj.weight", E, IDX_HEADS * IDX_DIM), w(p + "indexer.k_proj.weight", E, IDX_DIM),
                     norm(p + "indexer.q_norm.weight", IDX_DIM), norm(p + "indexer.k_norm.weight", IDX_DIM)]
    return plan


def minimax_m3_keys(wr, a: argparse.Namespace) -> None:
    arch = wr.arch
    wr.add_head_count(a.n_head)
    wr.add_head_count_kv(a.n_head_kv)
    wr.add_key_length(a.head_dim)
    wr.add_value_length(a.head_dim)
    wr.add_rope_dimension_count(a.head_dim // 2)  # partial rotary, as the real model
    moe_keys(wr, a)
    indexer_keys(wr, a)
    wr.add_uint32(f"{arch}.attention.indexer.block_size", MSA_BLOCK)
    wr.add_uint32(f"{arch}.attention.indexer.local_blocks", MSA_LOCAL)


# --- dots3note: MLA on sliding-window and full layers, DSA indexer on the full ones -> llama_kv_cache_dsa_iswa -----

def dots3note_swa(a: argparse.Namespace) -> list[int]:
    """Even layers slide, odd layers are full attention (with the indexer)."""
    return [1 if i % 2 == 0 else 0 for i in range(a.layers)]


def dots3note_plan(a: argparse.Namespace) -> Plan:
    E, H = a.n_embd, a.n_head
    plan = head(a)
    swa = dots3note_swa(a)
    for i in range(a.layers):
        p = f"blk.{i}."
        plan += [norm(p + "attn_norm.weight", E), *mla_attn(a, p), norm(p + "attn_k_norm.weight", ROPE),
                 w(p + "attn_gate.weight", E, H), norm(p + "ffn_norm.weight", E)]
        if not swa[i]:
            plan += dsa_indexer(a, p)
        plan += ffn(a, i, p)
    return plan


def dots3note_keys(wr, a: argparse.Namespace) -> None:
    arch = wr.arch
    mla_keys(wr, a)
    wr.add_uint32(f"{arch}.attention.kv_lora_rank_swa", KV_LORA)
    wr.add_uint32(f"{arch}.attention.key_length_mla_swa", K_MLA)
    wr.add_uint32(f"{arch}.attention.value_length_mla_swa", V_MLA)
    wr.add_uint32(f"{arch}.attention.sliding_window", a.swa_window)
    wr.add_float32(f"{arch}.rope.freq_base_swa", 10000.0)
    wr.add_array(f"{arch}.attention.sliding_window_pattern", [bool(s) for s in dots3note_swa(a)])
    indexer_keys(wr, a, [1 - s for s in dots3note_swa(a)])


# --- glm5-next: KDA (recurrent) layers and MLA layers with a k-pooled DSA indexer, under mHC -> llama_memory_hybrid_idx
MHC, KDA_HEAD_DIM, KPOOL, SSM_CONV = 4, 32, 4, 4


def glm5_next_recurrent(a: argparse.Namespace) -> list[bool]:
    """Even layers are KDA (linear attention, recurrent state), odd layers MLA with the indexer."""
    return [i % 2 == 0 for i in range(a.layers)]


def glm5_next_plan(a: argparse.Namespace) -> Plan:
    E, H = a.n_embd, a.n_head
    DI, mix = KDA_HEAD_DIM * H, (2 + MHC) * MHC
    plan = head(a)
    for i, recr in enumerate(glm5_next_recurrent(a)):
        p = f"blk.{i}."
        plan += [norm(p + "attn_norm.weight", E), norm(p + "ffn_norm.weight", E)]
        for kind in ("attn", "ffn"):
            plan += [w(f"{p}hc_{kind}_fn.weight", MHC * E, mix), w(f"{p}hc_{kind}_base.weight", mix),
                     w(f"{p}hc_{kind}_scale.weight", 3, std=0.1, mean=1.0)]
        if recr:
            plan += [w(f"{p}ssm_conv1d_{x}.weight", SSM_CONV, 1, DI, std=1.0 / np.sqrt(SSM_CONV)) for x in "qkv"]
            plan += [w(p + "attn_q.weight", E, DI), w(p + "attn_k.weight", E, DI), w(p + "attn_v.weight", E, DI),
                     w(p + "ssm_f_a.weight", E, KDA_HEAD_DIM), w(p + "ssm_f_b.weight", KDA_HEAD_DIM, DI),
                     w(p + "ssm_beta.weight", E, H), w(p + "ssm_a", H, std=0.1, mean=0.0),
                     w(p + "ssm_dt.bias", DI), w(p + "ssm_g_a.weight", E, KDA_HEAD_DIM),
                     w(p + "ssm_g_b.weight", KDA_HEAD_DIM, DI), norm(p + "ssm_norm.weight", KDA_HEAD_DIM),
                     w(p + "attn_output.weight", DI, E)]
        else:
            plan += [*mla_attn(a, p, rope=0), *dsa_indexer(a, p), w(p + "indexer_compressor_gate.weight", E, IDX_DIM),
                     w(p + "indexer_compressor_ape.weight", IDX_DIM, KPOOL)]
        plan += ffn(a, i, p)
    return plan


def glm5_next_keys(wr, a: argparse.Namespace) -> None:
    arch = wr.arch
    wr.add_head_count(a.n_head)
    wr.add_head_count_kv([0 if r else 1 for r in glm5_next_recurrent(a)])  # a KDA layer has no KV heads
    wr.add_key_length(KV_LORA)             # nope-only MLA: the cache holds the latent alone
    wr.add_value_length(KV_LORA)
    wr.add_rope_dimension_count(0)
    wr.add_uint32(f"{arch}.attention.q_lora_rank", Q_LORA)
    wr.add_uint32(f"{arch}.attention.kv_lora_rank", KV_LORA)
    wr.add_uint32(f"{arch}.attention.key_length_mla", NOPE)
    wr.add_uint32(f"{arch}.attention.value_length_mla", V_MLA)
    wr.add_uint32(f"{arch}.ssm.conv_kernel", SSM_CONV)
    wr.add_uint32(f"{arch}.kda.head_dim", KDA_HEAD_DIM)
    moe_keys(wr, a)
    indexer_keys(wr, a)
    wr.add_uint32(f"{arch}.attention.indexer.kpool", KPOOL)
    wr.add_uint32(f"{arch}.hyper_connection.count", MHC)
    wr.add_uint32(f"{arch}.hyper_connection.sinkhorn_iterations", 3)
    wr.add_float32(f"{arch}.hyper_connection.epsilon", 1e-6)


# --- deepseek4: sliding-window attention with compressed (CSA, ratio 4, with the indexer) and heavily compressed (HCA,
# ratio 128) layers, attention sinks, grouped low-rank output, mHC -> llama_kv_cache_dsv4
DSV4_HEAD, DSV4_ROPE, DSV4_GROUPS, DSV4_O_LORA, DSV4_SWA = 128, 16, 2, 32, 64  # head != indexer width (64), as in the
# real model: the loader gives every deepseek4 cache whose head width equals the indexer's a Hadamard rotation
SQRT_SOFTPLUS = 4                            # LLAMA_EXPERT_GATING_FUNC_TYPE_SQRT_SOFTPLUS, the only one its loader takes


def deepseek4_ratios(a: argparse.Namespace) -> list[int]:
    """Compression ratio per layer: 4 (CSA with the lightning indexer), 128 (HCA), 0 (window only), repeating; the
    NextN block (--nextn) attends over the window alone."""
    return [(4, 128, 0)[i % 3] for i in range(a.layers)] + [0] * a.nextn


def deepseek4_plan(a: argparse.Namespace) -> Plan:
    E, H, D = a.n_embd, a.n_head, DSV4_HEAD
    mix = (2 + MHC) * MHC
    plan = head(a) + [w("output_hc_fn.weight", MHC * E, MHC), w("output_hc_base.weight", MHC),
                      w("output_hc_scale.weight", 1, std=0.1, mean=1.0)]
    for i, ratio in enumerate(deepseek4_ratios(a)):
        p = f"blk.{i}."
        plan += [norm(p + "attn_norm.weight", E), w(p + "attn_sinks.weight", H), w(p + "attn_q_a.weight", E, Q_LORA),
                 norm(p + "attn_q_a_norm.weight", Q_LORA),
                 w(p + "attn_q_b.weight", Q_LORA, H * D, std=1.5 / np.sqrt(Q_LORA)),
                 w(p + "attn_kv.weight", E, D, std=1.5 / np.sqrt(E)), norm(p + "attn_kv_a_norm.weight", D),
                 w(p + "attn_output_a.weight", H * D // DSV4_GROUPS, DSV4_O_LORA, DSV4_GROUPS),
                 w(p + "attn_output_b.weight", DSV4_GROUPS * DSV4_O_LORA, E)]
        for kind in ("attn", "ffn"):
            plan += [w(f"{p}hc_{kind}_fn.weight", MHC * E, mix), w(f"{p}hc_{kind}_base.weight", mix),
                     w(f"{p}hc_{kind}_scale.weight", 3, std=0.1, mean=1.0)]
        if ratio:
            coff = 2 if ratio == 4 else 1
            plan += [w(p + "attn_compressor_kv.weight", E, coff * D), w(p + "attn_compressor_gate.weight", E, coff * D),
                     w(p + "attn_compressor_ape.weight", coff * D, ratio), norm(p + "attn_compressor_norm.weight", D)]
        if ratio == 4:
            plan += [w(p + "indexer.proj.weight", E, IDX_HEADS),
                     w(p + "indexer.attn_q_b.weight", Q_LORA, IDX_HEADS * IDX_DIM),
                     w(p + "indexer_compressor_kv.weight", E, 2 * IDX_DIM),
                     w(p + "indexer_compressor_gate.weight", E, 2 * IDX_DIM),
                     w(p + "indexer_compressor_ape.weight", 2 * IDX_DIM, ratio),
                     norm(p + "indexer_compressor_norm.weight", IDX_DIM)]
        plan += [norm(p + "ffn_norm.weight", E), *moe_ffn(a, p)]  # every layer routed (no hash-routed layers)
        if i >= a.layers:
            plan += nextn_head(a, p)
    return plan


def deepseek4_keys(wr, a: argparse.Namespace) -> None:
    arch = wr.arch
    wr.add_head_count(a.n_head)
    wr.add_head_count_kv(1)
    wr.add_key_length(DSV4_HEAD)
    wr.add_value_length(DSV4_HEAD)
    wr.add_rope_dimension_count(DSV4_ROPE)
    wr.add_uint32(f"{arch}.attention.q_lora_rank", Q_LORA)
    wr.add_uint32(f"{arch}.attention.sliding_window", DSV4_SWA)
    wr.add_uint32(f"{arch}.expert_count", N_EXPERT)
    wr.add_uint32(f"{arch}.expert_used_count", N_EXPERT_USED)
    wr.add_uint32(f"{arch}.expert_feed_forward_length", FF_EXP)
    wr.add_uint32(f"{arch}.expert_shared_count", N_SHARED)
    wr.add_float32(f"{arch}.expert_weights_scale", 1.0)
    wr.add_bool(f"{arch}.expert_weights_norm", True)
    wr.add_uint32(f"{arch}.expert_gating_func", SQRT_SOFTPLUS)
    wr.add_float32(f"{arch}.swiglu_clamp_exp", 10.0)
    indexer_keys(wr, a)
    wr.add_uint32(f"{arch}.attention.output_group_count", DSV4_GROUPS)
    wr.add_uint32(f"{arch}.attention.output_lora_rank", DSV4_O_LORA)
    wr.add_float32(f"{arch}.attention.compress_rope_freq_base", 10000.0)
    wr.add_uint32(f"{arch}.hyper_connection.count", MHC)
    wr.add_uint32(f"{arch}.hyper_connection.sinkhorn_iterations", 3)
    wr.add_float32(f"{arch}.hyper_connection.epsilon", 1e-6)
    wr.add_uint32(f"{arch}.hash_layer_count", 0)
    wr.add_array(f"{arch}.attention.compress_ratios", deepseek4_ratios(a))
    if a.nextn:
        wr.add_uint32(f"{arch}.nextn_predict_layers", a.nextn)


# --- qwen4exp: gated-delta-net (recurrent) and gated full-attention layers with the QSA indexer, low-rank
# hyper-connections -> llama_memory_hybrid_idx through the generic hybrid branch of create_memory
Q4_HC, Q4_HC_RANK, Q4_STATE, Q4_K_HEADS, Q4_V_HEADS = 2, 8, 16, 1, 2
Q4_SECTIONS = [12, 10, 10, 0]                # imrope sections: they sum to half the rotated dims (head_dim 64)


def qwen4exp_plan(a: argparse.Namespace) -> Plan:
    E, H, KV, D = a.n_embd, a.n_head, a.n_head_kv, a.head_dim
    hc_dim = Q4_HC * E
    key_dim, value_dim = Q4_STATE * Q4_K_HEADS, Q4_STATE * Q4_V_HEADS
    plan = [w("token_embd.weight", E, a.vocab, std=1.0), norm("output_hc_norm.weight", E * Q4_HC),
            w("output_hc_down.weight", hc_dim, Q4_HC_RANK), w("output_hc_up.weight", Q4_HC_RANK, hc_dim),
            w("output.weight", E, a.vocab, std=3.0 / np.sqrt(E))]
    for i in range(a.layers):
        p = f"blk.{i}."
        for kind in ("attn", "ffn"):
            plan += [norm(f"{p}hc_{kind}_norm.weight", E * Q4_HC), w(f"{p}hc_{kind}_down.weight", hc_dim, Q4_HC_RANK),
                     w(f"{p}hc_{kind}_up.weight", Q4_HC_RANK, hc_dim), w(f"{p}hc_{kind}_inject.weight", hc_dim, Q4_HC)]
        if qwen4exp_recurrent(i):
            plan += [w(p + "attn_qkv.weight", E, 2 * key_dim + value_dim), w(p + "attn_gate.weight", E, value_dim),
                     w(p + "ssm_conv1d.weight", SSM_CONV, 2 * key_dim + value_dim, std=1.0 / np.sqrt(SSM_CONV)),
                     w(p + "ssm_dt.bias", Q4_V_HEADS), w(p + "ssm_a", Q4_V_HEADS, std=0.1, mean=0.0),
                     w(p + "ssm_beta.weight", E, Q4_V_HEADS), w(p + "ssm_alpha.weight", E, Q4_V_HEADS),
                     norm(p + "ssm_norm.weight", Q4_STATE), w(p + "ssm_out.weight", value_dim, E)]
        else:  # wq holds [q | gate] per head
            plan += [w(p + "attn_q.weight", E, 2 * H * D, std=1.5 / np.sqrt(E)),
                     w(p + "attn_k.weight", E, KV * D, std=1.5 / np.sqrt(E)), w(p + "attn_v.weight", E, KV * D),
                     w(p + "attn_output.weight", H * D, E), norm(p + "attn_q_norm.weight", D),
                     norm(p + "attn_k_norm.weight", D), w(p + "indexer.q_proj.weight", E, IDX_HEADS * IDX_DIM),
                     w(p + "indexer.k_proj.weight", E, IDX_DIM), norm(p + "indexer.q_norm.weight", IDX_DIM),
                     norm(p + "indexer.k_norm.weight", IDX_DIM)]
        plan += [w(p + "ffn_gate_inp.weight", E, N_EXPERT), w(p + "ffn_down_exps.weight", FF_EXP, E, N_EXPERT),
                 w(p + "ffn_gate_exps.weight", E, FF_EXP, N_EXPERT), w(p + "ffn_up_exps.weight", E, FF_EXP, N_EXPERT),
                 w(p + "ffn_gate_inp_shexp.weight", E), w(p + "ffn_gate_shexp.weight", E, FF_EXP),
                 w(p + "ffn_up_shexp.weight", E, FF_EXP), w(p + "ffn_down_shexp.weight", FF_EXP, E)]
    return plan


def qwen4exp_recurrent(i: int) -> bool:
    """full_attention_interval 2: even layers linear attention, odd layers full attention."""
    return (i + 1) % 2 != 0


def qwen4exp_keys(wr, a: argparse.Namespace) -> None:
    arch = wr.arch
    wr.add_head_count(a.n_head)
    wr.add_head_count_kv(a.n_head_kv)
    wr.add_key_length(a.head_dim)
    wr.add_value_length(a.head_dim)
    wr.add_rope_dimension_count(a.head_dim)
    wr.add_array(f"{arch}.rope.dimension_sections", Q4_SECTIONS)
    wr.add_uint32(f"{arch}.full_attention_interval", 2)
    wr.add_uint32(f"{arch}.ssm.conv_kernel", SSM_CONV)
    wr.add_uint32(f"{arch}.ssm.inner_size", Q4_STATE * Q4_V_HEADS)
    wr.add_uint32(f"{arch}.ssm.state_size", Q4_STATE)
    wr.add_uint32(f"{arch}.ssm.time_step_rank", Q4_V_HEADS)
    wr.add_uint32(f"{arch}.ssm.group_count", Q4_K_HEADS)
    wr.add_uint32(f"{arch}.hyper_connection.count", Q4_HC)
    wr.add_uint32(f"{arch}.hyper_connection.low_rank", Q4_HC_RANK)
    wr.add_uint32(f"{arch}.expert_count", N_EXPERT)
    wr.add_uint32(f"{arch}.expert_used_count", N_EXPERT_USED)
    wr.add_uint32(f"{arch}.expert_feed_forward_length", FF_EXP)
    wr.add_uint32(f"{arch}.expert_shared_feed_forward_length", FF_EXP)
    indexer_keys(wr, a)


ARCHS: dict[str, FallbackArch] = {f.name: f for f in (
    FallbackArch("minimax-m3", "minimax-m3", "llama_kv_cache_msa", minimax_m3_keys, minimax_m3_plan),
    FallbackArch("deepseek32", "deepseek32", "llama_kv_cache_dsa", dsa_keys, dsa_plan, "llama_kv_cache"),
    FallbackArch("glm-dsa", "glm-dsa", "llama_kv_cache_dsa", dsa_keys, dsa_plan, "llama_kv_cache"),
    FallbackArch("hy_v4", "hy_v4", "llama_kv_cache",
                 lambda wr, a: hy_v4_keys(wr, a, False), lambda a: hy_v4_plan(a, False)),
    FallbackArch("hy_v4-idx", "hy_v4", "llama_kv_cache_dsa",
                 lambda wr, a: hy_v4_keys(wr, a, True), lambda a: hy_v4_plan(a, True)),
    FallbackArch("dots3note", "dots3note", "llama_kv_cache_dsa_iswa", dots3note_keys, dots3note_plan),
    FallbackArch("glm5-next", "glm5-next", "llama_memory_hybrid_idx", glm5_next_keys, glm5_next_plan),
    FallbackArch("deepseek4", "deepseek4", "llama_kv_cache_dsv4", deepseek4_keys, deepseek4_plan,
                 "llama_kv_cache_iswa"),
    FallbackArch("qwen4exp", "qwen4exp", "llama_memory_hybrid_idx", qwen4exp_keys, qwen4exp_plan),
)}


# --- gemma4 target and its gemma4-assistant draft: the assistant has no K/V of its own; its iSWA cache shares the
# target context's last SWA and full layers (create_memory's gemma4-assistant branch, MTP draft context)
G4_BACKBONE = 256                            # the target's width (make it with --n-embd 256, the default)


def gemma4_pattern(a: argparse.Namespace) -> list[int]:
    """Sliding-window layers, then one full-attention layer last (the assistant shares n_layer-2 and n_layer-1)."""
    return [1] * (a.layers - 1) + [0]


def gemma4_block(p: str, E: int, H: int, D: int, kv: int | None, ff: int) -> Plan:
    plan = [norm(p + "attn_norm.weight", E), w(p + "attn_q.weight", E, H * D, std=1.5 / np.sqrt(E))]
    if kv is not None:
        plan += [w(p + "attn_k.weight", E, kv * D, std=1.5 / np.sqrt(E)), w(p + "attn_v.weight", E, kv * D),
                 norm(p + "attn_k_norm.weight", D)]
    plan += [w(p + "attn_output.weight", H * D, E), norm(p + "attn_q_norm.weight", D),
             norm(p + "post_attention_norm.weight", E), w(p + "layer_output_scale.weight", 1, std=0.0, mean=1.0),
             norm(p + "ffn_norm.weight", E), w(p + "ffn_gate.weight", E, ff), w(p + "ffn_up.weight", E, ff),
             w(p + "ffn_down.weight", ff, E), norm(p + "post_ffw_norm.weight", E)]
    return plan


def gemma4_plan(a: argparse.Namespace, assistant: bool = False) -> Plan:
    E, D = a.n_embd, a.head_dim
    plan = [w("token_embd.weight", E, a.vocab, std=1.0 / np.sqrt(E)), norm("output_norm.weight", E),
            w("rope_freqs.weight", D // 2, std=0.0, mean=1.0)]
    if assistant:
        plan += [w("nextn.pre_projection.weight", 2 * G4_BACKBONE, E), w("nextn.post_projection.weight", E, G4_BACKBONE)]
    for i in range(a.layers):
        plan += gemma4_block(f"blk.{i}.", E, a.n_head, D, None if assistant else a.n_head_kv, a.n_ff)
    return plan


def gemma4_keys(wr, a: argparse.Namespace, assistant: bool = False) -> None:
    arch = wr.arch
    wr.add_head_count(a.n_head)
    wr.add_head_count_kv(a.n_head_kv)
    wr.add_key_length(a.head_dim)
    wr.add_value_length(a.head_dim)
    wr.add_uint32(f"{arch}.attention.key_length_swa", a.head_dim)
    wr.add_uint32(f"{arch}.attention.value_length_swa", a.head_dim)
    wr.add_uint32(f"{arch}.attention.sliding_window", a.swa_window)
    wr.add_array(f"{arch}.attention.sliding_window_pattern", [bool(x) for x in gemma4_pattern(a)])
    wr.add_float32(f"{arch}.rope.freq_base_swa", 10000.0)
    if assistant:
        wr.add_uint32(f"{arch}.embedding_length_out", G4_BACKBONE)
        wr.add_uint32(f"{arch}.nextn_predict_layers", a.layers)
    else:
        wr.add_uint32(f"{arch}.embedding_length_per_layer_input", 0)


# Not fallback models on their own: gemma4 is the target (its iSWA cache takes the window) that a gemma4-assistant
# draft shares its cache with.
PAIR_MODELS: dict[str, FallbackArch] = {f.name: f for f in (
    FallbackArch("gemma4", "gemma4", "llama_kv_cache_iswa", gemma4_keys, gemma4_plan),
    FallbackArch("gemma4-assistant", "gemma4-assistant", "llama_kv_cache_iswa",
                 lambda wr, a: gemma4_keys(wr, a, True), lambda a: gemma4_plan(a, True), "llama_kv_cache_iswa"),
)}
