"""What a run is: its validated spec, its record on disk, and the estimate made from the same spec.
"""
