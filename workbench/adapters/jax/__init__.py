"""JAX: model -> parameter spec, the FSDP / DDP / ZeRO-3 steps, gradient accumulation.

Only imported where JAX is in use (``import workbench`` never loads JAX).
"""
