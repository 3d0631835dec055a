"""A :class:`~workbench.core.specs.ModelSpec` from a Hugging Face ``config.json``, by shape only.

:func:`spec_from_hf_config` reads a local ``config.json`` (a path, a folder holding one, or the
dict it holds) and returns every parameter's path, shape and dtype, as the ``transformers``
model class of its ``model_type`` would create them: nothing is allocated, nothing downloaded.
Paths, shapes and order follow :mod:`workbench.core.presets` (see
:mod:`workbench.core.hf_families`), so memory estimates, bucket plans and MoE expert detection
(:func:`~workbench.core.presets.is_expert_param`) work on the result.

Never guessing: an unsupported ``model_type``, a missing or malformed required field, or a field
that would change shapes in a way the builder does not build raises a ``ValueError`` naming the
field and the file. Fields that change no parameter shape (activations, RoPE scaling, sliding
windows, ``pretraining_tp``, dropout, token ids) are not read. A hostile file fails fast, naming
what is wrong (see :mod:`workbench.core.checks` for the bounds): over :data:`MAX_CONFIG_BYTES`,
nested past ``MAX_JSON_DEPTH``, an integer of over ``MAX_JSON_INT_DIGITS`` digits, a key given
twice, more than ``MAX_NUM_LAYERS`` layers or ``MAX_NUM_EXPERTS`` experts, more than
``MAX_NUM_ARRAYS`` parameter arrays, or more than ``MAX_NUM_PARAMS`` parameters.

What is counted, per ``transformers`` (``sum(p.numel() for p in model.parameters())``): tied
embeddings once; buffers never. Where a published config leaves something out, the builder does what
``transformers`` does with it:

* No ``torch_dtype`` (or ``dtype``), as in every published GPT-2 config: the parameters are float32
  (:data:`NO_DTYPE_DEFAULT`), the dtype ``transformers`` creates such a model in (torch's default dtype;
  ``_get_dtype`` in ``modeling_utils.py`` of 4.57.6, ``from_config`` in 5.24.0); a ``UserWarning`` says so
  in one line. Pass ``dtype=...`` to choose.
* Gemma 3's sparse ``text_config``: shape fields it leaves out take ``Gemma3TextConfig``'s defaults
  (:data:`~workbench.core.hf_families.GEMMA3_TEXT_DEFAULTS`; e.g. 262,208 tokens, 8 heads, head_dim 256).

Two documented choices:

* ``quantization_config`` is not read: the spec is the unquantized model in ``torch_dtype``
  (e.g. DeepSeek-V3's FP8 checkpoint is described as the bf16 model it trains as; FP8 block-scale
  tensors are not parameters of the model class).
* DeepSeek-V3's multi-token-prediction layers (``num_nextn_predict_layers``) are left out by
  default, as in ``transformers``' ``DeepseekV3ForCausalLM`` and the published 671B; pass
  ``include_mtp=True`` to add them (without their copies of the embedding and LM head).
  The router's ``e_score_correction_bias`` (n_routed_experts elements per MoE layer) is counted:
  it is a parameter in DeepSeek's own modeling code and a tensor of the checkpoint.

Standard library and the workbench core only.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Mapping
from pathlib import Path

from workbench.core.checks import MAX_NUM_PARAMS, loads_bounded, read_user_text, shown
from workbench.core.hf_families import FAMILIES, HFFields, Rows
from workbench.core.specs import ModelSpec, ParamSpec, canonical_dtype
from workbench.core.units import MiB

__all__ = ["MAX_CONFIG_BYTES", "NO_DTYPE_DEFAULT", "SHAPE_FIELDS", "SUPPORTED_MODEL_TYPES", "fill_defaults",
           "load_hf_config", "spec_from_hf_config"]

#: The largest ``config.json`` read, in bytes (published ones are under 100 KiB).
MAX_CONFIG_BYTES = 16 * MiB

#: The parameters' dtype when a config names none and no ``dtype=`` is given: ``transformers`` creates a
#: model from such a config in torch's default dtype, float32.
NO_DTYPE_DEFAULT = "float32"

#: The ``model_type`` values :func:`spec_from_hf_config` builds.
SUPPORTED_MODEL_TYPES: tuple[str, ...] = tuple(sorted(FAMILIES))

#: Fields that change parameter shapes in some Hugging Face family, with the values that change
#: nothing (``None``/absent always does). A family whose builder does not honour such a field
#: raises when a config sets it to anything else.
SHAPE_FIELDS: dict[str, tuple[object, ...]] = {
    "attention_bias": (False,), "mlp_bias": (False,), "qkv_bias": (False,), "use_qk_norm": (False,),
    "qk_layernorm": (False,), "head_dim": (), "num_key_value_heads": (), "n_inner": (),
    "num_experts": (0,), "num_local_experts": (0,), "n_routed_experts": (0,), "n_shared_experts": (0,),
    "moe_intermediate_size": (0,), "shared_expert_intermediate_size": (0,), "decoder_sparse_step": (),
    "mlp_only_layers": ([],), "moe_layer_freq": (1,), "first_k_dense_replace": (0,), "q_lora_rank": (),
    "kv_lora_rank": (), "qk_rope_head_dim": (), "qk_nope_head_dim": (), "v_head_dim": (),
    "num_nextn_predict_layers": (0,), "add_cross_attention": (False,), "text_config": (), "vision_config": (),
    "audio_config": (),
}

#: ``layer_types`` entries that change no shapes (which attention mask a layer uses).
_PLAIN_LAYER_TYPES = frozenset({"full_attention", "sliding_attention"})
#: Heads whose parameters the builders add (an untied ``lm_head`` or none).
_LM_HEAD_SUFFIXES = ("ForCausalLM", "LMHeadModel")


def load_hf_config(config: str | os.PathLike | Mapping[str, object]) -> tuple[dict, str]:
    """The config as a dict, and where it came from (for error messages).

    Args:
        config: A ``config.json`` path, a folder holding ``config.json`` (a local snapshot), or the
            dict such a file holds.

    Returns:
        ``(config_dict, where)``: ``where`` is the file path, or ``"config dict"``.

    Raises:
        ValueError: if the file is missing, unreadable, over :data:`MAX_CONFIG_BYTES`, not a JSON
            object, or refused by :func:`~workbench.core.checks.loads_bounded`; the message names the file.
    """
    if isinstance(config, Mapping):
        return dict(config), "config dict"
    if not isinstance(config, (str, os.PathLike)):
        raise ValueError(f"config must be a config.json path or a dict, got {type(config).__name__}.")
    path = Path(config)
    try:  # is_dir and is_file raise on a name too long, or in a folder that may not be searched
        if path.is_dir():
            path = path / "config.json"
        if not path.is_file():
            raise ValueError(f"{path}: no such config file.")
    except OSError as err:
        raise ValueError(f"{shown(str(path))}: cannot be read ({err.strerror or err}).") from err
    text = read_user_text(path, MAX_CONFIG_BYTES, str(path), "which no config.json is")
    raw = loads_bounded(text, str(path))
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: holds a JSON {type(raw).__name__}, not an object of config fields.")
    return raw, str(path)


def fill_defaults(raw: Mapping[str, object]) -> dict:
    """``raw`` with the fields its config class fills when a config leaves them out (Gemma 3's text config).

    The fields a supported family's builder reads (:attr:`~workbench.core.hf_families.Family.defaults`)
    are added where absent; a field given, even as null, is kept. Any other config comes back unchanged.

    Args:
        raw: A parsed ``config.json``.

    Returns:
        A new dict.
    """
    model_type = raw.get("model_type")
    family = FAMILIES.get(model_type) if isinstance(model_type, str) else None
    return {**family.defaults, **raw} if family else dict(raw)


def _config_dtype(f: HFFields, override: object) -> str:
    """The canonical dtype: ``override``, else the config's ``torch_dtype`` / ``dtype`` (which must agree),
    else :data:`NO_DTYPE_DEFAULT` with a one-line ``UserWarning``."""
    if override is not None:
        return canonical_dtype(override)
    found: dict[str, str] = {}
    for key in ("torch_dtype", "dtype"):
        value = f.raw.get(key)
        if value is None:
            continue
        if not isinstance(value, str):
            raise f.error(key, f"must be a dtype name such as \"bfloat16\", got {shown(value)}.")
        try:
            found[key] = canonical_dtype(value)
        except ValueError as err:
            raise f.error(key, f"= {shown(value)} is not a dtype the workbench knows ({err}).") from err
    if not found:
        warnings.warn(f"{f.where}: no 'torch_dtype' (or 'dtype'), so the parameters are {NO_DTYPE_DEFAULT}, "
                      "as transformers creates such a model; pass dtype=... to choose.", UserWarning, stacklevel=3)
        return NO_DTYPE_DEFAULT
    if len(set(found.values())) > 1:
        raise f.error("dtype", f"and 'torch_dtype' disagree ({found['dtype']} vs {found['torch_dtype']}); "
                               "pass dtype=... to choose.")
    return next(iter(found.values()))


def _check_honoured(f: HFFields, model_type: str, reads: frozenset[str]) -> None:
    """Raise on a shape-changing field the builder does not honour, a layer kind it does not build,
    or a head other than a causal-LM head."""
    for key, neutral in SHAPE_FIELDS.items():
        value = f.raw.get(key)
        if key in reads or value is None or any(value == n and type(value) is type(n) for n in neutral):
            continue
        allowed = ", ".join(["absent", "null"] + [json.dumps(n) for n in neutral])
        raise f.error(key, f"= {shown(value)} changes parameter shapes, and the {model_type!r} builder cannot "
                           f"honour it (accepted here: {allowed}).")
    layer_types = _names(f, "layer_types")
    odd = sorted(set(layer_types) - _PLAIN_LAYER_TYPES)
    if odd:
        raise f.error("layer_types", f"holds {shown(odd)}; only {sorted(_PLAIN_LAYER_TYPES)} layers (same shapes) "
                                     "are built.")
    odd_heads = [a for a in _names(f, "architectures") if not a.endswith(_LM_HEAD_SUFFIXES)]
    if odd_heads:
        raise f.error("architectures", f"names {shown(odd_heads)}: only causal-LM heads (…ForCausalLM, "
                                       "…LMHeadModel) are built; another head has other parameters.")


def _names(f: HFFields, key: str) -> list[str]:
    """A list of strings (``[]`` when absent or null); a lone string is refused, not read letter by letter."""
    value = f.raw.get(key)
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise f.error(key, f"must be a list of strings, got {shown(value)}.")
    return value


def _check_total(f: HFFields, rows: Rows) -> None:
    """Raise if ``rows`` hold more than :data:`~workbench.core.checks.MAX_NUM_PARAMS` elements in all."""
    total, largest, largest_size = 0, "", -1
    for path, shape in rows:
        size = 1
        for dim in shape:
            size *= dim
        total += size
        if size > largest_size:
            largest, largest_size = path, size
    if total > MAX_NUM_PARAMS:
        sizes = ", ".join(f"{k} = {v:,}" for k, v in f.counts.items())
        raise ValueError(f"{f.where}: fields {sizes} make {total:,} parameters ({largest} alone {largest_size:,}), "
                         f"more than {MAX_NUM_PARAMS:,} (the bound).")


def _multimodal_hint(raw: Mapping[str, object]) -> str:
    """How to build the language model of a multimodal config (its ``text_config``), or ``""``."""
    text = raw.get("text_config")
    if not isinstance(text, Mapping) or not isinstance(text.get("model_type"), str) or \
            text["model_type"] not in FAMILIES:
        return ""
    dtype = raw.get("torch_dtype") or raw.get("dtype")
    keyword = f", dtype={shown(dtype)}" if isinstance(dtype, str) else ""
    return (f" (a multimodal config; its language model alone is spec_from_hf_config(config['text_config']"
            f"{keyword}): {text['model_type']!r}, without the vision tower)")


def spec_from_hf_config(
    config: str | os.PathLike | Mapping[str, object],
    *,
    dtype: object = None,
    name: str | None = None,
    include_mtp: bool = False,
) -> ModelSpec:
    """The parameter spec of a Hugging Face model, from its ``config.json``, by shape only.

    Args:
        config: A ``config.json`` path, a folder holding one, or the dict it holds. Its
            ``model_type`` must be one of :data:`SUPPORTED_MODEL_TYPES`.
        dtype: Element type of every parameter (any name
            :func:`~workbench.core.specs.canonical_dtype` accepts). ``None``: the config's
            ``torch_dtype`` (or ``dtype``); if it has neither (GPT-2's), :data:`NO_DTYPE_DEFAULT`
            (float32, as ``transformers`` does) with a one-line ``UserWarning``.
        name: The spec's name. ``None``: the config's ``_name_or_path``, else the file's stem
            (the folder's name for ``config.json``), else the ``model_type``.
        include_mtp: DeepSeek-V3 and Kimi K2 only: also build the ``num_nextn_predict_layers``
            multi-token-prediction layers (``model.layers.{num_hidden_layers + k}``), which
            ``transformers`` does not build and the published 671B does not count.

    Returns:
        A :class:`~workbench.core.specs.ModelSpec` in ``named_parameters()`` order:
        ``num_params`` in elements, ``nbytes`` in bytes. Tied embeddings are one array
        (``model.embed_tokens.weight`` / ``transformer.wte.weight``, no ``lm_head.weight``).

    Raises:
        ValueError: on an unsupported ``model_type``; a missing or malformed required field; a
            shape-changing field the builder cannot honour (:data:`SHAPE_FIELDS`, ``layer_types``,
            a non-causal-LM ``architectures`` entry); an unknown dtype;
            ``include_mtp`` for a config without MTP layers; or a size past a bound of
            :mod:`workbench.core.checks` (``MAX_NUM_LAYERS`` = 4,096 layers, ``MAX_NUM_EXPERTS`` =
            4,096 experts, ``MAX_NUM_ARRAYS`` = 2**18 arrays, ``MAX_NUM_PARAMS`` = 10**15 parameters,
            ``MAX_CONFIG_SIZE`` = 2**40 for any other size field), refused before it is built. The
            message names the field and the file.
    """
    raw, where = load_hf_config(config)
    f = HFFields(raw, where)
    model_type = raw.get("model_type")
    if model_type is None:
        raise f.error("model_type", "is required and absent: it picks the architecture.")
    if not isinstance(model_type, str):
        raise f.error("model_type", f"must be a string such as \"llama\", got {shown(model_type)}.")
    if model_type not in FAMILIES:
        raise f.error("model_type", f"= {shown(model_type)} is not supported{_multimodal_hint(raw)}; supported: "
                                    f"{', '.join(SUPPORTED_MODEL_TYPES)}.")
    family = FAMILIES[model_type]
    if include_mtp and not family.mtp:
        raise f.error("model_type", f"= {model_type!r} has no multi-token-prediction layers; include_mtp "
                                    f"applies to {', '.join(k for k, v in FAMILIES.items() if v.mtp)} only.")
    if family.defaults:
        raw = fill_defaults(raw)
        f = HFFields(raw, where)
    _check_honoured(f, model_type, family.reads)
    param_dtype = _config_dtype(f, dtype)
    if not isinstance(raw.get("_name_or_path", ""), (str, type(None))):
        raise f.error("_name_or_path", f"must be a string, got {shown(raw['_name_or_path'])}.")
    rows = family.build(f, include_mtp)
    if not f.flag("tie_word_embeddings", family.tie_default):
        rows.append(("lm_head.weight", (f.count("vocab_size"), f.count(family.width_key))))
    _check_total(f, rows)
    if name is None:
        name = raw.get("_name_or_path") or None
        if name is None and where != "config dict":
            path = Path(where)
            name = path.parent.name if path.name == "config.json" and path.parent.name else path.stem
        name = name or model_type
    return ModelSpec(str(name), tuple(ParamSpec(path, shape, param_dtype) for path, shape in rows))
