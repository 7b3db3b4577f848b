"""What a run leaves behind, made from its workdir: sample grids (sampling.py), a
SavedModel for serving (export.py), `.keras` files (keras_io.py), plots of its scores
(plot.py)."""
