"""What nbval compares is what a reader sees: no raw float repr, no library serialisation detail.

Stored outputs are compared exactly by nbval. A float written with all 17 digits, plotly's base64
``bdata`` arrays, or a plotly built-in template embedded in every figure would all change with the
last bits of a computation or a library's version, failing a fresh install for no reason a reader
could see. These tests read every committed notebook and check each compared output.
"""

import json
import re
from pathlib import Path

import numpy as np
import pytest

from workbench.publish.notebook import FIGURE_DIGITS, reader_json
from workbench.views.style import TEMPLATE

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9]*.ipynb"))
PLOTLY = "application/vnd.plotly.v1+json"
#: A decimal written with more significant digits than any formatted output here shows.
MAX_TEXT_DIGITS = 8
DECIMAL = re.compile(r"(?<![\w.#])(\d+\.\d+)(?:[eE][-+]?\d+)?(?![\w.])")


def significant_digits(token: str) -> int:
    mantissa = token.split("e")[0].split("E")[0].replace(".", "").lstrip("0")
    return len(mantissa.rstrip("0")) if "." in token else len(mantissa)


def compared_outputs(path: Path):
    """(cell number, mimetype, value) of every output nbval compares in ``path``."""
    nb = json.loads(path.read_text())
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] != "code" or "NBVAL_IGNORE_OUTPUT" in "".join(cell["source"]):
            continue
        for out in cell.get("outputs", []):
            if out["output_type"] == "stream":
                yield i, "stream", "".join(out["text"])
            for mime, value in out.get("data", {}).items():
                if mime != "application/vnd.jupyter.widget-view+json":
                    yield i, mime, value if mime == PLOTLY else "".join(value)


def floats_in(value):
    if isinstance(value, dict):
        for k, v in value.items():
            yield from floats_in(v)
    elif isinstance(value, list):
        for v in value:
            yield from floats_in(v)
    elif isinstance(value, float):
        yield value


def keys_in(value):
    if isinstance(value, dict):
        for k, v in value.items():
            yield k
            yield from keys_in(v)
    elif isinstance(value, list):
        for v in value:
            yield from keys_in(v)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_compared_outputs_are_what_a_reader_sees(path):
    house_template = TEMPLATE.to_plotly_json()
    checked = 0
    for cell, mime, value in compared_outputs(path):
        checked += 1
        where = f"{path.name} cell {cell} ({mime})"
        if mime == PLOTLY:
            assert "bdata" not in set(keys_in(value)), f"{where}: base64 arrays, a plotly serialisation detail"
            assert value["layout"].get("template") == house_template, f"{where}: not the house template"
            for x in floats_in(value):
                assert float(f"{x:.{FIGURE_DIGITS}g}") == x, f"{where}: {x!r} has more than {FIGURE_DIGITS} digits"
        else:
            for token in DECIMAL.findall(value):
                assert significant_digits(token) <= MAX_TEXT_DIGITS, f"{where}: raw float repr {token!r}"
    assert checked, f"{path.name} has no compared output"


def test_the_checks_catch_what_broke_a_fresh_install():
    # The stored output that failed on a fresh machine: the 16th digit of an entropy rate.
    assert significant_digits("2.349219754437834") > MAX_TEXT_DIGITS
    assert DECIMAL.findall("rate 2.349219754437834 nats; 2.3492 shown; v1.2.3") == ["2.349219754437834", "2.3492"]
    assert significant_digits("3.200000e-08") == 2 and significant_digits("0.125") == 3


def test_reader_json_hides_the_last_bits_and_plotly_serialisation():
    a = {"y": np.array([2.349219754437834, 1.0]), "x": 2.349219754437834, "n": np.int64(7), "nan": float("nan")}
    b = {"y": np.array([2.3492197544378337, 1.0]), "x": 2.3492197544378337, "n": 7, "nan": np.nan}
    assert reader_json(a) == reader_json(b) == {"y": [2.34922, 1.0], "x": 2.34922, "n": 7, "nan": None}
    assert json.loads(json.dumps(reader_json(a))) == reader_json(a)  # plain JSON: no arrays, no bdata
    assert reader_json({"t": (1, "a", True)}) == {"t": [1, "a", True]}
    # plotly's own figure dicts hold numpy data as base64 typed arrays: decoded, then rounded.
    import plotly.graph_objects as go

    fig = go.Figure(go.Scatter(x=np.arange(3), y=np.array([[0.1 + 0.2, 1 / 3, 2.0]]).ravel()))
    trace = reader_json(fig.to_dict())["data"][0]
    assert trace["x"] == [0, 1, 2] and trace["y"] == [0.3, 0.333333, 2.0]
