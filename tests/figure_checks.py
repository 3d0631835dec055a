"""What a person checks on a drawn plotly figure, measured in a real browser (no pixel comparison).

:data:`INSPECT` runs in the page on a plotly graph div and returns its box, every visible text
element of the figure with its box and role, and every table cell. :func:`problems` turns that
into sentences: text outside the figure's box, two labels on top of each other, an empty table
cell, a clipped table. Used by ``test_browser.py`` on static pages and in JupyterLab.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

#: Returns ``{box, texts: [{text, role, box}], cells: [{text, box}], tables: [{box, clip}], traces, drawn}``.
INSPECT = r"""gd => {
    const r = e => { const b = e.getBoundingClientRect();
                     return {x0: b.left, y0: b.top, x1: b.right, y1: b.bottom}; };
    const role = e => {
        for (const [sel, name] of [['.gtitle', 'title'], ['.g-gtitle', 'title'], ['.xtitle', 'axis title'],
                ['.ytitle', 'axis title'], ['.legend', 'legend'], ['.annotation', 'annotation'],
                ['.xtick', 'tick'], ['.ytick', 'tick'], ['.x2tick', 'tick'], ['.y2tick', 'tick'],
                ['.table', 'table'], ['.textpoint', 'point label'], ['.bartext', 'bar label'],
                ['.multicategory', 'tick']]) {
            if (e.closest(sel)) return name;
        }
        return e.closest('[class]') ? e.closest('[class]').getAttribute('class') : 'text';
    };
    const texts = Array.from(gd.querySelectorAll('svg text'))
        .filter(e => !e.closest('.hoverlayer') && !e.closest('.modebar') && e.textContent.trim() !== ''
                     && getComputedStyle(e).visibility !== 'hidden' && getComputedStyle(e).display !== 'none'
                     && e.getAttribute('opacity') !== '0' && e.getBBox().width > 0)
        .map(e => { const turn = /rotate\(\s*(-?[\d.]+)/.exec(e.getAttribute('transform') || '');
                    const local = e.getBBox();
                    return {text: e.textContent, role: role(e), box: r(e), angle: turn ? Number(turn[1]) : 0,
                            w: local.width, h: local.height}; });
    const cells = Array.from(gd.querySelectorAll('g.table g.column-cell')).map(c => {
        const texts = Array.from(c.querySelectorAll('text')).filter(t => t.textContent.trim() !== '');
        const rect = c.querySelector('rect');
        return {text: texts.map(t => t.textContent).join(' ').trim(), box: rect ? r(rect) : r(c),
                textBoxes: texts.map(r)};
    });
    const tables = Array.from(gd.querySelectorAll('g.table')).map(t => ({box: r(t), clip: null}));
    const host = gd.closest('section, .jp-OutputArea-output, .widget-vbox, .slides section') || gd.parentElement;
    // Drawn line traces, their points to 3 significant digits (closer than that, two lines are one on screen).
    const round = v => typeof v === 'number' ? Number(v.toPrecision(3)) : v;
    const lines = (gd._fullData || []).filter(t => t.visible === true && t.type === 'scatter' && /lines/.test(t.mode || ''))
        .map(t => ({name: t.name, dash: (t.line || {}).dash || 'solid', axes: t.xaxis + t.yaxis,
                    points: JSON.stringify([Array.from(t.x || []).map(round), Array.from(t.y || []).map(round)])}));
    const axes = Object.keys(gd._fullLayout || {}).filter(k => /^[xy]axis\d*$/.test(k)).map(k => {
        const a = gd._fullLayout[k];
        return {name: k, title: (a.title && a.title.text) || '', ticks: (a._vals || []).map(v => v.text)}; });
    const bars = Array.from(gd.querySelectorAll('.barlayer .point path')).map(r).filter(b => b.x1 - b.x0 > 0 && b.y1 - b.y0 > 0);
    const legend = gd.querySelector('.legend .bg');
    return {box: r(gd), container: r(host), texts, cells, tables, lines, axes, bars, legend: legend ? r(legend) : null,
            traces: (gd.data || []).filter(t => t.visible !== false).length,  // hidden: a widget's spare trace slots
            drawn: gd.querySelectorAll('.cartesianlayer g.trace, g.table').length,
            modebar: Array.from(gd.querySelectorAll('.modebar-btn')).map(b => b.getAttribute('data-title'))};
}"""


def overlaps(a: dict, b: dict, slack: float = 1.0) -> bool:
    return (min(a["x1"], b["x1"]) - max(a["x0"], b["x0"]) > slack
            and min(a["y1"], b["y1"]) - max(a["y0"], b["y0"]) > slack)


def centre(box: dict) -> tuple[float, float]:
    """The centre of a box: also the centre of the turned text whose upright box it is."""
    return (box["x0"] + box["x1"]) / 2, (box["y0"] + box["y1"]) / 2


def collide(a: dict, b: dict, slack: float = 1.0) -> bool:
    """Two texts on each other. Texts turned by the same angle (tick labels at 30 degrees) are compared in
    their own frame: their upright boxes overlap where the turned letters do not."""
    if a.get("angle") and a.get("angle") == b.get("angle"):
        t = math.radians(a["angle"])
        (ax, ay), (bx, by) = centre(a["box"]), centre(b["box"])
        dx, dy = bx - ax, by - ay
        along, across = dx * math.cos(t) + dy * math.sin(t), -dx * math.sin(t) + dy * math.cos(t)
        return ((a["w"] + b["w"]) / 2 - abs(along) > slack) and ((a["h"] + b["h"]) / 2 - abs(across) > slack)
    return overlaps(a["box"], b["box"], slack)


def covered(t: dict, box: dict, slack: float = 4.0) -> bool:
    """``box`` (a legend) lies on text ``t`` by more than ``slack`` px (a text's box includes its line's
    spacing: a legend just under an axis title touches it); a turned text by its centre line."""
    if not t.get("angle"):
        return overlaps(t["box"], box, slack)
    a = math.radians(t["angle"])
    cx, cy = centre(t["box"])
    points = [(cx + s * t["w"] / 2 * math.cos(a), cy + s * t["w"] / 2 * math.sin(a)) for s in (k / 4 - 1 for k in range(9))]
    return any(box["x0"] + 1 < x < box["x1"] - 1 and box["y0"] + 1 < y < box["y1"] - 1 for x, y in points)


def inside(inner: dict, outer: dict, slack: float = 1.0) -> bool:
    return (inner["x0"] >= outer["x0"] - slack and inner["y0"] >= outer["y0"] - slack
            and inner["x1"] <= outer["x1"] + slack and inner["y1"] <= outer["y1"] + slack)


#: Words a figure uses to say that lines lie on each other (then drawing them alike is honest).
SAYS_COINCIDE = ("coincide", "identical", "on top of each other", "hidden under")
#: An axis of whole steps (not "step time").
STEP_AXIS = re.compile(r"\bsteps?\b(?!\s*time)", re.I)


def hidden_lines(name: str, seen: dict) -> list[str]:
    """Two drawn lines with the same points and dash pattern (one hides the other), unless the figure says so."""
    said = " ".join(t["text"] for t in seen["texts"]).lower()
    out, lines = [], seen.get("lines", [])
    for i, a in enumerate(lines):
        for b in lines[i + 1:]:
            if a["axes"] == b["axes"] and a["points"] == b["points"] and a["dash"] == b["dash"] \
                    and not any(word in said for word in SAYS_COINCIDE):
                out.append(f"{name}: line {b['name']!r} hides under {a['name']!r} (same points, same dash, not said)")
    return out


def fractional_steps(name: str, seen: dict) -> list[str]:
    """Tick labels of a step axis that are not whole numbers ("0.5, 1.5")."""
    out = []
    for axis in seen.get("axes", []):
        if STEP_AXIS.search(axis["title"]):
            bad = [t for t in axis["ticks"] if re.fullmatch(r"[-−]?\d*\.\d+", t.replace(",", ""))]
            if bad:
                out.append(f"{name}: the step axis {axis['name']} ({axis['title']!r}) has fractional ticks {bad}")
    return out


def problems(name: str, seen: dict) -> list[str]:
    """Sentences naming each text outside the figure, each pair of overlapping labels, each empty cell, each
    annotation on a bar, each tick or axis title under the legend, each pair of lines one hiding the other
    unsaid, each fractional step tick."""
    out = hidden_lines(name, seen) + fractional_steps(name, seen)
    for t in seen["texts"]:
        if t["role"] == "annotation" and any(overlaps(t["box"], bar, slack=1.0) for bar in seen.get("bars", [])):
            out.append(f"{name}: annotation {t['text']!r} sits on a bar")
        if t["role"] in ("tick", "axis title") and seen.get("legend") and covered(t, seen["legend"]):
            out.append(f"{name}: the legend covers {t['role']} {t['text']!r}")  # notebook 04 read "0, 216, 43"
    texts = [t for t in seen["texts"] if t["role"] != "table"]
    if seen.get("container") and seen["box"]["x1"] > seen["container"]["x1"] + 1:
        out.append(f"{name}: the figure is wider than its container ({seen['box']} vs {seen['container']})")
    for t in seen["texts"]:
        if not inside(t["box"], seen["box"]):
            out.append(f"{name}: {t['role']} {t['text']!r} lies outside the figure {t['box']} vs {seen['box']}")
    for i, a in enumerate(texts):
        for b in texts[i + 1:]:
            labels = {"point label", "bar label"}
            slack = -1.0 if a["role"] in labels or b["role"] in labels else 1.0  # numbers need a gap to be read
            if collide(a, b, slack) and not (a["text"] == b["text"] and a["box"] == b["box"]):
                out.append(f"{name}: {a['role']} {a['text']!r} overlaps {b['role']} {b['text']!r}")
    for c in seen["cells"]:
        if not c["text"]:
            out.append(f"{name}: an empty table cell at {c['box']}")
    for c in seen["cells"]:
        for box in c["textBoxes"]:
            if not inside(box, c["box"], slack=2):
                out.append(f"{name}: table cell text {c['text']!r} is cut at its cell's edge")
        if not inside(c["box"], seen["box"]):
            out.append(f"{name}: table cell {c['text']!r} is cut off by the figure (a row not shown)")
    if any("share" in (title or "").lower() or "cloud" in (title or "").lower() or "chart studio" in (title or "").lower()
           for title in seen["modebar"]):
        out.append(f"{name}: the toolbar offers to upload ({seen['modebar']})")
    return out


def figure_page(figures: dict, path: Path, width: int = 968) -> Path:
    """An offline HTML page with each figure in a ``width`` px box (plotly.js inlined), one div per name."""
    import plotly.io as pio

    from workbench.views.style import PLOT_CONFIG

    parts = []
    for k, (name, fig) in enumerate(figures.items()):
        div = pio.to_html(fig, full_html=False, include_plotlyjs=(k == 0), div_id=f"fig-{name}",
                          config=PLOT_CONFIG, default_width="100%")
        parts.append(f"<section data-name={json.dumps(name)} style='width:{width}px;margin:12px 0'>{div}</section>")
    path.write_text(f"<!doctype html><html><head><meta charset='utf-8'></head><body style='margin:0'>"
                    f"{''.join(parts)}</body></html>")
    return path
