"""Framework adapters: the only modules that import MLX or JAX.

Import the one you need (``workbench.adapters.mlx`` or ``workbench.adapters.jax``);
importing this package imports neither framework.
"""
