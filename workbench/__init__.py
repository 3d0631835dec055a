"""FSDP Workbench: plan, estimate, run and compare fully sharded data-parallel training steps.

The core (specs, buckets, shards, units) needs only NumPy. Framework adapters live in
``workbench.adapters`` and import MLX or JAX only when called.
"""

from workbench.core.buckets import POLICIES, BucketPlan, BucketPolicy, plan_buckets
from workbench.core.shards import LAYOUTS, ShardPlan, ShardSlice, plan_shards
from workbench.core.specs import DTYPE_BYTES, ModelSpec, ParamSpec, canonical_dtype
from workbench.core.units import GiB, KiB, MiB, format_bytes, readable

__version__ = "0.1.0"

__all__ = [
    "DTYPE_BYTES", "GiB", "KiB", "LAYOUTS", "MiB", "POLICIES", "BucketPlan", "BucketPolicy",
    "ModelSpec", "ParamSpec", "ShardPlan", "ShardSlice", "canonical_dtype", "format_bytes",
    "plan_buckets", "plan_shards", "readable",
]
