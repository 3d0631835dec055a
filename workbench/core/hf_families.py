"""Per-family shape builders behind :func:`workbench.core.hf_config.spec_from_hf_config`.

Each builder reads one Hugging Face ``config.json`` through :class:`HFFields` and returns
``(path, shape)`` for every parameter, in the order of the ``transformers`` model's
``named_parameters()`` (the order each module's ``__init__`` assigns its submodules), with the
checkpoint's parameter names and shapes: ``nn.Linear`` weights are ``(out_features,
in_features)``, GPT-2's ``Conv1D`` weights ``(in_features, out_features)``. These are the
conventions of :mod:`workbench.core.presets`: blocks are ``model.layers.{i}.`` (GPT-2:
``transformer.h.{i}.``) so :func:`~workbench.core.presets.layer_index` finds them, and routed
experts are ``...experts.{e}.`` so :func:`~workbench.core.presets.is_expert_param` finds them
(DeepSeek's ``shared_experts`` and every router ``gate`` are not routed experts).

DeepSeek's latent-attention models (``deepseek_v2``, ``deepseek_v3``, ``kimi_k2``) are built by
:mod:`workbench.core.hf_mla`; the field reader and the row helpers are :mod:`workbench.core.hf_fields`.

The LM head (``lm_head.weight``) is added by the caller when embeddings are untied. Buffers
(rotary ``inv_freq``, GPT-2's causal ``attn.bias``) are not parameters and are left out.

No config makes a builder run for minutes or out of memory (10**6 layers or 10**7 experts would):
the bounds of :mod:`workbench.core.checks` apply. The workbench core only; every error is a
``ValueError`` naming the field and the file.

Gemma 3's published multimodal configs (``model_type`` ``gemma3``) nest a sparse ``text_config``
(google/gemma-3-4b-it's names 3 of the 9 fields that set its shapes): its ``gemma3_text`` family fills the absent ones
with ``Gemma3TextConfig``'s defaults (:data:`GEMMA3_TEXT_DEFAULTS`), as ``transformers`` does.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from types import MappingProxyType

from workbench.core.hf_fields import HFFields, Rows, attention_dims, glu, linear, norm
from workbench.core.hf_mla import MLA_READS, MTP_READS, build_mla

__all__ = ["FAMILIES", "GEMMA3_TEXT_DEFAULTS", "Family", "HFFields", "Rows", "attention_dims"]

#: ``Gemma3TextConfig``'s defaults for the fields that set shapes: ``transformers`` 4.57.6
#: (``configuration_gemma3.py``, ``Gemma3TextConfig.__init__``) and 5.24.0 (its dataclass fields) agree.
GEMMA3_TEXT_DEFAULTS: Mapping[str, object] = MappingProxyType({
    "vocab_size": 262_208, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "attention_bias": False,
    "tie_word_embeddings": True,
})


def _decoder(f: HFFields, *, bias: str = "", mlp_bias: bool = False, qk_norm: bool = False,
             sandwich: bool = False, moe: str = "") -> Rows:
    """Llama-style decoder: embed_tokens, layers (self_attn, mlp, norms), norm.

    ``bias``: ``"attention_bias"`` (q, k, v, o biases when the field is true) or ``"qkv"`` (Qwen2:
    q, k, v always biased, o never). ``qk_norm``: per-head RMSNorms ``q_norm``/``k_norm`` (Qwen3,
    Gemma 3). ``sandwich``: Gemma's pre/post feed-forward norms. ``moe``: ``"mixtral"`` or ``"qwen3_moe"``.
    """
    d, nh, nkv, hd = attention_dims(f)
    vocab, n_layers = f.count("vocab_size"), f.count("num_hidden_layers")
    o_bias = f.flag("attention_bias", False) if bias == "attention_bias" else False
    qkv_bias = o_bias or bias == "qkv"
    ffn_bias = f.flag("mlp_bias", False) if mlp_bias else False
    rows = f.rows(("model.embed_tokens.weight", (vocab, d)))
    for i in range(n_layers):
        p = f"model.layers.{i}."
        a = p + "self_attn."
        rows += linear(a + "q_proj", nh * hd, d, qkv_bias) + linear(a + "k_proj", nkv * hd, d, qkv_bias)
        rows += linear(a + "v_proj", nkv * hd, d, qkv_bias) + linear(a + "o_proj", d, nh * hd, o_bias)
        if qk_norm:
            rows += norm(p + "self_attn.q_norm", hd) + norm(p + "self_attn.k_norm", hd)
        rows += _ffn(f, moe, i, p, d, ffn_bias)
        rows += norm(p + "input_layernorm", d) + norm(p + "post_attention_layernorm", d)
        if sandwich:
            rows += norm(p + "pre_feedforward_layernorm", d) + norm(p + "post_feedforward_layernorm", d)
    return rows + norm("model.norm", d)


def _ffn(f: HFFields, moe: str, i: int, p: str, d: int, bias: bool) -> Rows:
    """Layer ``i``'s feed-forward block: a dense gated MLP, Mixtral's ``block_sparse_moe`` or Qwen3-MoE's ``mlp``."""
    if moe == "mixtral":  # MixtralSparseMoeBlock: gate (router), then experts w1, w2, w3
        n_exp, width = f.count("num_local_experts"), f.count("intermediate_size")
        experts = [glu(f"{p}block_sparse_moe.experts.{e}.", d, width, ("w1", "w2", "w3")) for e in range(n_exp)]
        return linear(p + "block_sparse_moe.gate", n_exp, d) + [row for rows in experts for row in rows]
    if moe == "qwen3_moe" and _qwen3_moe_sparse(f, i):  # Qwen3MoeSparseMoeBlock: gate, then experts; no shared expert
        n_exp, width = f.count("num_experts"), f.count("moe_intermediate_size")
        experts = [glu(f"{p}mlp.experts.{e}.", d, width) for e in range(n_exp)]
        return linear(p + "mlp.gate", n_exp, d) + [row for rows in experts for row in rows]
    return glu(p + "mlp.", d, f.count("intermediate_size"), bias=bias)


