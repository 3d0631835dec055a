"""Pure models: memory per rank per strategy and communication per step, and the published
cases they are checked against. Imports only :mod:`workbench.core`.
"""
