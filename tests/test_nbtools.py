"""The main job's export: notebooks run headless and become HTML that needs no network."""

import re

import nbformat

from workbench.publish import nbtools


def small_notebook(path):
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("from workbench.publish.notebook import setup\nsettings = setup()"),
        nbformat.v4.new_code_cell("import plotly.graph_objects as go\ngo.Figure(go.Bar(x=[1, 2], y=[3, 4]))"),
        nbformat.v4.new_code_cell("go.Figure(go.Scatter(x=[1, 2], y=[5, 6], name='second'))"),
        nbformat.v4.new_code_cell("import ipywidgets\nipywidgets.IntSlider(3)"),
    ])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)
    return path


def test_build_embeds_plotlyjs_once_and_loads_nothing_remote(tmp_path):
    (result,) = nbtools.build_notebooks(tmp_path / "html", [small_notebook(tmp_path / "01_demo.ipynb")])
    html = result.html.read_text()
    assert len(re.findall(r"plotly\.js v\d", html)) == 1  # the library once, for both figures
    assert html.count("Plotly.newPlot") == 2
    assert not re.findall(r'<script[^>]+src="https?://', html)
    assert "application/vnd.jupyter.widget-state+json" not in html  # live widgets are not frozen in
    assert result.html_bytes == len(html.encode())


def test_refresh_keeps_outputs_nbval_compares_and_drops_widget_views(tmp_path):
    path = small_notebook(tmp_path / "demo.ipynb")
    nbtools.refresh_notebook(path)
    nb = nbformat.read(path, as_version=4)
    figure_outputs = [o for o in nb.cells[1].outputs if "application/vnd.plotly.v1+json" in o.get("data", {})]
    assert len(figure_outputs) == 1 and "text/html" not in figure_outputs[0]["data"]  # JSON only: deterministic
    assert nb.cells[3].outputs == [] and "widgets" not in nb.metadata
