"""Small reference models, identical in MLX and JAX, for training-step experiments.

The config and seeded weights (:mod:`workbench.models.init`) need only NumPy; the
framework modules (:mod:`workbench.models.mlx_lm`, :mod:`workbench.models.jax_lm`, its NNX module
:mod:`workbench.models.jax_nnx`)
import MLX or JAX and are loaded only when imported by name.
"""

from workbench.models.init import LMConfig, init_lm_params, lm_param_shapes, num_params

__all__ = ["LMConfig", "init_lm_params", "lm_param_shapes", "num_params"]
