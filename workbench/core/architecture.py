"""The shape-relevant numbers of a transformer, as named fields and as a Hugging Face ``config.json``.

:class:`ArchitectureConfig` holds the numbers other modules read by name (``hidden_size``,
``num_heads``, ``num_layers``, ``num_experts``...). It holds no shape code: its
:meth:`~ArchitectureConfig.to_hf_config` is the ``config.json`` dict of the same model, and
:func:`workbench.core.presets.build_spec` runs that dict through
:func:`workbench.core.hf_config.spec_from_hf_config`, the one builder of shapes.
:func:`architecture_from_hf_config` goes the other way, keeping every field it does not name in
``extra_hf_fields`` so that the round trip builds the same spec.

Also the two path conventions every builder follows: blocks are ``model.layers.{i}.`` (GPT-2:
``transformer.h.{i}.``), read by :func:`layer_index`; routed experts are ``...experts.{e}.``, read
by :func:`is_expert_param`.

Standard library and the workbench core only.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from workbench.core.checks import as_whole
from workbench.core.hf_config import fill_defaults, load_hf_config, spec_from_hf_config
from workbench.core.hf_families import FAMILIES as HF_FAMILIES
from workbench.core.hf_families import HFFields, attention_dims

__all__ = ["FAMILIES", "ArchitectureConfig", "architecture_from_hf_config", "is_expert_param", "layer_index"]

#: Every family with whether it is mixture-of-experts. A family is the Hugging Face ``model_type``,
#: except ``"qwen3-moe"`` (``model_type`` ``"qwen3_moe"``), the presets' older name.
FAMILIES: dict[str, bool] = {
    "gpt2": False, "llama": False, "mistral": False, "qwen2": False, "qwen3": False, "gemma2": False,
    "gemma3_text": False, "phi3": False, "mixtral": True, "qwen3-moe": True, "deepseek_v2": True,
    "deepseek_v3": True, "kimi_k2": True,
}
_MODEL_TYPE = {"qwen3-moe": "qwen3_moe"}
_FAMILY = {v: k for k, v in _MODEL_TYPE.items()}
#: The config field holding the routed experts per block, and whether experts have a width of their own.
_EXPERTS = {"mixtral": ("num_local_experts", False), "qwen3_moe": ("num_experts", True),
            "deepseek_v2": ("n_routed_experts", True), "deepseek_v3": ("n_routed_experts", True),
            "kimi_k2": ("n_routed_experts", True)}
#: The DeepSeek-style (multi-head latent attention) types: their head width is ``qk_rope_head_dim``.
_MLA = ("deepseek_v2", "deepseek_v3", "kimi_k2")

_LAYER_RE = re.compile(r"(?:^|\.)(?:h|layers)\.(\d+)\.")
_EXPERT_RE = re.compile(r"(?:^|\.)experts\.\d+\.")


@dataclass(frozen=True, kw_only=True)
class ArchitectureConfig:
    """The shape-relevant part of a model's published config.

    Attributes:
        name: Registry key and spec name, e.g. ``"llama-3-8b"``.
        family: One of :data:`FAMILIES`; picks the module layout.
        vocab_size: Vocabulary size (tokens).
        hidden_size: Model width (elements per token).
        num_layers: Number of transformer blocks.
        num_heads: Query heads per block.
        num_kv_heads: Key/value heads per block (grouped-query attention).
        head_dim: Elements per attention head (DeepSeek-V3: ``qk_rope_head_dim``, as ``transformers`` sets it).
        intermediate_size: Dense MLP width (elements); Mixtral's per-expert width.
        tie_embeddings: Whether the LM head reuses the token embedding.
        num_experts: Routed experts per block (0 for dense models).
        moe_intermediate_size: Per-expert MLP width for ``"qwen3-moe"`` and ``"deepseek_v3"`` (elements).
        max_position_embeddings: Context length (tokens); sizes GPT-2's ``wpe``.
        published_num_params: The published parameter count (elements).
        source: Where ``published_num_params`` comes from.
        extra_hf_fields: Further ``config.json`` fields, passed to the builder unchanged (e.g.
            ``attention_bias``, DeepSeek's MLA ranks); none may be a field the named ones set.

    Raises:
        ValueError: on an invalid field; the message names the field.
    """

    name: str
    family: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    tie_embeddings: bool
    num_experts: int = 0
    moe_intermediate_size: int = 0
    max_position_embeddings: int = 0
    published_num_params: int
    source: str
    # Excluded from the hash (values may be lists), compared for equality.
    extra_hf_fields: Mapping[str, object] = field(default_factory=dict, hash=False, repr=False)

    def __post_init__(self) -> None:
        for field_name in ("name", "source"):
            value = getattr(self, field_name)
            if not isinstance(value, str) or not value.strip():
                raise ValueError(f"ArchitectureConfig.{field_name} must be a non-empty string, got {value!r}.")
        if self.family not in FAMILIES:
            raise ValueError(f"ArchitectureConfig.family must be one of {sorted(FAMILIES)}, got {self.family!r}.")
        if not isinstance(self.tie_embeddings, bool):
            raise ValueError(f"ArchitectureConfig.tie_embeddings must be a bool, got {self.tie_embeddings!r}.")
        positive = ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
                    "intermediate_size", "published_num_params")
        for field_name in positive + ("num_experts", "moe_intermediate_size", "max_position_embeddings"):
            value = as_whole(getattr(self, field_name))
            if value is None or value < (1 if field_name in positive else 0):
                kind = "a positive" if field_name in positive else "a non-negative"
                raise ValueError(f"ArchitectureConfig.{field_name} must be {kind} int, got {getattr(self, field_name)!r}.")
            object.__setattr__(self, field_name, value)
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"ArchitectureConfig.num_kv_heads ({self.num_kv_heads}) must divide "
                             f"num_heads ({self.num_heads}).")
        self._check_family()
        if not isinstance(self.extra_hf_fields, Mapping):
            raise ValueError(f"ArchitectureConfig.extra_hf_fields must be a mapping, got {self.extra_hf_fields!r}.")
        object.__setattr__(self, "extra_hf_fields", MappingProxyType(dict(self.extra_hf_fields)))
        clash = sorted(set(self.extra_hf_fields) & set(self._named_hf_fields()))
        if clash:
            raise ValueError(f"ArchitectureConfig.extra_hf_fields sets {clash}, which the named fields set; "
                             "change those fields instead.")

    def _check_family(self) -> None:
        moe = FAMILIES[self.family]
        if moe and self.num_experts < 1:
            raise ValueError(f"ArchitectureConfig.num_experts must be >= 1 for family {self.family!r}.")
        if not moe and self.num_experts:
            raise ValueError(f"ArchitectureConfig.num_experts must be 0 for dense family {self.family!r}.")
        if _EXPERTS.get(self.model_type, ("", False))[1] and self.moe_intermediate_size < 1:
            raise ValueError(f"ArchitectureConfig.moe_intermediate_size must be >= 1 for family {self.family!r}.")
        if self.family == "gpt2":
            if self.max_position_embeddings < 1:
                raise ValueError("ArchitectureConfig.max_position_embeddings must be >= 1 for family 'gpt2'.")
            if self.num_heads * self.head_dim != self.hidden_size or self.num_kv_heads != self.num_heads:
                raise ValueError("ArchitectureConfig.head_dim: gpt2 needs num_heads * head_dim == hidden_size "
                                 "and num_kv_heads == num_heads.")

    @property
    def is_moe(self) -> bool:
        """Whether the blocks route tokens to experts."""
        return FAMILIES[self.family]

    @property
    def model_type(self) -> str:
        """The Hugging Face ``model_type`` of :attr:`family`."""
        return _MODEL_TYPE.get(self.family, self.family)

    def _named_hf_fields(self) -> dict[str, object]:
        """The ``config.json`` fields the named attributes set."""
        if self.family == "gpt2":
            return dict(model_type="gpt2", vocab_size=self.vocab_size, n_embd=self.hidden_size, n_layer=self.num_layers,
                        n_head=self.num_heads, n_inner=self.intermediate_size,
                        n_positions=self.max_position_embeddings, tie_word_embeddings=self.tie_embeddings)
        out: dict[str, object] = dict(
            model_type=self.model_type, vocab_size=self.vocab_size, hidden_size=self.hidden_size,
            num_hidden_layers=self.num_layers, num_attention_heads=self.num_heads,
            num_key_value_heads=self.num_kv_heads, head_dim=self.head_dim, intermediate_size=self.intermediate_size,
            tie_word_embeddings=self.tie_embeddings)
        if self.model_type in _EXPERTS:
            key, own_width = _EXPERTS[self.model_type]
            out[key] = self.num_experts
            if own_width:
                out["moe_intermediate_size"] = self.moe_intermediate_size
        if self.max_position_embeddings:
            out["max_position_embeddings"] = self.max_position_embeddings
        return out

    def to_hf_config(self) -> dict[str, object]:
        """The ``config.json`` dict of this architecture: the named fields, then :attr:`extra_hf_fields`.

        :func:`~workbench.core.hf_config.spec_from_hf_config` builds the spec from it; it holds no
        dtype (pass one).
        """
        return {**self._named_hf_fields(), **self.extra_hf_fields}


def architecture_from_hf_config(config: str | os.PathLike | Mapping[str, object], *,
                                name: str | None = None) -> ArchitectureConfig:
    """The :class:`ArchitectureConfig` of a Hugging Face ``config.json``.

    Every field not mapped to a named attribute is kept in ``extra_hf_fields``, so
    ``build_spec(architecture_from_hf_config(c))`` equals ``spec_from_hf_config(c)`` path for path.

    Args:
        config: A ``config.json`` path, a folder holding one, or the dict it holds.
        name: The name; ``None``: as :func:`~workbench.core.hf_config.spec_from_hf_config` names the spec.

    Returns:
        The config; ``published_num_params`` is the builder's count and ``source`` names the file.

    Raises:
        ValueError: if the config does not build (see ``spec_from_hf_config``), or a named attribute
            cannot be derived (e.g. DeepSeek-V3 without ``intermediate_size``); the message names the field.
    """
    raw, where = load_hf_config(config)
    raw = fill_defaults(raw)  # a sparse Gemma 3 text config reads as transformers fills it
    spec = spec_from_hf_config(config, dtype="float32", name=name)  # validates all; the count needs no dtype
    model_type = raw["model_type"]
    f = HFFields(raw, where)
    tie = f.flag("tie_word_embeddings", HF_FAMILIES[model_type].tie_default)
    experts, moe_width = 0, 0
    if model_type == "gpt2":
        d, nh = f.count("n_embd"), f.count("n_head")
        dims = dict(hidden_size=d, num_layers=f.count("n_layer"), num_heads=nh, num_kv_heads=nh, head_dim=d // nh,
                    intermediate_size=f.count("n_inner", default=4 * d),
                    max_position_embeddings=f.count("n_positions"))
    else:
        if model_type in _MLA:
            nh = f.count("num_attention_heads")
            d, nkv, hd = f.count("hidden_size"), f.count("num_key_value_heads", default=nh), f.count("qk_rope_head_dim")
        else:
            d, nh, nkv, hd = attention_dims(f)
        dims = dict(hidden_size=d, num_layers=f.count("num_hidden_layers"), num_heads=nh, num_kv_heads=nkv,
                    head_dim=hd, intermediate_size=f.count("intermediate_size"),
                    max_position_embeddings=f.count("max_position_embeddings", default=0, minimum=0))
        if model_type in _EXPERTS:
            key, own_width = _EXPERTS[model_type]
            experts = f.count(key)
            moe_width = f.count("moe_intermediate_size") if own_width else 0
    arch = ArchitectureConfig(name=spec.name, family=_FAMILY.get(model_type, model_type),
                              vocab_size=f.count("vocab_size"), tie_embeddings=tie, num_experts=experts,
                              moe_intermediate_size=moe_width, published_num_params=spec.num_params,
                              source=f"computed by spec_from_hf_config from {where}", **dims)
    named = arch._named_hf_fields()
    return replace(arch, extra_hf_fields={k: v for k, v in raw.items() if k not in named})


def layer_index(path: str) -> int | None:
    """The transformer block a parameter path belongs to.

    Args:
        path: e.g. ``"model.layers.3.mlp.up_proj.weight"`` or ``"transformer.h.0.ln_1.bias"``.

    Returns:
        The block index, or ``None`` for embeddings, the final norm and the LM head.
    """
    match = _LAYER_RE.search(path)
    return int(match.group(1)) if match else None


def is_expert_param(path: str) -> bool:
    """Whether ``path`` is a routed-expert weight (``...experts.{e}...``); the router is not."""
    return _EXPERT_RE.search(path) is not None
