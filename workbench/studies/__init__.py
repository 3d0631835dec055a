"""One module per notebook question: the tables and figures that answer it, from runs and models.
"""
