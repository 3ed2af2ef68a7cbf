"""A test fixture, not part of the product: tiny random Hugging Face causal LMs built
offline from configs (hidden 64, 2-6 layers), one per model type the rank-budget probe is
checked on. The tests and benches/train/hf/bench_types.py share it.

    model = tiny_model("gemma3_text")          # eval mode, eager attention, seeded weights

Nothing is downloaded: AutoConfig.for_model fills every size not given here.
"""

from __future__ import annotations

import torch
from torch import nn

from train.hf.model_dir import import_transformers

D, H, G, K, VOCAB = 64, 4, 2, 16, 128
COMMON = dict(hidden_size=D, intermediate_size=128, num_attention_heads=H,
              num_key_value_heads=G, head_dim=K, vocab_size=VOCAB, max_position_embeddings=256,
              num_hidden_layers=2, pad_token_id=0, bos_token_id=1, eos_token_id=2)
MOE = dict(num_local_experts=4, num_experts_per_tok=2, num_experts=4, moe_intermediate_size=32)

MLA = dict(q_lora_rank=32, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8,
           v_head_dim=16, n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1,
           first_k_dense_replace=1, moe_intermediate_size=32, num_key_value_heads=H,
           head_dim=8)
DSA = dict(MLA, index_topk=8, index_n_heads=4, index_head_dim=16)

# model type -> config overrides; each a feature of attention the probe must read
TINY = {
    "llama": {},
    "qwen3": {},  # q/k norms per head
    "gemma3_text": dict(num_hidden_layers=6, num_key_value_heads=1, sliding_window=8,
                        sliding_window_pattern=6, query_pre_attn_scalar=32),  # 5 local : 1
    "gemma2": dict(sliding_window=8, attn_logit_softcapping=5.0, query_pre_attn_scalar=32),
    "mistral": dict(sliding_window=8),
    "gpt_oss": dict(sliding_window=8, **MOE),  # sinks, windows on alternate layers, MoE
    "qwen3_moe": dict(MOE, decoder_sparse_step=1, mlp_only_layers=[]),
    "mixtral": dict(MOE),
    "gpt2": dict(n_embd=D, n_layer=2, n_head=H, n_positions=256, vocab_size=VOCAB),
    "gpt_neox": dict(rotary_pct=0.5, use_parallel_residual=True),
    "phi": dict(partial_rotary_factor=0.5, num_key_value_heads=H, head_dim=None),
    "deepseek_v3": MLA,
    # DSA: MLA whose queries each attend to the top 8 keys of a lightning indexer (4 heads,
    # d_I = 16); glm_moe_dsa's layer 1 reuses layer 0's choice
    "deepseek_v32": DSA,
    "glm_moe_dsa": dict(DSA, num_hidden_layers=3, indexer_types=["full", "shared", "full"]),
    # differential attention: two softmaxes' heads combined in pairs, M = P1 - lambda P2 per
    # output head (4 softmax heads, 2 output heads of 2 x 16 value columns); lambda per layer
    # 0.16, -0.75, -1.09, 4.81: positive, negative and above 1
    "diffllama": dict(num_hidden_layers=4, lambda_std_dev=0.5),
    # chunked attention (C = 16, from the mask alone: no keyword says so) on layers 0-2, NoPE
    # on layer 3; RoPE by complex multiplication (freqs_cis) on [B, T, H, K], a weightless
    # norm of each head after it; experts
    "llama4_text": dict(num_hidden_layers=4, attention_chunk_size=16, no_rope_layer_interval=4,
                        num_local_experts=4, num_experts_per_tok=1, intermediate_size_mlp=128),
    # RoPE one tensor at a time, apply_rotary_pos_emb(x, cos, sin) on [B, T, H, K], after the
    # q/k norms; a window of 8 on layer 0, proportional RoPE (a quarter of the frequencies)
    # on the global layer 1
    "gemma4_text": dict(layer_types=["sliding_attention", "full_attention"], sliding_window=8,
                        global_head_dim=K, hidden_size_per_layer_input=16,
                        vocab_size_per_layer_input=VOCAB),
    # MLA whose interleaved RoPE writes its output de-interleaved; two MLA sublayers in each
    # of 2 decoder layers, numbered 0-3 as the model numbers them (layer_idx)
    "longcat_flash": dict(num_hidden_layers=4, q_lora_rank=32, kv_lora_rank=16,
                          qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16, head_dim=8,
                          num_key_value_heads=H, n_routed_experts=4, moe_topk=2,
                          zero_expert_num=2, expert_ffn_hidden_size=32, ffn_hidden_size=128),
    # Mamba-2 family: 8 SSD heads of 16 channels, state N = 16, chunks of 16 tokens
    "mamba2": dict(num_heads=8, head_dim=16, state_size=16, n_groups=1, expand=2,
                   chunk_size=16, num_attention_heads=None, num_key_value_heads=None),
    "bamba": dict(mamba_n_heads=8, mamba_d_head=16, mamba_d_state=16, mamba_n_groups=1,
                  mamba_chunk_size=16, attn_layer_indices=[1], head_dim=None),
    "falcon_h1": dict(mamba_n_heads=8, mamba_d_head=16, mamba_d_state=16, mamba_n_groups=1,
                      mamba_chunk_size=16, mamba_expand=2, mamba_d_ssm=128),
    # Mamba-1: 128 channels, each its own selective scan over a state of N = 16
    "mamba": dict(state_size=16, num_attention_heads=None, num_key_value_heads=None,
                  head_dim=None),
}
# hybrids of linear mixers beside attention, each mixer read by its own capture (the delta
# rule's chunk functions, budgets/hf/delta.py; module forwards, budgets/hf/hooked.py) and
# measured by its mixing alone: 3 linear layers to 1 of attention, 4 delta-rule heads of
# K = V = 16 (Gated DeltaNet: 2 query/key heads, each read by 2 value heads)
DELTA = dict(linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
             linear_value_head_dim=16, linear_conv_kernel_dim=4, num_hidden_layers=4,
             layer_types=["linear_attention"] * 3 + ["full_attention"])
