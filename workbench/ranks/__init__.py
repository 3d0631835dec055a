"""Programs that run on one rank: the training job, probes, and the checks started with
``python -m workbench.ranks.<name>``.
"""
