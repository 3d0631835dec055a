"""Pure plans: parameter specs, architecture presets, bucket and shard planning, units.

Standard library and NumPy only; the lowest layer, importing no other part of the workbench.
"""
