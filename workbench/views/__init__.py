"""Figures and controls: ``fig_*`` return plotly figures, ``build_*`` return widgets; no arithmetic.
"""
