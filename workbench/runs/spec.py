"""What defines a run: :class:`RunSpec`, validated before any engine starts, with errors naming the field.
"""

from __future__ import annotations

import copy
import math
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from workbench.core.checks import as_whole
from workbench.core.units import MiB
from workbench.runs.factory import check_data_file, data_sha256, resolve_factory, source_sha256
from workbench.models.init import LMConfig, lm_model_spec
from workbench.strategies import RUN_NAMES, get_strategy, strategies

STRATEGIES = RUN_NAMES  # what a run can be: the registered strategies some framework runs (workbench.strategies)


#: Fields added after runs were stored: :meth:`RunSpec.to_dict` leaves them out at these defaults,
#: so a run's id (a hash of its dict) and every stored record stay valid.
LATER_DEFAULTS = {"num_microbatches": 1, "defer_sync": True, "model_factory": None, "model_source_sha256": None,
                  "data": None, "data_dtype": None, "data_sha256": None, "num_replicas": 1}


HEX = set("0123456789abcdef")

DEFAULT_MODEL = dict(vocab_size=64, seq_len=32, dim=64, num_layers=2, num_heads=4, mlp_dim=128)


class FrozenModel(dict):
    """:attr:`RunSpec.model`: the caller's dict copied, then read-only, so the spec (and its run id) cannot
    change after validation. A plain ``dict`` to JSON, ``LMConfig(**model)`` and comparisons."""

    def _refuse(self, *args, **kwargs):
        raise TypeError("RunSpec.model is frozen; build a new spec: dataclasses.replace(spec, model={...}).")

    __setitem__ = __delitem__ = __ior__ = clear = pop = popitem = setdefault = update = _refuse

    def __reduce__(self):  # pickle and copy rebuild it whole (dict's default would set item by item)
        return (FrozenModel, (dict(self),))


def splits_into_groups(num_ranks: int, num_replicas: int) -> bool:
    """Whether HSDP's ``num_replicas`` splits ``num_ranks`` into 2 or more equal groups of 2 or more ranks."""
    return num_replicas >= 2 and num_ranks % num_replicas == 0 and num_ranks // num_replicas >= 2


def shard_groups(fields: Mapping[str, Any]) -> tuple[int, int]:
    """``(N, R)`` of a run's spec dict: the ranks its states are sharded over, and its replica groups (HSDP's; else 1).

    Raises:
        ValueError: replica groups a strategy without them, or a replicating strategy's R that does not split the
            ranks into groups of 2 or more (as :class:`RunSpec` refuses them).
    """
    replicas, ranks = fields.get("num_replicas", 1), fields["num_ranks"]
    if not (splits_into_groups(ranks, replicas) if get_strategy(fields["strategy"]).replicas else replicas == 1):
        raise ValueError(f"num_replicas={replicas!r} with strategy {fields['strategy']!r} on num_ranks={ranks}: "
                         "HSDP needs 2 or more groups of 2 or more ranks; other strategies have none")
    return ranks // replicas, replicas


