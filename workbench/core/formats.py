"""The output formats the workbench writes and reads by name: one definition for the kernel's views, the
notebooks' builder, the saved-in-JupyterLab snapshots and the slide deck."""

#: The mimetype of a plotly figure in a notebook output (JupyterLab's plotly extension draws it; no widget model).
PLOTLY_MIME = "application/vnd.plotly.v1+json"
#: The mimetype of a PNG image in a notebook output.
PNG_MIME = "image/png"
