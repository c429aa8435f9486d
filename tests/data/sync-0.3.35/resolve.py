"""The hand resolutions of the stops met when the series moves from llama-cpp-python 0.3.36 to 0.3.35.

0070: 0.3.35 has no `name_tag` parameter on the llama_kv_cache constructor (0.3.36 added it) and no
llama_memory_hybrid_idx branch in llama_model::create_memory: the residency parameters follow `share`
directly, and the callers that passed name_tag's default "" before them stop doing so.

0071: 0.3.35 has the four branches that hand their cache the window (hybrid-iSWA, hybrid, iSWA, the plain cache),
each of which keeps its flag, and no llama_memory_hybrid_idx or llama_kv_cache_dsa_iswa (0.3.36 added both): the
fallback line's type names go without those two.

0072: in build_attn 0.3.35 stores K/V first and reads the views after the store block (0.3.36 reads them
inside it): the tail staging and stream pinning follow the reads. 0.3.35 restores K/V state cell by cell
(0.3.36 batches contiguous runs) and has no state_clear():
with a window, each restored cell is read into the part (window or host tail) that holds it; the
contiguous fast path stays as upstream wrote it in head mode; the state_clear() changes go with the function.
The window and tail tensors are named as 0.3.35 names its own K/V, without name_tag.

0073: 0.3.35 has no get_stream() before get_n_kv(): the attention span's two functions stand there alone; no
get_n_seq_max() in the header: the span's accessor follows get_size() alone. It has no get_prev_tokens() after
set_input_v_rot(): the mapped-copy rule follows set_input_v_rot() alone. The mapped K/V tensors are named
without name_tag, as in 0072. 0.3.35 has no ggml_cuda_get_fattn_vec_case (fattn.cu dispatches the vector kernel's
cases inside ggml_cuda_flash_attn_ext_vec): the tail segments take the K/V types every build compiles a vector
kernel for (f16, q4_0, q8_0, bf16, K and V of the same type) and call that dispatcher (a compile stop, not a
conflict: the fix goes with the conflicts' resolution, so the move stops at 0073 once).

0089: the same two callers again (the measure-pass arguments follow the residency ones without name_tag).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

Block = Callable[[str, str, str], str]  # (ours, base, theirs) -> the resolved text


def text(t: str) -> Block:
    return lambda _o, _b, _t: t


def theirs(_o: str, _b: str, t: str) -> str:
    return t


def ours_from(marker: str) -> Block:
    return lambda o, _b, _t: o[o.index(marker):]


def ours_until(marker: str) -> Block:
    return lambda o, _b, _t: o[:o.index(marker)]


def scatter_read(kind: str, indent: str) -> Block:
    """0.3.35's contiguous fast path (head mode) and its per-cell path, the latter reading into the part."""
    is_v = "true" if kind == "v" else "false"
    lines = [
        "if (cell_count) {",
        "    if (sinfo.is_contiguous() && opencoti_window == 0) {",
        "        // Fast path: contiguous cells, single memcpy",
        f"        io.read_tensor({kind}, sinfo.head() * {kind}_size_row, cell_count * {kind}_size_row);",
        "    } else {",
        "        // Slow path: scatter to non-contiguous positions",
        "        // opencoti-hook: kv-split-storage (with a window, each cell is read into the part holding it)",
        "        for (uint32_t i = 0; i < cell_count; ++i) {",
        "            uint32_t cell0 = sinfo.idxs[0][i];",
        f"            ggml_tensor * {kind}_part = opencoti_io_part(layer, {is_v}, {kind}, cell0);",
        f"            io.read_tensor({kind}_part, (size_t) cell0 * {kind}_size_row, {kind}_size_row);",
        "        }",
        "    }",
    ]
    return text("".join(indent + ln + "\n" for ln in lines))