def _qwen3_moe_sparse(f: HFFields, i: int) -> bool:
    """Qwen3-MoE's rule: sparse unless in ``mlp_only_layers``, with experts, every ``decoder_sparse_step``-th layer."""
    step = f.count("decoder_sparse_step", default=1)
    return i not in f.indices("mlp_only_layers") and f.count("num_experts", minimum=0) > 0 and (i + 1) % step == 0


def _phi3(f: HFFields) -> Rows:
    """Phi-3: fused ``qkv_proj`` (after ``o_proj``, as ``Phi3Attention.__init__`` assigns them) and ``gate_up_proj``."""
    d, nh, nkv, hd = attention_dims(f)
    vocab, n_layers, width = f.count("vocab_size"), f.count("num_hidden_layers"), f.count("intermediate_size")
    rows = f.rows(("model.embed_tokens.weight", (vocab, d)))
    for i in range(n_layers):
        p = f"model.layers.{i}."
        rows += linear(p + "self_attn.o_proj", d, nh * hd) + linear(p + "self_attn.qkv_proj", (nh + 2 * nkv) * hd, d)
        rows += linear(p + "mlp.gate_up_proj", 2 * width, d) + linear(p + "mlp.down_proj", d, width)
        rows += norm(p + "input_layernorm", d) + norm(p + "post_attention_layernorm", d)
    return rows + norm("model.norm", d)


def _affine(path: str, weight: tuple[int, ...], bias: int) -> Rows:
    """A weight and a bias: GPT-2's LayerNorm ``(d,)`` or Conv1D ``(in, out)`` with bias ``(out,)``."""
    return [(path + ".weight", weight), (path + ".bias", (bias,))]


