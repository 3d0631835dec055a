"""ipyparallel: a pure launch plan -> engines -> the driver that runs and records a run.
"""
