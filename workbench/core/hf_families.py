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

The LM head (``lm_head.weight``) is added by the caller when embeddings are untied. Buffers
(rotary ``inv_freq``, GPT-2's causal ``attn.bias``) are not parameters and are left out.

No config makes a builder run for minutes or out of memory (10**6 layers or 10**7 experts would):
the bounds of :mod:`workbench.core.checks` apply. The workbench core only; every error is a
``ValueError`` naming the field and the file.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from workbench.core.checks import MAX_CONFIG_SIZE, MAX_NUM_ARRAYS, MAX_NUM_EXPERTS, MAX_NUM_LAYERS, BoundedList, shown

Rows = list[tuple[str, tuple[int, ...]]]

_REQUIRED = object()
#: Fields bounded below :data:`~workbench.core.checks.MAX_CONFIG_SIZE`.
_BOUNDS = {"num_hidden_layers": MAX_NUM_LAYERS, "n_layer": MAX_NUM_LAYERS, "num_nextn_predict_layers": MAX_NUM_LAYERS,
           "num_local_experts": MAX_NUM_EXPERTS, "num_experts": MAX_NUM_EXPERTS, "n_routed_experts": MAX_NUM_EXPERTS,
           "n_shared_experts": MAX_NUM_EXPERTS}


class HFFields:
    """Typed, checked access to one config's fields.

    Args:
        raw: The parsed ``config.json``.
        where: The file path, or ``"config dict"``, for error messages.
    """

    def __init__(self, raw: Mapping[str, object], where: str) -> None:
        self.raw = raw
        self.where = where
        self.counts: dict[str, int] = {}  # every count read, for messages about totals
        self._indices: dict[str, frozenset[int]] = {}

    def error(self, key: str, message: str) -> ValueError:
        """A ``ValueError`` naming ``key`` and the file."""
        return ValueError(f"{self.where}: field '{key}' {message}")

    def count(self, key: str, default: object = _REQUIRED, minimum: int = 1) -> int:
        """An integer field (a width in elements, or a number of layers, heads or experts).

        Args:
            key: Field name.
            default: Value when the field is absent or null; required when not given.
            minimum: Smallest accepted value; the largest is ``MAX_NUM_LAYERS`` for a layer count,
                ``MAX_NUM_EXPERTS`` for an expert count, else ``MAX_CONFIG_SIZE`` (:mod:`~workbench.core.checks`).

        Raises:
            ValueError: if required and absent, not an integer (4096.0, true, "4096" are not), or out of bounds.
        """
        value = self.raw.get(key)
        if value is None:
            if default is _REQUIRED:
                raise self.error(key, "is required and absent (or null).")
            return default  # type: ignore[return-value]
        maximum = _BOUNDS.get(key, MAX_CONFIG_SIZE)
        if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
            raise self.error(key, f"must be an integer from {minimum} to {maximum:,}, got {shown(value)}.")
        self.counts[key] = value
        return value

    def indices(self, key: str) -> frozenset[int]:
        """A list of layer indices (empty when absent or null), checked once; a ValueError if it is not one."""
        if key not in self._indices:
            value = self.raw.get(key) or []
            if not isinstance(value, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in value):
                raise self.error(key, f"must be a list of layer indices, got {shown(value)}.")
            self._indices[key] = frozenset(value)
        return self._indices[key]

    def rows(self, *first: tuple[str, tuple[int, ...]]) -> Rows:
        """Rows (``first`` to begin with) that raise once ``+=`` (a layer) makes them over ``MAX_NUM_ARRAYS``."""
        def error() -> ValueError:
            sizes = ", ".join(f"{k} = {v:,}" for k, v in self.counts.items() if k in _BOUNDS)
            return ValueError(f"{self.where}: fields {sizes} make more than {MAX_NUM_ARRAYS:,} parameter arrays "
                              "(the bound; DeepSeek-V3 has 45,395).")
        return BoundedList(first, MAX_NUM_ARRAYS, error)

    def flag(self, key: str, default: bool) -> bool:
        """A boolean field; ``default`` when absent or null.

        Raises:
            ValueError: if the field is not a JSON boolean.
        """
        value = self.raw.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self.error(key, f"must be true or false, got {shown(value)}.")
        return value


def _linear(path: str, out_features: int, in_features: int, bias: bool = False) -> Rows:
    rows: Rows = [(path + ".weight", (out_features, in_features))]
    return rows + [(path + ".bias", (out_features,))] if bias else rows


def _norm(path: str, dim: int) -> Rows:
    return [(path + ".weight", (dim,))]


def _glu(prefix: str, d: int, f: int, names: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj"),
         bias: bool = False) -> Rows:
    """A gated MLP: gate (f, d), up (f, d), down (d, f); Mixtral names them w1, w3, w2 (in the order w1, w2, w3)."""
    shapes = {"gate_proj": (f, d), "up_proj": (f, d), "down_proj": (d, f), "w1": (f, d), "w2": (d, f), "w3": (f, d)}
    return [row for n in names for row in _linear(prefix + n, shapes[n][0], shapes[n][1], bias)]


def attention_dims(f: HFFields) -> tuple[int, int, int, int]:
    """``(hidden_size, num_heads, num_kv_heads, head_dim)``; ``head_dim`` defaults to hidden / heads.

    Raises:
        ValueError: if ``num_key_value_heads`` does not divide ``num_attention_heads``, or ``head_dim``
            is absent and ``hidden_size`` is not a multiple of ``num_attention_heads``.
    """
    d, nh = f.count("hidden_size"), f.count("num_attention_heads")
    nkv = f.count("num_key_value_heads", default=nh)
    if nh % nkv:
        raise f.error("num_key_value_heads", f"({nkv}) must divide num_attention_heads ({nh}).")
    hd = f.count("head_dim", default=None)
    if hd is None:
        if d % nh:
            raise f.error("head_dim", f"is absent and hidden_size ({d}) is not a multiple of "
                                      f"num_attention_heads ({nh}).")
        hd = d // nh
    return d, nh, nkv, hd


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
        rows += _linear(a + "q_proj", nh * hd, d, qkv_bias) + _linear(a + "k_proj", nkv * hd, d, qkv_bias)
        rows += _linear(a + "v_proj", nkv * hd, d, qkv_bias) + _linear(a + "o_proj", d, nh * hd, o_bias)
        if qk_norm:
            rows += _norm(p + "self_attn.q_norm", hd) + _norm(p + "self_attn.k_norm", hd)
        rows += _ffn(f, moe, i, p, d, ffn_bias)
        rows += _norm(p + "input_layernorm", d) + _norm(p + "post_attention_layernorm", d)
        if sandwich:
            rows += _norm(p + "pre_feedforward_layernorm", d) + _norm(p + "post_feedforward_layernorm", d)
    return rows + _norm("model.norm", d)


def _ffn(f: HFFields, moe: str, i: int, p: str, d: int, bias: bool) -> Rows:
    """Layer ``i``'s feed-forward block: a dense gated MLP, Mixtral's ``block_sparse_moe`` or Qwen3-MoE's ``mlp``."""
    if moe == "mixtral":  # MixtralSparseMoeBlock: gate (router), then experts w1, w2, w3
        n_exp, width = f.count("num_local_experts"), f.count("intermediate_size")
        experts = [_glu(f"{p}block_sparse_moe.experts.{e}.", d, width, ("w1", "w2", "w3")) for e in range(n_exp)]
        return _linear(p + "block_sparse_moe.gate", n_exp, d) + [row for rows in experts for row in rows]
    if moe == "qwen3_moe" and _qwen3_moe_sparse(f, i):  # Qwen3MoeSparseMoeBlock: gate, then experts; no shared expert
        n_exp, width = f.count("num_experts"), f.count("moe_intermediate_size")
        experts = [_glu(f"{p}mlp.experts.{e}.", d, width) for e in range(n_exp)]
        return _linear(p + "mlp.gate", n_exp, d) + [row for rows in experts for row in rows]
    return _glu(p + "mlp.", d, f.count("intermediate_size"), bias=bias)


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
        rows += _linear(p + "self_attn.o_proj", d, nh * hd) + _linear(p + "self_attn.qkv_proj", (nh + 2 * nkv) * hd, d)
        rows += _linear(p + "mlp.gate_up_proj", 2 * width, d) + _linear(p + "mlp.down_proj", d, width)
        rows += _norm(p + "input_layernorm", d) + _norm(p + "post_attention_layernorm", d)
    return rows + _norm("model.norm", d)


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


def _deepseek_v3(f: HFFields, include_mtp: bool = False) -> Rows:
    """DeepSeek-V3: MLA attention, ``first_k_dense_replace`` dense layers, then MoE layers (routed experts,
    router ``gate`` with ``e_score_correction_bias``, ``shared_experts``); optionally the MTP layers."""
    d, vocab, n_layers = f.count("hidden_size"), f.count("vocab_size"), f.count("num_hidden_layers")
    nh = f.count("num_attention_heads")
    rope, nope, v_hd = f.count("qk_rope_head_dim"), f.count("qk_nope_head_dim"), f.count("v_head_dim")
    q_rank, kv_rank = f.count("q_lora_rank", default=None), f.count("kv_lora_rank")
    if f.count("head_dim", default=rope) != rope:  # transformers' DeepseekV3Config sets head_dim = qk_rope_head_dim
        raise f.error("head_dim", f"({f.raw['head_dim']}) must equal qk_rope_head_dim ({rope}) for deepseek_v3.")
    f.count("num_key_value_heads", default=nh)  # MLA: checked, but no shape depends on it
    dense, n_exp = f.count("first_k_dense_replace", default=0, minimum=0), f.count("n_routed_experts")
    moe_width, n_shared = f.count("moe_intermediate_size"), f.count("n_shared_experts", default=0, minimum=0)
    if f.raw.get("topk_method") not in (None, "noaux_tc"):
        raise f.error("topk_method", f"= {shown(f.raw['topk_method'])}: only 'noaux_tc' (router with "
                                     "e_score_correction_bias) is a deepseek_v3 router.")

    def layer(i: int) -> Rows:
        p = f"model.layers.{i}."
        a = p + "self_attn."
        if q_rank is None:
            rows = _linear(a + "q_proj", nh * (nope + rope), d)
        else:
            rows = _linear(a + "q_a_proj", q_rank, d) + _norm(a + "q_a_layernorm", q_rank)
            rows += _linear(a + "q_b_proj", nh * (nope + rope), q_rank)
        rows += _linear(a + "kv_a_proj_with_mqa", kv_rank + rope, d) + _norm(a + "kv_a_layernorm", kv_rank)
        rows += _linear(a + "kv_b_proj", nh * (nope + v_hd), kv_rank) + _linear(a + "o_proj", d, nh * v_hd)
        if i < dense:
            rows += _glu(p + "mlp.", d, f.count("intermediate_size"))
        else:
            rows += [r for e in range(n_exp) for r in _glu(f"{p}mlp.experts.{e}.", d, moe_width)]
            rows += [(p + "mlp.gate.weight", (n_exp, d)), (p + "mlp.gate.e_score_correction_bias", (n_exp,))]
            rows += _glu(p + "mlp.shared_experts.", d, moe_width * n_shared) if n_shared else []
        return rows + _norm(p + "input_layernorm", d) + _norm(p + "post_attention_layernorm", d)

    rows = f.rows(("model.embed_tokens.weight", (vocab, d)))
    for i in range(n_layers):
        rows += layer(i)
    rows += _norm("model.norm", d)
    n_mtp = f.count("num_nextn_predict_layers", default=0, minimum=0)
    if include_mtp and not n_mtp:
        raise f.error("num_nextn_predict_layers", "is absent or 0, so there are no MTP layers to include.")
    for i in range(n_layers, n_layers + (n_mtp if include_mtp else 0)):
        # MTP module as stored in the checkpoint's layer i, without its copies of embed_tokens and
        # shared_head.head (the main model's embedding and LM head): enorm, hnorm, eh_proj, a decoder
        # layer, shared_head.norm. The order within the module is the checkpoint's name order.
        p = f"model.layers.{i}."
        rows += _norm(p + "enorm", d) + _norm(p + "hnorm", d) + _linear(p + "eh_proj", d, 2 * d)
        rows += layer(i) + _norm(p + "shared_head.norm", d)
    return rows


@dataclass(frozen=True)
class Family:
    """How one ``model_type`` is built.

    Attributes:
        build: ``build(fields, include_mtp)`` -> ``(path, shape)`` rows, without the untied LM head.
        tie_default: ``tie_word_embeddings`` when the config leaves it out (the HF config class default).
        width_key: The field holding the model width (sizes ``lm_head``).
        reads: Fields of :data:`workbench.core.hf_config.SHAPE_FIELDS` this builder honours.
    """

    build: Callable[[HFFields, bool], Rows]
    tie_default: bool
    width_key: str = "hidden_size"
    reads: frozenset[str] = frozenset()


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
                          reads=_GQA | {"attention_bias"}),
    "phi3": Family(lambda f, _mtp: _phi3(f), False, reads=_GQA),
    "gpt2": Family(lambda f, _mtp: _gpt2(f), True, width_key="n_embd", reads=frozenset({"n_inner"})),
    "deepseek_v3": Family(_deepseek_v3, False,
                          reads=_GQA | {"n_routed_experts", "n_shared_experts", "moe_intermediate_size",
                                        "first_k_dense_replace", "q_lora_rank", "kv_lora_rank", "qk_rope_head_dim",
                                        "qk_nope_head_dim", "v_head_dim", "num_nextn_predict_layers"}),
}
