"""Issue 29 item 12: an explorer's export button saves its current view for a deck: every figure (and a pinned
copy) as SVG and PNG through kaleido's Chromium, and a markdown file whose call re-creates the view. Marked
``process``: kaleido starts Chromium."""

import re

import pytest

from workbench.views.memory_explorer import build_memory_explorer

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def drawn(fig) -> list:
    """The traces a widget draws (it keeps hidden spares after a model change): name, x and y."""
    return [(t.name, [list(level) for level in t.x] if t.type == "bar" else list(t.x), list(t.y))
            for t in fig.data if t.visible is not False]


def test_export_button_saves_the_view_with_the_call_that_re_creates_it(tmp_path):
    explorer = build_memory_explorer("gpt2", num_shards=(2, 8), seq_len=256)
    explorer.pin()
    for name, value in (("model", "qwen3-4b"), ("seq_len", 1024), ("fused_attention", True), ("num_shards", (4, 16))):
        explorer.controls[name].value = value
    explorer.export_folder.value = str(tmp_path / "deck")
    explorer.export_button.click()
    assert "Not exported" not in explorer.export_note.value, explorer.export_note.value
    (md,) = (tmp_path / "deck").glob("*.md")
    stem = md.stem
    assert stem.startswith("memory-qwen3-4b-N4-16-b1-s1024-"), stem  # named after the view
    for figure in ("memory-breakdown", "pinned-memory-breakdown"):
        svg, png = (tmp_path / "deck" / f"{stem}-{figure}.{fmt}" for fmt in ("svg", "png"))
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        title = "Memory per rank at the peak, " + ("4.02B" if figure.startswith("memory") else "124M")
        assert title in svg.read_text(), (figure, title)
    assert not list((tmp_path / "deck").glob(".*"))  # no temporary file left behind
    text = md.read_text()
    assert "It showed: N=16: ddp " in text  # the status line, as text
    assert explorer.pinned_code in text and "build_memory_explorer('gpt2'" in explorer.pinned_code
    (code,) = re.findall(r"```python\n(.*?)```", text, flags=re.S)[:1]
    scope: dict = {}
    exec(code, scope)
    again = scope["explorer"]
    assert again.code_line() == explorer.code_line()
    assert drawn(again.figure) == drawn(explorer.figure)
    assert again.status.value == explorer.status.value
