"""Shapes of DeepSeek's latent-attention, mixture-of-experts models: ``deepseek_v2``, ``deepseek_v3``, ``kimi_k2``.

Parameter names, shapes and order are those of the checkpoints and of ``transformers``'
``DeepseekV2ForCausalLM`` / ``DeepseekV3ForCausalLM`` (read in ``transformers`` 4.57.6 and 5.24.0,
whose per-expert modules 5.x fuses into one array; the checkpoints keep one module per expert, as here),
and of mlx-lm's ``models/deepseek_v2.py`` / ``deepseek_v3.py``. ``kimi_k2`` (Moonshot's Kimi K2, whose
``config.json`` names ``DeepseekV3ForCausalLM``) has DeepSeek-V3's shapes: mlx-lm maps it so
(``MODEL_REMAPPING = {..., "kimi_k2": "deepseek_v3"}`` in ``mlx_lm/utils.py``).

Per block ``model.layers.{i}.`` (DeepSeek-V2 paper, arXiv:2405.04434, section 2.1; ``h`` = heads):

* ``self_attn``: ``q_proj`` ``(h * (qk_nope_head_dim + qk_rope_head_dim), hidden)`` when ``q_lora_rank``
  is null (DeepSeek-V2-Lite), else ``q_a_proj`` ``(q_lora_rank, hidden)``, ``q_a_layernorm``,
  ``q_b_proj``; then ``kv_a_proj_with_mqa`` ``(kv_lora_rank + qk_rope_head_dim, hidden)``,
  ``kv_a_layernorm``, ``kv_b_proj`` ``(h * (qk_nope_head_dim + v_head_dim), kv_lora_rank)``, ``o_proj``.
* ``mlp``: a mixture of experts when ``i >= first_k_dense_replace`` and ``i % moe_layer_freq == 0``
  (DeepSeek's own modeling code and mlx-lm; ``transformers``' native classes ignore ``moe_layer_freq``,
  which is 1 in every published config), else a dense gated MLP of ``intermediate_size``. The mixture:
  ``n_routed_experts`` experts of ``moe_intermediate_size``, the router ``gate.weight``
  ``(n_routed_experts, hidden)`` (DeepSeek-V3 and Kimi K2 add ``gate.e_score_correction_bias``
  ``(n_routed_experts,)``, their ``noaux_tc`` router's bias, a parameter of DeepSeek's and mlx-lm's
  code), and ``shared_experts``, one gated MLP of width ``n_shared_experts * moe_intermediate_size``
  (none when that is 0 or null).

The workbench core only; every error is a ``ValueError`` naming the field and the file.
"""

from __future__ import annotations

from workbench.core.checks import shown
from workbench.core.hf_fields import HFFields, Rows, glu, linear, norm

__all__ = ["MLA_READS", "MTP_READS", "build_mla"]

#: Shape fields of :data:`workbench.core.hf_config.SHAPE_FIELDS` that :func:`build_mla` honours.
MLA_READS = frozenset({"head_dim", "num_key_value_heads", "n_routed_experts", "n_shared_experts",
                       "moe_intermediate_size", "first_k_dense_replace", "moe_layer_freq", "q_lora_rank",
                       "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"})
#: And for the models with multi-token-prediction layers (DeepSeek-V3, Kimi K2).
MTP_READS = MLA_READS | {"num_nextn_predict_layers"}

#: The routers (``topk_method``) whose parameters each version builds.
_ROUTERS = {"deepseek_v2": ("greedy", "group_limited_greedy"), "deepseek_v3": ("noaux_tc",)}


