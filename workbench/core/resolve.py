"""A model argument that takes a config wherever a preset name goes.

Every function that asks for "a model" accepts any of: a preset name (a key of
:data:`~workbench.core.presets.PRESETS`), a Hugging Face ``config.json`` path or a folder
holding one, the dict such a file holds, an :class:`~workbench.core.architecture.ArchitectureConfig`,
or (for :func:`resolve_spec` only) a ready :class:`~workbench.core.specs.ModelSpec`. These two
functions turn that argument into what the caller needs; errors name the caller's argument.

Standard library and the workbench core only.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from workbench.core.architecture import ArchitectureConfig, architecture_from_hf_config
from workbench.core.checks import shown
from workbench.core.hf_config import spec_from_hf_config
from workbench.core.presets import PRESETS, build_spec, list_presets
from workbench.core.specs import ModelSpec

__all__ = ["DEFAULT_DTYPE", "ModelArg", "resolve_architecture", "resolve_spec"]

#: The dtype of a preset or an :class:`ArchitectureConfig` when none is given (a config.json
#: brings its own ``torch_dtype``).
DEFAULT_DTYPE = "bfloat16"

#: What a model argument may be.
ModelArg = str | os.PathLike | Mapping[str, object] | ArchitectureConfig | ModelSpec


def _config_source(model: object, argument: str) -> str | os.PathLike | Mapping[str, object] | None:
    """``model`` if it is a config (a dict, or an existing path), ``None`` if it is a preset name.

    Raises:
        ValueError: on a string that is neither a preset nor an existing path, or a path that does not exist.
    """
    if isinstance(model, Mapping):
        return model
    if isinstance(model, str) and model in PRESETS:
        return None
    if isinstance(model, (str, os.PathLike)):
        path = Path(model)
        try:
            if path.is_file() or (path.is_dir() and (path / "config.json").is_file()):
                return model
        except OSError as err:  # a name too long, or a folder that may not be searched
            raise ValueError(f"{argument}: {shown(str(path))} cannot be read ({err.strerror or err}).") from err
        if path.is_dir():
            raise ValueError(f"{argument}: the folder {str(path)!r} holds no config.json.")
        if isinstance(model, str) and not (model.endswith(".json") or os.sep in model or "/" in model):
            raise ValueError(f"{argument}: {model!r} is neither a preset (known: {', '.join(list_presets())}) "
                             "nor an existing config.json path.")
        raise ValueError(f"{argument}: no such config file {str(path)!r}.")
    raise ValueError(f"{argument}: expected a preset name, a config.json path or folder, a config dict, an "
                     f"ArchitectureConfig or a ModelSpec; got {type(model).__name__}.")


def resolve_spec(model: ModelArg, *, dtype: object = None, argument: str = "model") -> ModelSpec:
    """The parameter spec of a model argument.

    Args:
        model: A preset name, a ``config.json`` path or folder, a config dict, an
            :class:`ArchitectureConfig` or a :class:`ModelSpec`.
        dtype: Element type of every parameter. ``None``: :data:`DEFAULT_DTYPE` for a preset or an
            ``ArchitectureConfig``, the config's ``torch_dtype`` for a config (float32 with a warning if it
            has none, as transformers builds it),
            a ``ModelSpec``'s own dtypes.
        argument: The caller's parameter name, for error messages.

    Returns:
        The spec, built by :func:`~workbench.core.hf_config.spec_from_hf_config` for every kind but a
        ready ``ModelSpec``.

    Raises:
        ValueError: on a string that is neither a preset nor an existing path, a config that does not
            build, or an unknown dtype; the message starts with ``argument``.
    """
    if isinstance(model, ModelSpec):
        return model if dtype is None else model.with_dtype(dtype)
    try:
        if isinstance(model, ArchitectureConfig):
            return build_spec(model, DEFAULT_DTYPE if dtype is None else dtype)
        source = _config_source(model, argument)
        if source is None:
            return build_spec(PRESETS[model], DEFAULT_DTYPE if dtype is None else dtype)  # type: ignore[index]
        return spec_from_hf_config(source, dtype=dtype)
    except ValueError as err:
        if str(err).startswith(f"{argument}:"):
            raise
        raise ValueError(f"{argument}: {err}") from err


def resolve_architecture(model: ModelArg, *, argument: str = "model") -> ArchitectureConfig:
    """The named numbers (hidden size, heads, layers, experts...) of a model argument.

    For what needs more than shapes: activation memory, FLOPs, the memory explorer.

    Args:
        model: A preset name, a ``config.json`` path or folder, a config dict, or an
            :class:`ArchitectureConfig` (returned as is). A :class:`ModelSpec` is refused: it holds
            shapes only.
        argument: The caller's parameter name, for error messages.

    Raises:
        ValueError: on a ``ModelSpec``, an unknown name or path, or a config from which a number
            cannot be derived; the message starts with ``argument`` and names the field.
    """
    if isinstance(model, ArchitectureConfig):
        return model
    if isinstance(model, ModelSpec):
        raise ValueError(f"{argument}: the ModelSpec {model.name!r} holds parameter shapes only, not hidden size, "
                         "heads or layers; pass a preset name, a config.json path or a config dict.")
    try:
        source = _config_source(model, argument)
        return PRESETS[model] if source is None else architecture_from_hf_config(source)  # type: ignore[index]
    except ValueError as err:
        if str(err).startswith(f"{argument}:"):
            raise
        raise ValueError(f"{argument}: {err}") from err
