"""Checked reads of one Hugging Face ``config.json``, and the parameter rows every shape builder makes.

:class:`HFFields` reads a config's fields with the bounds of :mod:`workbench.core.checks` (a layer
count past ``MAX_NUM_LAYERS``, an expert count past ``MAX_NUM_EXPERTS``, any other size past
``MAX_CONFIG_SIZE``, a list of rows past ``MAX_NUM_ARRAYS``): every error is a ``ValueError`` naming
the field and the file. :func:`linear`, :func:`norm` and :func:`glu` give the ``(path, shape)`` rows
of ``nn.Linear`` (``(out_features, in_features)``), RMSNorm and gated-MLP modules, in the order the
``transformers`` module's ``__init__`` assigns them. Used by :mod:`workbench.core.hf_families` and
:mod:`workbench.core.hf_mla`.

The workbench core only.
"""

from __future__ import annotations

from collections.abc import Mapping

from workbench.core.checks import MAX_CONFIG_SIZE, as_whole, MAX_NUM_ARRAYS, MAX_NUM_EXPERTS, MAX_NUM_LAYERS, BoundedList, shown

__all__ = ["HFFields", "Rows", "attention_dims", "glu", "linear", "norm"]

#: ``(path, shape)`` of every parameter, in ``named_parameters()`` order.
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
        whole = as_whole(value)
        if whole is None or not minimum <= whole <= maximum:
            raise self.error(key, f"must be an integer from {minimum} to {maximum:,}, got {shown(value)}.")
        self.counts[key] = whole
        return whole

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


def linear(path: str, out_features: int, in_features: int, bias: bool = False) -> Rows:
    """An ``nn.Linear``: ``path.weight`` ``(out_features, in_features)``, then ``path.bias`` ``(out_features,)``."""
    rows: Rows = [(path + ".weight", (out_features, in_features))]
    return rows + [(path + ".bias", (out_features,))] if bias else rows


def norm(path: str, dim: int) -> Rows:
    """An RMSNorm: ``path.weight`` ``(dim,)``."""
    return [(path + ".weight", (dim,))]


def glu(prefix: str, d: int, f: int, names: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj"),
         bias: bool = False) -> Rows:
    """A gated MLP: gate (f, d), up (f, d), down (d, f); Mixtral names them w1, w3, w2 (in the order w1, w2, w3)."""
    shapes = {"gate_proj": (f, d), "up_proj": (f, d), "down_proj": (d, f), "w1": (f, d), "w2": (d, f), "w3": (f, d)}
    return [row for n in names for row in linear(prefix + n, shapes[n][0], shapes[n][1], bias)]


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