def build_mla(f: HFFields, include_mtp: bool, version: str) -> Rows:
    """``(path, shape)`` of every parameter but the untied LM head, in ``named_parameters()`` order.

    Args:
        f: The config's fields.
        include_mtp: Also build the ``num_nextn_predict_layers`` multi-token-prediction layers
            (``version`` ``"deepseek_v3"`` only), as stored in the checkpoint, without their copies of
            the embedding and LM head.
        version: ``"deepseek_v2"`` or ``"deepseek_v3"`` (also Kimi K2's).

    Raises:
        ValueError: on a missing or malformed field, ``head_dim`` other than ``qk_rope_head_dim`` (as
            ``transformers`` sets it), a router (``topk_method``) of another version, or ``include_mtp``
            without MTP layers; the message names the field and the file.
    """
    assert version in _ROUTERS, version
    d, vocab, n_layers = f.count("hidden_size"), f.count("vocab_size"), f.count("num_hidden_layers")
    nh = f.count("num_attention_heads")
    rope, nope, v_hd = f.count("qk_rope_head_dim"), f.count("qk_nope_head_dim"), f.count("v_head_dim")
    q_rank, kv_rank = f.count("q_lora_rank", default=None), f.count("kv_lora_rank")
    if f.count("head_dim", default=rope) != rope:  # transformers' configs set head_dim = qk_rope_head_dim
        raise f.error("head_dim", f"({f.raw['head_dim']}) must equal qk_rope_head_dim ({rope}) for {version}.")
    f.count("num_key_value_heads", default=nh)  # MLA: checked, but no shape depends on it
    dense, freq = f.count("first_k_dense_replace", default=0, minimum=0), f.count("moe_layer_freq", default=1)
    n_exp, moe_width = f.count("n_routed_experts"), f.count("moe_intermediate_size")
    n_shared = f.count("n_shared_experts", default=0, minimum=0)
    routers = _ROUTERS[version]
    if f.raw.get("topk_method") not in (None, *routers):
        raise f.error("topk_method", f"= {shown(f.raw['topk_method'])}: a {version} router is "
                                     f"{' or '.join(map(repr, routers))}; another builds other parameters.")

    def layer(i: int) -> Rows:
        p = f"model.layers.{i}."
        a = p + "self_attn."
        if q_rank is None:
            rows = linear(a + "q_proj", nh * (nope + rope), d)
        else:
            rows = linear(a + "q_a_proj", q_rank, d) + norm(a + "q_a_layernorm", q_rank)
            rows += linear(a + "q_b_proj", nh * (nope + rope), q_rank)
        rows += linear(a + "kv_a_proj_with_mqa", kv_rank + rope, d) + norm(a + "kv_a_layernorm", kv_rank)
        rows += linear(a + "kv_b_proj", nh * (nope + v_hd), kv_rank) + linear(a + "o_proj", d, nh * v_hd)
        if i < dense or i % freq:
            rows += glu(p + "mlp.", d, f.count("intermediate_size"))
        else:
            rows += [r for e in range(n_exp) for r in glu(f"{p}mlp.experts.{e}.", d, moe_width)]
            rows += [(p + "mlp.gate.weight", (n_exp, d))]
            rows += [(p + "mlp.gate.e_score_correction_bias", (n_exp,))] if version == "deepseek_v3" else []
            rows += glu(p + "mlp.shared_experts.", d, moe_width * n_shared) if n_shared else []
        return rows + norm(p + "input_layernorm", d) + norm(p + "post_attention_layernorm", d)

    rows = f.rows(("model.embed_tokens.weight", (vocab, d)))
    for i in range(n_layers):
        rows += layer(i)
    rows += norm("model.norm", d)
    n_mtp = f.count("num_nextn_predict_layers", default=0, minimum=0) if version == "deepseek_v3" else 0
    if not include_mtp:
        return rows
    if not n_mtp:
        raise f.error("num_nextn_predict_layers", "is absent or 0, so there are no MTP layers to include.")
    for i in range(n_layers, n_layers + n_mtp):
        # MTP module as stored in the checkpoint's layer i, without its copies of embed_tokens and
        # shared_head.head (the main model's embedding and LM head): enorm, hnorm, eh_proj, a decoder
        # layer, shared_head.norm. The order within the module is the checkpoint's name order.
        p = f"model.layers.{i}."
        rows += norm(p + "enorm", d) + norm(p + "hnorm", d) + linear(p + "eh_proj", d, 2 * d)
        rows += layer(i) + norm(p + "shared_head.norm", d)
    return rows
