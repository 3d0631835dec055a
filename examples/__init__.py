"""Small user models for the workbench: importable factories, one per framework, with the same weights.

A factory is what a run names as ``"examples.tiny_mlp_lm:mlx_factory"`` (``"package.module:function"``):
a function of no arguments returning the model and its loss. Copy one and change the model to bring your own.
"""