def _gpt2(f: HFFields) -> Rows:
    """GPT-2: ``wte``, ``wpe`` (``n_positions`` rows), blocks of Conv1D layers with biases and LayerNorms, ``ln_f``."""
    vocab, d, n_layers = f.count("vocab_size"), f.count("n_embd"), f.count("n_layer")
    n_pos, heads = f.count("n_positions"), f.count("n_head")
    if d % heads:
        raise f.error("n_head", f"({heads}) must divide n_embd ({d}).")
    width = f.count("n_inner", default=4 * d)
    rows = f.rows(("transformer.wte.weight", (vocab, d)), ("transformer.wpe.weight", (n_pos, d)))
    for i in range(n_layers):
        p = f"transformer.h.{i}."
        rows += _affine(p + "ln_1", (d,), d) + _affine(p + "attn.c_attn", (d, 3 * d), 3 * d)
        rows += _affine(p + "attn.c_proj", (d, d), d) + _affine(p + "ln_2", (d,), d)
        rows += _affine(p + "mlp.c_fc", (d, width), width) + _affine(p + "mlp.c_proj", (width, d), d)
    return rows + _affine("transformer.ln_f", (d,), d)



@dataclass(frozen=True)
class Family:
    """How one ``model_type`` is built.

    Attributes:
        build: ``build(fields, include_mtp)`` -> ``(path, shape)`` rows, without the untied LM head.
        tie_default: ``tie_word_embeddings`` when the config leaves it out (the HF config class default).
        width_key: The field holding the model width (sizes ``lm_head``).
        reads: Fields of :data:`workbench.core.hf_config.SHAPE_FIELDS` this builder honours.
        defaults: Fields the config class fills when a config leaves them out, filled here too
            (only where published configs leave shape fields out: Gemma 3's ``text_config``).
        mtp: Whether ``include_mtp`` applies (the model has multi-token-prediction layers).
    """

    build: Callable[[HFFields, bool], Rows]
    tie_default: bool
    width_key: str = "hidden_size"
    reads: frozenset[str] = frozenset()
    defaults: Mapping[str, object] = field(default_factory=dict)
    mtp: bool = False


_GQA = frozenset({"head_dim", "num_key_value_heads"})


def _dec(**traits: object) -> Callable[[HFFields, bool], Rows]:
    return lambda f, _mtp: _decoder(f, **traits)  # type: ignore[arg-type]


#: Every supported ``model_type``; tie defaults are those of the ``transformers`` config classes.
FAMILIES: dict[str, Family] = {
    "llama": Family(_dec(bias="attention_bias", mlp_bias=True), False, reads=_GQA | {"attention_bias", "mlp_bias"}),
    "mistral": Family(_dec(), False, reads=_GQA),
    "mixtral": Family(_dec(moe="mixtral"), False, reads=_GQA | {"num_local_experts"}),
    "qwen2": Family(_dec(bias="qkv"), False, reads=_GQA),
    "qwen3": Family(_dec(bias="attention_bias", qk_norm=True), False, reads=_GQA | {"attention_bias"}),
    "qwen3_moe": Family(_dec(bias="attention_bias", qk_norm=True, moe="qwen3_moe"), False,
                        reads=_GQA | {"attention_bias", "num_experts", "moe_intermediate_size", "decoder_sparse_step",
                                      "mlp_only_layers"}),
    "gemma2": Family(_dec(bias="attention_bias", sandwich=True), True, reads=_GQA | {"attention_bias"}),
    "gemma3_text": Family(_dec(bias="attention_bias", qk_norm=True, sandwich=True), True,
                          reads=_GQA | {"attention_bias"}, defaults=GEMMA3_TEXT_DEFAULTS),
    "phi3": Family(lambda f, _mtp: _phi3(f), False, reads=_GQA),
    "gpt2": Family(lambda f, _mtp: _gpt2(f), True, width_key="n_embd", reads=frozenset({"n_inner"})),
    "deepseek_v2": Family(partial(build_mla, version="deepseek_v2"), False, reads=MLA_READS),
    "deepseek_v3": Family(partial(build_mla, version="deepseek_v3"), False, reads=MTP_READS, mtp=True),
    "kimi_k2": Family(partial(build_mla, version="deepseek_v3"), False, reads=MTP_READS, mtp=True),  # as mlx-lm
}
