"""MLX: model -> parameter spec, the FSDP / DDP / ZeRO-3 steps, gradient accumulation.

Only imported where MLX is in use (``import workbench`` never loads MLX).
"""