RESOLUTIONS: dict[str, dict[str, list[Block]]] = {
    "0071": {},  # merged without conflict: the classes 0.3.35 lacks go in EDITS
    "0070": {
        "src/llama-kv-cache.cpp": [text(
            "    const  layer_share_cb & share,\n"
            "                  int32_t   kv_residency_mode, // opencoti-hook: kv-residency-params\n"
            "                 uint32_t   vram_target_mib,\n"
            "                 uint32_t   kv_window_cells) :\n")],
        "src/llama-kv-cache.h": [text(
            "        const  layer_share_cb & share,\n"
            "        // opencoti-hook: kv-residency-params\n"
            "                      int32_t   kv_residency_mode = 0,  // enum llama_kv_residency_mode\n"
            "                     uint32_t   vram_target_mib   = 0,  // 0 = KV device free memory\n"
            "                     uint32_t   kv_window_cells   = 0); // 0 = auto\n")],
        "src/llama-model.cpp": [text(
            "                            /* filter_recr       */ std::move(filter_recr),\n"
            "                            /* opencoti-hook: kv-residency-params */\n"
            "                            /* kv_residency_mode */ cparams.kv_residency_mode,\n"
            "                            /* vram_target_mib   */ cparams.vram_target_mib,\n"
            "                            /* kv_window_cells   */ cparams.kv_window_cells);\n")],
    },
    "0072": {
        "src/llama-kv-cache.cpp": [
            theirs,  # the run batching of 0.3.36 is not there to split
            scatter_read("k", "        "),
            scatter_read("v", "            "),
            ours_from("// opencoti-hook: kv-split-storage\nggml_tensor * llama_kv_cache::opencoti_io_part"),
        ],
        "src/llama-graph.cpp": [
            theirs,  # 0.3.35 stores K/V here and reads the views after the block (staged there, EDITS)
            text("    ggml_tensor * k = mctx_cur->get_k(ctx0, il);\n"
                 "    opencoti_stage_k(k); // opencoti-hook: kv-tail-stream\n"
                 "    ggml_tensor * v = mctx_cur->get_v(ctx0, il);\n"),
            text("    opencoti_pin_stream(k, v, il); // opencoti-hook: kv-tail-stream\n\n"
                 "    ggml_tensor * cur = build_attn_mha(q, k, v, kq_b, kq_mask, sinks, v_mla, kq_scale, il);\n"),
        ],
    },
    "0073": {
        # 0.3.35 has no get_stream (the attention span's two functions stand alone before get_n_kv) and no
        # get_prev_tokens (0.3.36 added both): only the mapped-copy rule follows set_input_v_rot
        "src/llama-kv-cache.cpp": [ours_from("// opencoti-hook: kv-attention-span\nuint32_t llama_kv_cache::opencoti_attn_span"),
                                   ours_from("\n// opencoti-hook: kv-mapped-tail\n// rule: attention reads the mapped tail")],
        # and no get_n_seq_max (0.3.36 added it): the span's accessor follows get_size alone
        "src/llama-kv-cache.h": [ours_from("\n    // opencoti-hook: kv-attention-span\n")],
    },
    "0089": {
        "src/llama-kv-cache-iswa.cpp": [text(
            "            kv_residency_mode, vram_target_mib, kv_window_cells, // opencoti-hook: kv-residency-params\n"
            "            compute_reserve_mib, window_measure_pass); // opencoti-hook: two-pass-compute-reserve\n")] * 2,
        "src/llama-model.cpp": [ours_until("                    } else if (needs_mem_idx) {\n")],
    },
}
# patch -> file -> (old, new, count), or a list of them: edits outside conflict blocks (the callers that passed
# name_tag's default;
# the K/V views read after the store block in 0.3.35's build_attn; the window, tail and mapped K/V tensors named
# without name_tag, as 0.3.35 names its own)
Edit = tuple[str, str, int]
EDITS: dict[str, dict[str, Edit | list[Edit]]] = {
    "0071": {
        "src/llama-model.cpp": (
            '        else if (dynamic_cast<llama_memory_hybrid_idx  *>(res)) '
            '{ type = "llama_memory_hybrid_idx"; }\n'
            '        else if (dynamic_cast<llama_kv_cache_msa       *>(res)) { type = "llama_kv_cache_msa"; }\n'
            '        else if (dynamic_cast<llama_kv_cache_dsa_iswa  *>(res)) '
            '{ type = "llama_kv_cache_dsa_iswa"; }\n',
            '        else if (dynamic_cast<llama_kv_cache_msa       *>(res)) { type = "llama_kv_cache_msa"; }\n', 1),
    },
    "0072": {
        "src/llama-kv-cache.cpp": ('            ggml_format_name(k,  "cache_%sk_l%d",      name_tag, il);\n'
                                   '            ggml_format_name(v,  "cache_%sv_l%d",      name_tag, il);\n'
                                   '            ggml_format_name(kt, "cache_%sk_tail_l%d", name_tag, il);\n'
                                   '            ggml_format_name(vt, "cache_%sv_tail_l%d", name_tag, il);\n',
                                   '            ggml_format_name(k,  "cache_k_l%d",      il);\n'
                                   '            ggml_format_name(v,  "cache_v_l%d",      il);\n'
                                   '            ggml_format_name(kt, "cache_k_tail_l%d", il);\n'
                                   '            ggml_format_name(vt, "cache_v_tail_l%d", il);\n', 1),
        "src/llama-graph.cpp": ("    ggml_tensor * k = mctx_cur->get_k(ctx0, il);\n"
                                "    ggml_tensor * v = mctx_cur->get_v(ctx0, il);\n\n"
                                "    ggml_tensor * cur = build_attn_mha(",
                                "    ggml_tensor * k = mctx_cur->get_k(ctx0, il);\n"
                                "    opencoti_stage_k(k); // opencoti-hook: kv-tail-stream\n"
                                "    ggml_tensor * v = mctx_cur->get_v(ctx0, il);\n\n"
                                "    opencoti_pin_stream(k, v, il); // opencoti-hook: kv-tail-stream\n\n"
                                "    ggml_tensor * cur = build_attn_mha(", 1),
    },
    "0073": {
        "src/llama-kv-cache.cpp": ('ggml_format_name(kv[i], i == 0 ? "cache_%sk_l%d" : "cache_%sv_l%d", name_tag, il);',
                                   'ggml_format_name(kv[i], i == 0 ? "cache_k_l%d" : "cache_v_l%d", il);', 1),
        "ggml/src/ggml-cuda/fattn.cu": [
            ("    } else if (ggml_cuda_get_fattn_vec_case(Q->ne[0], K->type, V->type) == nullptr ||\n",
             "    } else if ((K->type != GGML_TYPE_F16 && K->type != GGML_TYPE_Q4_0 && K->type != GGML_TYPE_Q8_0 &&\n"
             "             K->type != GGML_TYPE_BF16) ||\n", 1),
            ("    const ggml_tensor * Q    = dst->src[0];\n    const ggml_tensor * K    = dst->src[1];\n"
             "    const ggml_tensor * V    = dst->src[2];\n    const ggml_tensor * mask = dst->src[3];\n\n"
             "    cudaStream_t stream = ctx.stream();\n",
             "    const ggml_tensor * K    = dst->src[1];\n"
             "    const ggml_tensor * V    = dst->src[2];\n    const ggml_tensor * mask = dst->src[3];\n\n"
             "    cudaStream_t stream = ctx.stream();\n", 1),
            ("    const fattn_vec_case_t vec_case = ggml_cuda_get_fattn_vec_case(Q->ne[0], K->type, V->type);\n\n", "", 1),
            ("vec_case(ctx, &", "ggml_cuda_flash_attn_ext_vec(ctx, &", 3),  # the segments, the one-chunk tail and its device part
        ],
    },
    "0070": {
        "src/llama-kv-cache-iswa.cpp": ('            "", kv_residency_mode, vram_target_mib, kv_window_cells);',
                                        "            kv_residency_mode, vram_target_mib, kv_window_cells);", 2),
        "src/llama-memory-hybrid.cpp": ('        "", // opencoti-hook: kv-residency-params\n        kv_residency_mode,\n',
                                        "        kv_residency_mode, // opencoti-hook: kv-residency-params\n", 1),
        "src/llama-model.cpp": ('                                "", // opencoti-hook: kv-residency-params\n'
                                "                                cparams.kv_residency_mode,\n",
                                "                                cparams.kv_residency_mode, // opencoti-hook: "
                                "kv-residency-params\n", 1),
    },
}


