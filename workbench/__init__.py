"""FSDP Workbench: plan, estimate, run and compare fully sharded data-parallel training steps.

The package is layered (lowest first; each layer imports only those before it):
``core`` (specs, presets, buckets, shards, units: NumPy only), ``estimate`` (memory and
communication models), ``models`` (the reference LM and data), ``adapters`` (the only code that
imports MLX or JAX), ``runs`` (what a run is, on disk), ``ranks`` (programs on one rank),
``launch`` (ipyparallel engines and the driver), ``views`` (figures and widgets), ``studies``
(one module per notebook question) and ``publish`` (build, slides, exports).

The planners are imported here; :class:`~workbench.runs.spec.RunSpec`, :func:`run_training` and
:func:`fsdp_apply_gradients` load on first use, so ``import workbench`` never imports MLX, JAX or
ipyparallel.
"""

import importlib

from workbench.core.buckets import POLICIES, BucketPlan, BucketPolicy, plan_buckets
from workbench.core.shards import LAYOUTS, ShardPlan, ShardSlice, plan_shards
from workbench.core.specs import DTYPE_BYTES, ModelSpec, ParamSpec, canonical_dtype
from workbench.core.units import GiB, KiB, MiB, format_bytes, readable

__version__ = "0.1.0"

#: Names loaded on first use: name -> the module that defines it.
LAZY = {"RunSpec": "workbench.runs.spec", "run_training": "workbench.launch.driver",
        "fsdp_apply_gradients": "workbench.adapters.mlx.fsdp"}

__all__ = [
    "DTYPE_BYTES", "GiB", "KiB", "LAYOUTS", "MiB", "POLICIES", "BucketPlan", "BucketPolicy",
    "ModelSpec", "ParamSpec", "ShardPlan", "ShardSlice", "canonical_dtype", "format_bytes",
    "plan_buckets", "plan_shards", "readable", *LAZY,
]


def __getattr__(name: str):
    if name in LAZY:
        return getattr(importlib.import_module(LAZY[name]), name)
    raise AttributeError(f"module 'workbench' has no attribute {name!r}")
