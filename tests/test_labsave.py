"""Stored notebooks in the form JupyterLab saves (issue 18: every notebook opened with the unsaved-changes dot).

The browser side (a stored notebook opened in a real JupyterLab stays clean) is
``tests/test_browser.py::test_stored_notebooks_open_in_jupyterlab_without_the_unsaved_changes_dot``.
"""

import base64
import struct

import nbformat
import pytest

from workbench.publish import labsave

PLOTLY = labsave.PLOTLY_MIME


def notebook_with_figures(path):
    fig = {"data": [{"type": "bar", "x": [1, 2], "y": [3, 4]}], "layout": {"title": {"text": "two bars"}}}
    tall = {"data": [{"type": "scatter", "x": [1, 2], "y": [5, 6]}], "layout": {"height": 500}}
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("# A question"),
        nbformat.v4.new_code_cell("fig", outputs=[nbformat.v4.new_output("display_data", data={PLOTLY: fig})]),
        nbformat.v4.new_code_cell("tall", outputs=[nbformat.v4.new_output("execute_result", data={PLOTLY: tall},
                                                                          execution_count=2)]),
        nbformat.v4.new_code_cell("print(1)", outputs=[nbformat.v4.new_output("stream", text="1\n")]),
    ])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)
    return path


def png_size(b64: str) -> tuple[int, int]:
    head = base64.b64decode(b64)[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", head[16:24])


def test_the_kernelspec_is_the_one_lab_writes_when_the_kernel_starts():
    from jupyter_client.kernelspec import KernelSpecManager

    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    assert labsave.save_as_lab_would(nb) == 0  # no figure: no Chromium needed
    spec = KernelSpecManager().get_kernel_spec("python3")
    assert nb.metadata["kernelspec"] == {"name": "python3", "display_name": spec.display_name, "language": "python"}


def test_every_figure_gets_a_png_snapshot_once_and_nothing_else_changes(tmp_path):
    from workbench.publish import static

    try:
        static.find_chromium()
    except FileNotFoundError as err:
        pytest.skip(str(err))
    path = notebook_with_figures(tmp_path / "figures.ipynb")
    before = nbformat.read(path, as_version=4)
    assert labsave.normalise_notebook(path) == 2
    after = nbformat.read(path, as_version=4)
    figures = [(c, o) for c, cell in enumerate(after.cells) for o, out in enumerate(cell.get("outputs", []))
               if PLOTLY in out.get("data", {})]
    assert [png_size(after.cells[c].outputs[o]["data"][labsave.PNG_MIME]) for c, o in figures] == [
        (labsave.SNAPSHOT_WIDTH, labsave.DEFAULT_HEIGHT), (labsave.SNAPSHOT_WIDTH, 500)]
    for c, o in figures:  # the figure itself is left as it was
        assert after.cells[c].outputs[o]["data"][PLOTLY] == before.cells[c].outputs[o]["data"][PLOTLY]
        del after.cells[c].outputs[o]["data"][labsave.PNG_MIME]
    assert after.metadata.kernelspec["display_name"] != "Python 3"
    after.metadata.kernelspec = before.metadata.kernelspec
    assert after == before  # nothing else changed
    text = path.read_text()
    assert labsave.normalise_notebook(path) == 0 and path.read_text() == text  # idempotent: the file is untouched


def test_refresh_stores_notebooks_as_lab_saves_them(tmp_path):
    """The source of stored notebooks, ``python -m workbench refresh``, writes the form Lab saves."""
    from jupyter_client.kernelspec import KernelSpecManager

    from workbench.publish import nbtools, static

    try:
        static.find_chromium()
    except FileNotFoundError as err:
        pytest.skip(str(err))
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "from workbench.publish.notebook import setup\nsettings = setup()\n"
        "import plotly.graph_objects as go\ngo.Figure(go.Bar(x=[1, 2], y=[3, 4]))")])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path = tmp_path / "demo.ipynb"
    nbformat.write(nb, path)
    nbtools.refresh_notebook(path)
    stored = nbformat.read(path, as_version=4)
    (figure,) = [out for out in stored.cells[0].outputs if PLOTLY in out.get("data", {})]
    assert png_size(figure["data"][labsave.PNG_MIME])[0] == labsave.SNAPSHOT_WIDTH
    assert stored.metadata.kernelspec["display_name"] == KernelSpecManager().get_kernel_spec("python3").display_name
    text = path.read_text()
    assert labsave.normalise_notebook(path) == 0 and path.read_text() == text  # already in Lab's form