def _blocks(data: str) -> list[tuple[int, int, str, str, str]]:
    """(start, end, ours, base, theirs) of each diff3 conflict block."""
    out = []
    pos = 0
    while (start := data.find("<<<<<<< ", pos)) >= 0:
        base_at = data.index("\n||||||| ", start) + 1
        sep_at = data.index("\n=======\n", base_at) + 1
        end_at = data.index("\n>>>>>>> ", sep_at) + 1
        end = data.index("\n", end_at) + 1
        ours = data[data.index("\n", start) + 1:base_at]
        base = data[data.index("\n", base_at) + 1:sep_at]
        theirs_ = data[sep_at + len("=======\n"):end_at]
        out.append((start, end, ours, base, theirs_))
        pos = end
    return out


def resolve(component: Path, patch_id: str) -> None:
    """Edit the tree stopped at patch_id (component = vendor/llamafile/llama.cpp) into the resolved one."""
    for rel, fns in RESOLUTIONS[patch_id].items():
        p = component / rel
        data = p.read_text()
        blocks = _blocks(data)
        assert len(blocks) == len(fns), f"{rel}: {len(blocks)} conflict block(s), {len(fns)} resolution(s)"
        for (start, end, o, b, t), fn in reversed(list(zip(blocks, fns, strict=True))):
            data = data[:start] + fn(o, b, t) + data[end:]
        p.write_text(data)
    for rel, edits in EDITS.get(patch_id, {}).items():
        p = component / rel
        data = p.read_text()
        for old, new, count in [edits] if isinstance(edits, tuple) else edits:
            assert data.count(old) == count, f"{rel}: expected {count} x {old!r}"
            data = data.replace(old, new)
        p.write_text(data)


if __name__ == "__main__":
    resolve(Path(sys.argv[1]), sys.argv[2])


def resolve_to_series(project_root: Path, shipped: Path, pristine_digest: str, patch_id: str) -> None:
    """Forward (0.3.35 -> 0.3.36): give each file the stopped patch touches the text the shipped series has
    there on 0.3.36 (the series in `shipped`, applied in memory on the pristine named by its vendor.lock)."""
    import json

    from forktool import vendor
    from forktool.apply import apply_series
    from forktool.project import Project
    from forktool.series import parse_patch, read_series
    from forktool.tree import manifest_from_json

    project = Project(project_root)
    manifest = manifest_from_json(json.loads(vendor.pristine_path(project, pristine_digest).read_text()))
    patches = [parse_patch((shipped / e.name).read_bytes(), e.name) for e in read_series(shipped / "series")]
    upto = next(i for i, p in enumerate(patches) if p.id == patch_id) + 1
    done = apply_series(patches[:upto], lambda rel: vendor.pristine_bytes(project, manifest, rel)).files
    for rel in patches[upto - 1].paths:
        data = done[rel]
        assert data is not None
        (project.tree / rel).write_bytes(data)
