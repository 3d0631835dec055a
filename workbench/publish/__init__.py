"""Notebook execution, the build, and the exported deck and static pages.
"""