@dataclass(frozen=True, kw_only=True)
class RunSpec:
    """One training run. Field names are what error messages and stored records use.

    The model is the built-in LM (``model``: its :class:`~workbench.models.init.LMConfig` fields), or
    the user's: ``model_factory="package.module:function"`` (the contract of ``examples/tiny_mlp_lm.py``),
    with ``model={"vocab_size": V, "seq_len": T}`` (the tokens it takes; its shapes come from the
    factory). ``model_source_sha256`` is filled in from the factory module's file, so the run id of a
    changed model changes. The data are the Markov chain, or ``data``: a token file
    (:func:`workbench.models.tokens.load_token_file`; ``data_dtype`` for a headerless ``.bin``).
    ``data_sha256`` is filled in from the file's bytes (:func:`~workbench.runs.factory.data_sha256`), so
    changed data is a new run, and a spec rebuilt from its dict (as every engine does) refuses a file that
    changed since: no rank trains on other data than the driver validated. ``num_replicas``: HSDP's replica groups
    (``hsdp-row``): each state is sharded over ``num_ranks / num_replicas`` consecutive ranks (a host's, as a
    launch places ranks host by host) and each shard's gradient all-reduced across the groups.
    """

    framework: str = "mlx"
    strategy: str = "ddp"
    num_ranks: int = 2
    steps: int = 200
    global_batch: int = 16
    model: dict = field(default_factory=lambda: dict(DEFAULT_MODEL))
    optimizer: str = "adamw"
    learning_rate: float = 3e-3
    weight_decay: float = 0.0
    precision: str = "float32"
    communication_size: int = 32 * MiB
    max_norm: float | None = None
    init_seed: int = 0
    data_seed: int = 0
    concentration: float = 0.1
    num_microbatches: int = 1
    defer_sync: bool = True
    model_factory: str | None = None
    model_source_sha256: str | None = None
    data: str | None = None
    data_dtype: str | None = None
    data_sha256: str | None = None
    num_replicas: int = 1

    def __post_init__(self) -> None:
        def bad(name: str, why: str) -> ValueError:
            return ValueError(f"RunSpec.{name}={getattr(self, name)!r}: {why}")

        if not isinstance(self.model, Mapping):
            raise bad("model", "must be a dict of LMConfig fields (vocab_size, seq_len, dim, ...)")
        object.__setattr__(self, "model", FrozenModel(copy.deepcopy(dict(self.model))))
        if self.framework not in ("mlx", "jax"):
            raise bad("framework", "choose 'mlx' or 'jax'")
        if self.strategy not in STRATEGIES:
            raise bad("strategy", f"unknown strategy; choose one of {', '.join(STRATEGIES)}" + (
                " (it is modelled, not run)" if self.strategy in {s.name for s in strategies()} else ""))
        try:
            get_strategy(self.strategy, framework=self.framework)
        except ValueError as err:
            raise bad("strategy", str(err)) from None
        for name, low in (("num_ranks", 1), ("steps", 1), ("global_batch", 1), ("num_microbatches", 1),
                          ("init_seed", 0), ("data_seed", 0), ("communication_size", None), ("num_replicas", 1)):
            # The one rule (core.checks.as_whole): NumPy integers count; only bytes may be written 32e6.
            whole = as_whole(getattr(self, name), magnitude=name == "communication_size")
            if whole is None or (low is not None and whole < low):
                raise bad(name, "must be an integer" + (f" >= {low}" if low is not None else ""))
            object.__setattr__(self, name, whole)
        if self.global_batch % self.num_ranks:
            raise bad("global_batch", f"must be divisible by num_ranks={self.num_ranks} (each rank takes an equal slice)")
        if self.global_batch % (self.num_ranks * self.num_microbatches):
            raise bad("num_microbatches", f"must divide each rank's batch of {self.global_batch // self.num_ranks} "
                                          f"(global_batch={self.global_batch} / num_ranks={self.num_ranks})")
        if not isinstance(self.defer_sync, bool):
            raise bad("defer_sync", "must be True (sync once per step) or False (sync every micro-batch)")
        if self.num_microbatches == 1:  # one micro-batch syncs once either way: one run, one id
            object.__setattr__(self, "defer_sync", True)
        record = get_strategy(self.strategy)
        if self.defer_sync and self.num_microbatches > 1 and not record.implementation(self.framework).defers_sync:
            raise bad("defer_sync", f"strategy {self.strategy!r} syncs in every micro-batch's backward (MLX's "
                                    "fully_shard reduce-scatters every unit in its custom VJP): it cannot defer the sync "
                                    f"to the last of num_microbatches={self.num_microbatches}; pass defer_sync=False")
        if record.replicas and not splits_into_groups(self.num_ranks, self.num_replicas):
            raise bad("num_replicas", f"strategy {self.strategy!r} shards within groups of num_ranks / num_replicas "
                                      f"ranks and replicates across the groups: num_replicas must be >= 2 and divide "
                                      f"num_ranks={self.num_ranks} into groups of at least 2 (else run fsdp-row or ddp)")
        if not record.replicas and self.num_replicas != 1:
            raise bad("num_replicas", f"strategy {self.strategy!r} has no replica groups; num_replicas applies to "
                                      f"{', '.join(s.name for s in strategies() if s.replicas and s.frameworks)} only")
        if self.optimizer not in ("sgd", "adamw"):
            raise bad("optimizer", "choose 'sgd' or 'adamw'")
        if self.precision not in ("float32", "bfloat16"):
            raise bad("precision", "choose 'float32' or 'bfloat16'")
        def real(name: str, low: float, *, strict: bool, optional: bool = False) -> None:
            value = getattr(self, name)
            if optional and value is None:
                return
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            if not ok or (value <= low if strict else value < low):
                raise bad(name, f"must be a finite number {'>' if strict else '>='} {low}" + (" or None" if optional else ""))

        real("learning_rate", 0, strict=True)
        real("max_norm", 0, strict=True, optional=True)
        real("weight_decay", 0, strict=False)
        real("concentration", 0, strict=True)
        if self._check_user_inputs():  # the shards of a user's model are checked by the driver, which builds it
            return
        config = self.config  # validates the model fields, naming them
        try:  # the strategy's shards must tile the model (FSDP layouts, ZeRO-3's rows, fully_shard's axis 0)
            record.check_model(lm_model_spec(config, self.precision), self.shard_group_size, self.communication_size)
        except ValueError as err:
            raise bad("strategy", str(err)) from None

    def _check_user_inputs(self) -> bool:
        """Validate ``model_factory``, ``model_source_sha256``, ``data``, ``data_dtype``, ``data_sha256``; True for
        a user model."""
        if self.model_source_sha256 is not None and self.model_factory is None:
            raise ValueError("RunSpec.model_source_sha256: only a run with model_factory has a model source")
        if self.data is None and self.data_dtype is not None:
            raise ValueError(f"RunSpec.data_dtype={self.data_dtype!r}: given without data (a token file)")
        if self.model_factory is not None:
            _, source = resolve_factory("model_factory", self.model_factory)
            digest = source_sha256(source)
            if self.model_source_sha256 is None:
                object.__setattr__(self, "model_source_sha256", digest)
            elif self.model_source_sha256 != digest:
                raise ValueError(f"RunSpec.model_source_sha256: {source} changed since this spec was made (a "
                                 "different model, so a different run: leave model_source_sha256 out to run it)")
            if set(self.model) != {"vocab_size", "seq_len"} or not all(
                    isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in self.model.values()):
                raise ValueError(f"RunSpec.model={dict(self.model)!r}: with model_factory, model holds exactly "
                                 "vocab_size and seq_len, integers >= 1 (the tokens the model takes; its shapes come "
                                 "from the factory)")
        seq_len = self.model.get("seq_len")
        if self.data_sha256 is not None and not (isinstance(self.data_sha256, str)
                                                 and len(self.data_sha256) == 64 and set(self.data_sha256) <= HEX):
            raise ValueError(f"RunSpec.data_sha256={self.data_sha256!r}: must be 64 hex digits (leave it out: it is "
                             "filled in from the token file)")
        if self.data is None:
            if self.data_sha256 is not None:
                raise ValueError("RunSpec.data_sha256: only a run with data (a token file) has a data digest (a "
                                 "spec copied with dataclasses.replace keeps it: pass data_sha256=None too)")
            return self.model_factory is not None
        if self.model_factory is None:
            seq_len = self.config.seq_len  # validates the LM's fields first
        if self.data_sha256 is not None and os.path.isfile(self.data):
            self.check_data_unchanged()
        check_data_file("data", self.data, self.data_dtype, seq_len)
        if self.data_sha256 is None:
            object.__setattr__(self, "data_sha256", data_sha256(self.data))
        return self.model_factory is not None

    def check_data_unchanged(self) -> None:
        """The token file ``data`` must still have the digest ``data_sha256`` (free while its size, times and
        inode are unchanged: :func:`~workbench.runs.factory.data_sha256`).

        Raises:
            ValueError: naming ``RunSpec.data_sha256`` and the file, if it is missing or its bytes changed.
        """
        try:
            digest, size = data_sha256(self.data), os.path.getsize(self.data)
        except OSError as err:
            raise ValueError(f"RunSpec.data_sha256: the token file {self.data} cannot be read any more ({err})") \
                from None
        if digest != self.data_sha256:
            raise ValueError(f"RunSpec.data_sha256: the token file {self.data} changed since this spec was made (now "
                             f"{size} bytes, sha256 {digest[:12]}..., not {self.data_sha256[:12]}...): other data, so "
                             "another run (leave data_sha256 out to run it; dataclasses.replace with other data "
                             "keeps the old digest: pass data_sha256=None too)")

    @property
    def config(self) -> LMConfig:
        if self.model_factory is not None:
            raise ValueError(f"RunSpec.config: a run of {self.model_factory} has no LMConfig (its model is the "
                             "factory's); model holds vocab_size and seq_len only")
        try:
            return LMConfig(**self.model)
        except TypeError as err:
            raise ValueError(f"RunSpec.model: {err}") from None

    @property
    def shard_group_size(self) -> int:
        """The ranks each state is sharded over: ``num_ranks``, or each replica group's under HSDP."""
        return self.num_ranks // self.num_replicas

    @property
    def micro_batch_size(self) -> int:
        """Sequences per rank in one micro-batch."""
        return self.global_batch // (self.num_ranks * self.num_microbatches)

    def to_dict(self) -> dict:
        """The spec as stored (and hashed into the run id); :data:`LATER_DEFAULTS` at their defaults are left out."""
        out = asdict(self)
        out["model"] = dict(out["model"])
        for name, default in LATER_DEFAULTS.items():
            if out[name] == default and type(out[name]) is type(default):
                del out[name]
        return out


#: The LM the validation runs use: model states dominate (13.7 MB of fp32 parameters; with 4
#: sequences per rank the activations stay below the step's transients), as in a real FSDP run.
VALIDATION_MODEL = dict(vocab_size=512, seq_len=32, dim=256, num_layers=4, num_heads=4, mlp_dim=1024)