KDA = dict(DELTA, linear_num_heads=4, linear_head_dim=16, qk_rope_head_dim=8,
           qk_nope_head_dim=8, v_head_dim=16, kv_lora_rank=16, q_lora_rank=None,
           num_key_value_heads=H, head_dim=8, mlp_layer_types=["dense"] * 4)
LINEAR_MIXERS = {
    "qwen3_next": dict(DELTA, **MOE, decoder_sparse_step=1, mlp_only_layers=[],
                       shared_expert_intermediate_size=32),
    "qwen3_5_text": dict(DELTA),
    "olmo_hybrid": dict(DELTA),  # beta in (0, 2): negative eigenvalues allowed
    # KDA: one decay per key channel, 4 heads of K = V = 16; MLA in the attention layer
    # (kimi_linear's without RoPE)
    "kimi_linear": KDA,
    "bailing_hybrid": KDA,
    # short convolutions (L = 3) in layers 0 and 2, attention in layer 1
    "lfm2": dict(num_hidden_layers=3, layer_types=["conv", "full_attention", "conv"],
                 head_dim=None),
    # RG-LRU in layers 0 and 1 (64 channels), local attention (W = 16) in layer 2
    "recurrent_gemma": dict(num_hidden_layers=3, block_types=["recurrent", "recurrent",
                                                              "attention"],
                            lru_width=D, attention_window_size=16, num_key_value_heads=1),
    # lightning attention (decayed linear attention, blocks of 16 tokens), then softmax
    "minimax": dict(MOE, layer_types=["linear_attention", "full_attention"], block_size=16),
}
# hybrids of Mamba layers beside attention in layers of their own: jamba's attention in
# layer 2 of 4, Mamba-1 (128 inner channels, state N = 16) in layers 0, 1 and 3
SSM_HYBRIDS = {
    "jamba": dict(num_hidden_layers=4, attn_layer_period=4, attn_layer_offset=2,
                  expert_layer_period=2, expert_layer_offset=1, mamba_d_state=16,
                  mamba_d_conv=4, mamba_expand=2, mamba_dt_rank=8),
}
# models whose mixers no capture reads (named in the report as not measured)
OTHER_MIXERS = {
    "xlstm": dict(embedding_dim=D, num_heads=H, num_blocks=2, qk_dim_factor=0.5,
                  v_dim_factor=1.0, mode="inference", chunkwise_kernel="chunkwise--native_autograd",
                  sequence_kernel="native_sequence__native", step_kernel="native",
                  num_attention_heads=None, num_key_value_heads=None, head_dim=None),
}
# models whose shape the probe must name rather than measure as usual: zamba's one attention
# block, tied across its hybrid layers 1 and 3 (each Mamba mixer runs two scans); rwkv,
# whose time mixing returns no attention probabilities (refused in one line)
SPECIAL = {
    "zamba": dict(num_hidden_layers=4, layers_block_type=["mamba", "hybrid"] * 2),
    "rwkv": dict(num_hidden_layers=2),
    # DeepSeek-V4, refused in one line: every layer a window of W = 16 keys (K = V, sinks);
    # layer 1 CSA (overlapping windows of 2 x 4 tokens pooled into a slot, top-4 per query
    # by its indexer), layer 2 HCA (16 tokens a slot) append 16 and 4 slots at T = 64, each
    # pooled per channel from its compressor's own projection, not from the layer's values
    "deepseek_v4": dict(
        num_hidden_layers=3, num_key_value_heads=1, sliding_window=16,
        layer_types=["sliding_attention", "compressed_sparse_attention",
                     "heavily_compressed_attention"],
        compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 16},
        index_topk=4, index_n_heads=2, index_head_dim=16, q_lora_rank=32, o_groups=2,
        o_lora_rank=16, partial_rotary_factor=0.5, n_routed_experts=4, num_experts_per_tok=2,
        mlp_layer_types=["hash_moe", "moe", "moe"]),
}
# the hybrids and SSMs above: their mixing is an SSD or selective scan (budgets/hf/scans.py)
SSM_TYPES = ("mamba2", "bamba", "falcon_h1", "mamba")
ATTENTION_TYPES = tuple(t for t in TINY if t not in SSM_TYPES)
# multi-head latent attention: values and keys expanded from a cached latent
MLA_TYPES = ("deepseek_v3", "deepseek_v32", "glm_moe_dsa", "longcat_flash")
DSA_TYPES = ("deepseek_v32", "glm_moe_dsa")  # an indexer's top-k selection


def tiny_config(model_type: str, **extra):
    """The config of a tiny `model_type` with TINY's overrides and `extra`."""
    transformers = import_transformers()
    known = {**TINY, **LINEAR_MIXERS, **SSM_HYBRIDS, **OTHER_MIXERS, **SPECIAL}
    sizes = {**COMMON, **known.get(model_type, {}), **extra}
    sizes = {k: v for k, v in sizes.items() if v is not None}
    config = transformers.AutoConfig.for_model(model_type, **sizes)
    if model_type == "gpt_oss":
        config.layer_types = ["sliding_attention", "full_attention"] * (
            config.num_hidden_layers // 2)
    return config


def tiny_model(model_type: str, seed: int = 0, fp64: bool = False, **extra) -> nn.Module:
    """A random tiny causal LM of `model_type` in eval mode on the eager path; `fp64`: in
    float64, its experts on their eager loop (torch's grouped_mm takes no float64)."""
    transformers = import_transformers()
    torch.manual_seed(seed)
    eager = {"experts_implementation": "eager"} if fp64 else {}
    model = transformers.AutoModelForCausalLM.from_config(
        tiny_config(model_type, **extra), attn_implementation="eager", **eager)
    return (model.double() if fp64 else model.float()).eval()
