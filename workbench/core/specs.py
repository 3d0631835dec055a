"""Parameter specs: what a planner needs to know about a model, and nothing more.

A :class:`ParamSpec` is one array of a model by path, shape and dtype. A
:class:`ModelSpec` is the ordered collection of them, in the order the framework
flattens the model (``mlx.utils.tree_flatten`` for MLX, ``jax.tree_util`` for
JAX), which is the order bucket planners walk.

Pure: standard library and NumPy only. Framework adapters (``workbench.adapters``)
and architecture presets (``workbench.core.presets``) build these.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Mapping, Sequence

import numpy as np

from workbench.core.checks import as_whole

#: Bytes per element of every dtype the workbench knows, by canonical name.
DTYPE_BYTES: dict[str, int] = {
    "float64": 8,
    "float32": 4,
    "bfloat16": 2,
    "float16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "complex64": 8,
    "int64": 8,
    "int32": 4,
    "int16": 2,
    "int8": 1,
    "uint64": 8,
    "uint32": 4,
    "uint16": 2,
    "uint8": 1,
    "bool": 1,
}

_DTYPE_ALIASES = {
    "fp64": "float64",
    "double": "float64",
    "fp32": "float32",
    "float": "float32",
    "bf16": "bfloat16",
    "fp16": "float16",
    "half": "float16",
    "bool_": "bool",
}


def canonical_dtype(dtype: object, path: str | None = None) -> str:
    """Return the canonical name of ``dtype`` (e.g. ``"bfloat16"``).

    Accepts a name (``"bf16"``, ``"float32"``), a NumPy dtype, an MLX dtype
    (``mlx.core.bfloat16`` prints as ``"mlx.core.bfloat16"``) or a JAX dtype.

    Raises:
        ValueError: if the dtype is unknown; the message names ``path``.
    """
    name = getattr(dtype, "name", None)
    if not isinstance(name, str):
        name = str(dtype)
    name = name.rsplit(".", 1)[-1].strip().lower()
    name = _DTYPE_ALIASES.get(name, name)
    if name not in DTYPE_BYTES:
        where = f" of parameter '{path}'" if path else ""
        raise ValueError(
            f"Unknown dtype {dtype!r}{where}; known dtypes: {', '.join(sorted(DTYPE_BYTES))}."
        )
    return name


@dataclass(frozen=True)
class ParamSpec:
    """One parameter array of a model.

    Attributes:
        path: Dotted path, e.g. ``"model.layers.3.self_attn.q_proj.weight"``.
        shape: Array shape, a tuple of non-negative ints (``()`` for a scalar).
        dtype: Canonical dtype name (see :data:`DTYPE_BYTES`).
    """

    path: str
    shape: tuple[int, ...]
    dtype: str = "float32"

    def __post_init__(self) -> None:
        if not isinstance(self.path, str) or not self.path:
            raise ValueError(f"Parameter path must be a non-empty string, got {self.path!r}.")
        # int() would turn 2.7 into 2, True into 1 and the string "12" into (1, 2): refuse instead.
        dims = self.shape
        if isinstance(dims, (str, bytes)) or not isinstance(dims, (Sequence, np.ndarray)) or any(
                as_whole(d) is None for d in dims):
            raise ValueError(f"Parameter '{self.path}' has a shape that is not a sequence of ints: {self.shape!r}.")
        shape = tuple(as_whole(d) for d in dims)
        if any(d < 0 for d in shape):
            raise ValueError(f"Parameter '{self.path}' has a negative dimension in shape {shape}.")
        object.__setattr__(self, "dtype", canonical_dtype(self.dtype, self.path))
        if math.prod(shape) * DTYPE_BYTES[self.dtype] >= 2**63:  # sizes are int64 (np.prod would wrap around)
            raise ValueError(f"Parameter '{self.path}' with shape {shape} has {math.prod(shape):,} elements: "
                             f"its bytes do not fit in int64.")
        object.__setattr__(self, "shape", shape)

    @property
    def size(self) -> int:
        """Number of elements (a Python int)."""
        return math.prod(self.shape)

    @property
    def itemsize(self) -> int:
        """Bytes per element."""
        return DTYPE_BYTES[self.dtype]

    @property
    def nbytes(self) -> int:
        """Bytes of the whole array."""
        return self.size * self.itemsize


@dataclass(frozen=True)
class ModelSpec:
    """The ordered parameters of a model.

    Attributes:
        name: A label for figures and run records.
        params: The parameters, in the framework's flatten order.

    Raises:
        ValueError: on a duplicate path (named in the message), or on parameters whose bytes in all
            do not fit in int64 (planners sum and offset bytes as int64; each array alone is checked
            by :class:`ParamSpec`).
    """

    name: str
    params: tuple[ParamSpec, ...]
    _sizes: np.ndarray = field(init=False, repr=False, compare=False)
    _itemsizes: np.ndarray = field(init=False, repr=False, compare=False)
    _num_params: int = field(init=False, repr=False, compare=False)
    _nbytes: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        params = tuple(self.params)
        for p in params:
            if not isinstance(p, ParamSpec):
                raise ValueError(f"ModelSpec '{self.name}' holds {p!r}, which is not a ParamSpec.")
        seen: dict[str, int] = {}
        for i, p in enumerate(params):
            if p.path in seen:
                raise ValueError(
                    f"Duplicate parameter path '{p.path}' in model '{self.name}' "
                    f"(positions {seen[p.path]} and {i}, shapes {params[seen[p.path]].shape} and {p.shape})."
                )
            seen[p.path] = i
        sizes = [p.size for p in params]
        nbytes = sum(size * p.itemsize for size, p in zip(sizes, params))  # Python ints: exact past 2**63
        if nbytes >= 2**63:
            raise ValueError(f"ModelSpec '{self.name}' holds {nbytes:,} bytes in {len(params):,} parameters: the total "
                             f"does not fit in int64 (at most {2**63 - 1:,}), in which planners sum bytes.")
        object.__setattr__(self, "_num_params", sum(sizes))
        object.__setattr__(self, "_nbytes", nbytes)
        object.__setattr__(self, "params", params)
        object.__setattr__(self, "_sizes", np.array(sizes, dtype=np.int64))
        object.__setattr__(self, "_itemsizes", np.array([p.itemsize for p in params], dtype=np.int64))

    @classmethod
    def from_shapes(
        cls,
        shapes: Mapping[str, Sequence[int] | tuple[Sequence[int], object]],
        name: str = "model",
        dtype: object = "float32",
    ) -> "ModelSpec":
        """Build a spec from ``{path: shape}`` or ``{path: (shape, dtype)}``, in mapping order.

        Raises:
            ValueError: ``shapes`` is not a mapping, or an entry is neither form (naming its path).
        """
        if not isinstance(shapes, Mapping):
            raise ValueError(f"ModelSpec.from_shapes takes a mapping {{path: shape}} or {{path: (shape, dtype)}}, "
                             f"got {type(shapes).__name__}.")
        params = []
        for path, value in shapes.items():
            if isinstance(value, tuple) and len(value) == 2 and not isinstance(value[1], (int, np.integer)):
                shape, dt = value
                if isinstance(shape, (int, np.integer)):
                    raise ValueError(f"Parameter '{path}': {value!r} reads as (shape, dtype) with shape {shape!r}; "
                                     f"write the shape as a tuple, e.g. (({shape},), {dt!r}).")
            else:
                shape, dt = value, dtype
            params.append(ParamSpec(path, shape if isinstance(shape, (str, bytes)) else tuple(shape), dt))
        return cls(name, tuple(params))

    def __len__(self) -> int:
        return len(self.params)

    def __iter__(self) -> Iterator[ParamSpec]:
        return iter(self.params)

    def __getitem__(self, index: int) -> ParamSpec:
        return self.params[index]

    @property
    def paths(self) -> list[str]:
        return [p.path for p in self.params]

    @property
    def sizes(self) -> np.ndarray:
        """Elements per parameter, int64 array (read-only view)."""
        view = self._sizes.view()
        view.flags.writeable = False
        return view

    @property
    def itemsizes(self) -> np.ndarray:
        """Bytes per element per parameter, int64 array (read-only view)."""
        view = self._itemsizes.view()
        view.flags.writeable = False
        return view

    @property
    def num_params(self) -> int:
        """Total number of elements (the model's parameter count), summed in Python ints."""
        return self._num_params

    @property
    def nbytes(self) -> int:
        """Total bytes of all parameters, summed in Python ints (below 2**63 by construction)."""
        return self._nbytes

    def with_dtype(self, dtype: object) -> "ModelSpec":
        """The same shapes, every parameter in ``dtype``."""
        return ModelSpec(self.name, tuple(ParamSpec(p.path, p.shape, dtype) for p in self.params))

    def select(self, predicate) -> "ModelSpec":
        """The parameters for which ``predicate(param)`` is true, order kept."""
        return ModelSpec(self.name, tuple(p for p in self.params if predicate(p)))


def spec_from_flat(items: Iterable[tuple[str, Sequence[int], object]], name: str = "model") -> ModelSpec:
    """Build a spec from ``(path, shape, dtype)`` triples, in order (used by the adapters)."""
    return ModelSpec(name, tuple(ParamSpec(path, tuple(shape), dtype) for path, shape, dtype in items))
