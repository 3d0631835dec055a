"""Stored notebooks in the form JupyterLab itself saves, so that opening one leaves it clean.

Issue 18: every notebook showed the unsaved-changes dot as soon as it opened. Saved back from Lab,
a stored notebook differed in two places, each written by Lab on opening:

* ``metadata.kernelspec``: when the kernel starts, Lab writes the running kernel's spec over the
  stored one (ipykernel's ``display_name`` is "Python 3 (ipykernel)"; ours said "Python 3");
* every plotly figure output: jupyterlab-plotly's renderer draws a figure that has no ``image/png``
  beside its JSON, then stores a PNG snapshot of it in the output. A figure that has one opens
  as that image and turns interactive when the pointer enters it.

:func:`save_as_lab_would` gives a notebook both, as Lab would; ``refresh_notebook`` calls it, and

    python -m workbench.publish.labsave notebooks/*.ipynb

applies it to stored notebooks without executing them (idempotent: a figure that has its PNG keeps it).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from workbench.core.formats import PLOTLY_MIME, PNG_MIME

#: The PNG snapshot's width in CSS pixels: JupyterLab's output area in a 1400 px window. Height: the
#: figure's own, else 360, jupyterlab-plotly's default.
SNAPSHOT_WIDTH, DEFAULT_HEIGHT = 968, 360


def kernelspec_metadata(name: str = "python3") -> dict:
    """``metadata.kernelspec`` as Lab writes it for the installed kernel ``name`` (name, display name, language)."""
    from jupyter_client.kernelspec import KernelSpecManager

    spec = KernelSpecManager().get_kernel_spec(name)
    return {"display_name": spec.display_name, "language": spec.language, "name": name}


def figures_without_snapshot(nb) -> list[dict]:
    """The outputs of ``nb`` holding a plotly figure and no PNG snapshot beside it."""
    return [out for cell in nb.cells for out in cell.get("outputs", [])
            if PLOTLY_MIME in out.get("data", {}) and PNG_MIME not in out["data"]]


def snapshot_pngs(figures: list[dict], *, width: int = SNAPSHOT_WIDTH) -> list[str]:
    """Each plotly figure dict as a base64 PNG, ``width`` CSS pixels wide at scale 1 (kaleido)."""
    import base64
    import warnings

    import kaleido
    import plotly.io as pio

    from workbench.core.chromium import chromium_for_kaleido

    if not figures:
        return []
    with chromium_for_kaleido(), tempfile.TemporaryDirectory() as tmp:  # no Chromium: find_chromium's message
        paths = [Path(tmp) / f"{k}.png" for k in range(len(figures))]
        kaleido.start_sync_server(silence_warnings=True)  # one Chromium for every figure
        try:
            for fig, path in zip(figures, paths):
                layout = fig.get("layout", {})
                with warnings.catch_warnings():  # plotly passes kaleido options a running server does not take
                    warnings.filterwarnings("ignore", "The kopts argument is ignored", UserWarning)
                    pio.write_image(fig, path, width=layout.get("width") or width,
                                    height=layout.get("height") or DEFAULT_HEIGHT, scale=1, validate=False)
        finally:
            kaleido.stop_sync_server(silence_warnings=True)
        return [base64.b64encode(path.read_bytes()).decode("ascii") for path in paths]


def save_as_lab_would(nb, *, kernel_name: str | None = None) -> int:
    """Give ``nb`` what Lab writes into a notebook it opens: the installed kernel's spec, and a PNG
    snapshot beside every plotly figure that has none. Returns the number of snapshots added."""
    name = kernel_name or nb.metadata.get("kernelspec", {}).get("name") or "python3"
    nb.metadata["kernelspec"] = kernelspec_metadata(name)
    outputs = figures_without_snapshot(nb)
    for out, png in zip(outputs, snapshot_pngs([dict(out["data"][PLOTLY_MIME]) for out in outputs])):
        out["data"][PNG_MIME] = png
    return len(outputs)


def normalise_notebook(path: Path) -> int:
    """Rewrite the notebook file ``path`` as :func:`save_as_lab_would` makes it (only if that changes it);
    returns the number of figure snapshots added."""
    import nbformat

    from workbench.runs.atomic import write_atomic

    path = Path(path)
    nb = nbformat.read(path, as_version=4)
    added = save_as_lab_would(nb)
    text = nbformat.writes(nb) + "\n"
    if text != path.read_text(encoding="utf-8"):
        write_atomic(path, text)  # a full disk leaves the notebook as it was
    return added


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m workbench.publish.labsave NOTEBOOK.ipynb ...", file=sys.stderr)
        return 2
    for arg in argv:
        print(f"{arg}: {normalise_notebook(Path(arg))} figure snapshots added")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
