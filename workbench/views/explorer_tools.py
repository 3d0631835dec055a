"""What both explorers offer beside their controls (issue 29 items 12 and 13): export the current view (every
figure as SVG and PNG, with the call that reproduces it, ready for a deck) and pin it, a frozen copy of its
figures beside the live ones, to compare it with a second setting (two sizes, two models, two N).

:class:`ExplorerTools` is mixed into :class:`~workbench.views.widgets.LayoutExplorer` and
:class:`~workbench.views.memory_explorer.MemoryExplorer`; it needs their ``figures`` (``{name: FigureWidget}``),
``probe`` (:class:`~workbench.views.widget_sync.WidthProbe`), ``code_line()``, ``view_parts()`` and
``CODE_IMPORTS``. Images go through kaleido, which drives the Chromium every export drives
(:func:`workbench.core.chromium.find_chromium`), and every file is written atomically (:mod:`workbench.runs.atomic`).
"""

from __future__ import annotations

import hashlib
import html
import json
import os
import re
from pathlib import Path
from typing import Sequence

import ipywidgets as widgets
import plotly.graph_objects as go

from workbench.core.chromium import chromium_for_kaleido
from workbench.core.formats import PLOTLY_MIME
from workbench.runs.atomic import replace_atomic, temp_beside, write_atomic
from workbench.views.widget_sync import redraw_undrawn, wrapping_row

#: Image formats an export writes for each figure.
EXPORT_FORMATS = ("svg", "png")
#: Folder the export button writes to, relative to the notebook's working directory, until the reader picks one.
DEFAULT_EXPORT_FOLDER = "explorer-exports"
#: Where an export's markdown turns from the view (its calls) to what it showed (the status line).
SHOWED = "\nIt showed: "
#: Pixels between a live figure and its pinned copy (CSS gap, which a flex row honours).
PAIR_GAP_PX = 8


def view_stem(parts: Sequence[str], code: str) -> str:
    """A file stem naming a view: its parts (model, N, size...) made safe for a file name, then 8 hex digits of
    ``code``'s SHA-256 (the reproducing call, and a pinned view's), so two views that differ anywhere never share
    a name, and one view exported again keeps its names."""
    slug = "-".join(re.sub(r"[^A-Za-z0-9.]+", "-", str(p)).strip("-") for p in parts if str(p))
    return f"{slug[:96]}-{hashlib.sha256(code.encode()).hexdigest()[:8]}"


def write_images(figures: Sequence[go.Figure], paths: Sequence[Path]) -> list[Path]:
    """Each figure to its path (the format from the suffix) with kaleido, one Chromium for all, each at its own
    layout width and height, every file written beside and renamed into place (a reader never sees part of one).

    Raises:
        RuntimeError: naming the files kaleido did not write, or how to give it a Chromium.
    """
    import plotly.io as pio

    tmps = [temp_beside(p) for p in paths]
    try:
        try:
            with chromium_for_kaleido():
                pio.write_images(list(figures), tmps, scale=2, validate=False)
        except Exception as err:  # no Chromium (find_chromium's message), or kaleido's: a browser that died...
            raise RuntimeError(f"Could not write {', '.join(p.name for p in paths)}: {err} (kaleido needs Chromium: "
                               "set WORKBENCH_CHROMIUM to its executable, or `apt-get install chromium`).") from err
        missing = [p.name for p, t in zip(paths, tmps) if not t.is_file() or t.stat().st_size == 0]
        if missing:
            raise RuntimeError(f"kaleido wrote no image for: {', '.join(missing)}")
        return [replace_atomic(t, p) for t, p in zip(tmps, paths)]
    finally:
        for tmp in tmps:
            tmp.unlink(missing_ok=True)


class PinnedFigure(widgets.Output):
    """A frozen copy of a figure, shown as plotly's own mimetype output rather than a ``FigureWidget``: a copy never
    changes, and a new ``FigureWidget`` on a busy page (load 6-9) failed anywidget's 2 s start and stayed blank
    (issue 29 items 1 and 13: the pinned view not drawn within 60 s, in a suite run).

    Attributes:
        fig: The frozen figure (a ``go.Figure``; its ``layout.width`` is the copy's width).
    """

    def __init__(self, fig: go.Figure):
        super().__init__()
        self.fig = fig  # drawn by show(), once its width is known

    def show(self, width: int | None = None) -> None:
        """Draw the copy (again), at ``width`` pixels if given."""
        if width is not None:
            self.fig.layout.width = width
        self.outputs = ({"output_type": "display_data", "metadata": {},
                         "data": {PLOTLY_MIME: json.loads(self.fig.to_json()), "text/plain": "pinned figure"}},)


class ExplorerTools:
    """Export and pin for an explorer (see the module's docstring for what the explorer provides).

    Attributes:
        pinned: ``{name: PinnedFigure}``: the frozen copies beside the live figures; empty when nothing is pinned.
        pinned_code: The call that reproduces the pinned view, or ``None``.
        pinned_label: HTML naming the pinned view (its call and its status line), empty when nothing is pinned.
        export_folder: A text field: the folder the export button writes to.
        export_note: HTML: the files the last export wrote, or why it could not.
    """

    def _tools_row(self) -> widgets.HBox:
        """The row of export and pin controls; call once in ``__init__``, after ``figures`` and ``probe`` and before
        the first ``update()``."""
        # Each live figure's row, where the explorer places it (figure_row): a pinned copy joins it there.
        self._rows = {name: wrapping_row([fw], grid_gap=f"{PAIR_GAP_PX}px") for name, fw in self.figures.items()}
        # When the page asks (past the draw grace), a figure it did not draw gets a new widget in its place; this
        # observer comes before the explorer's own, whose redraw then names what is still undrawn.
        self.probe.observe(lambda change: redraw_undrawn(self.probe, self.figures, self._rows), names="checks")
        self.pinned: dict[str, PinnedFigure] = {}
        self.pinned_code: str | None = None
        self.pinned_label, self.export_note = widgets.HTML(), widgets.HTML()
        self.export_folder = widgets.Text(value=DEFAULT_EXPORT_FOLDER, description="export to",
                                          style={"description_width": "initial"}, layout=widgets.Layout(width="260px"))
        self.export_button = widgets.Button(description="export view", icon="download",
                                            tooltip="Save every figure as SVG and PNG, with the call that reproduces it")
        self.pin_button = widgets.Button(description="pin view", icon="thumb-tack",
                                         tooltip="Keep a frozen copy of these figures beside the live ones")
        self.export_button.on_click(lambda _: self._export_clicked())
        self.pin_button.on_click(lambda _: self.unpin() if self.pinned else self.pin())
        self.probe.observe(self._resize_pinned, names="width")
        return wrapping_row([self.export_folder, self.export_button, self.pin_button, self.export_note],
                            align_items="center")

    def figure_width(self, default: int) -> int:
        """Pixels for each live figure: the probe's width, or half of it (less :data:`PAIR_GAP_PX`) while a view is
        pinned, so the pair sits side by side (a row that cannot hold both wraps: the pinned copy goes below)."""
        width = self.probe.figure_width(default)
        return max((width - PAIR_GAP_PX) // 2, self.probe.MIN_PX) if self.pinned else width

    def _resize_pinned(self, change=None) -> None:
        for name, copy in self.pinned.items():  # the live side follows in the explorer's own update
            copy.show(self.figure_width(self.figures[name].layout.width or self.probe.MIN_PX))

    def shown_json(self) -> dict[str, dict | None]:
        """``{name: figure JSON}``: what the explorer last sent each live figure (None before its first draw).
        Each explorer says where it keeps it."""
        raise NotImplementedError

    def frozen_figures(self) -> dict[str, go.Figure]:
        """Each live figure as the explorer drew it: the JSON it last sent (:meth:`shown_json`), with the widget's
        template and width. Not the widget's ``to_dict()``: plotly's widget code rewrites the Python side of its
        traces from the browser's trace deltas, and a pinned copy made from it lost the bucket figure's names,
        colours and bar widths ("trace 0", "trace 1", ...; issue 29 item 13)."""
        shown = self.shown_json()
        frozen = {}
        for name, fw in self.figures.items():
            fig = shown.get(name)
            frozen[name] = go.Figure(fw.to_dict()) if fig is None else go.Figure(
                {**fig, "layout": {**fig["layout"], "template": fw.layout.template, "width": fw.layout.width}})
        return frozen

    def figure_row(self, name: str) -> widgets.HBox:
        """The row that holds the live figure ``name`` where the explorer places it (made in :meth:`_tools_row`):
        pinning adds the frozen copy to this row and unpinning removes it, so the live figure's view in the page
        stays where it is. (Moving a live figure into a new box made the page draw it again from nothing: blank,
        at width 0.)"""
        return self._rows[name]

    def pin(self) -> None:
        """Freeze a copy of the current figures beside the live ones (a pinned view is replaced); controls then
        change only the live side."""
        if self.pinned:
            self.unpin()
        self.pinned_code = self.code_line()
        self.pinned = {name: PinnedFigure(fig) for name, fig in self.frozen_figures().items()}
        self.pinned_label.value = ("<b>pinned</b> (right, or below when narrow): "
                                   f"<code style='user-select:all'>{html.escape(self.pinned_code)}</code><br>"
                                   f"<span style='color:#555'>pinned: {self.status.value}</span>")
        self.pin_button.description, self.pin_button.icon = "unpin", "times"
        self.update()  # the live figures take half the width
        for name, copy in self.pinned.items():
            copy.show(self.figures[name].layout.width)
            self.figure_row(name).children = (self.figures[name], copy)

    def unpin(self) -> None:
        """Remove the pinned copy; the live figures take the whole width again."""
        for name in self.pinned:
            self.figure_row(name).children = (self.figures[name],)
        self.pinned, self.pinned_code, self.pinned_label.value = {}, None, ""
        self.pin_button.description, self.pin_button.icon = "pin view", "thumb-tack"
        self.update()

    def export(self, folder: str | os.PathLike = DEFAULT_EXPORT_FOLDER) -> list[Path]:
        """Save the current view in ``folder`` (made if missing): each figure as ``<stem>-<figure>.svg`` and
        ``.png`` (the pinned copies as ``<stem>-pinned-<figure>.*``), and ``<stem>.md`` with the call that
        reproduces the view. The stem names the view (:meth:`view_parts`, and a hash of the call: :func:`view_stem`),
        so one view exported again replaces its own files and never another's.

        Returns:
            The paths written, the markdown file last.

        Raises:
            FileExistsError: when ``<stem>.md`` holds another view (never overwritten silently).
            RuntimeError: when kaleido cannot write the images (it names the remedy).
        """
        code = self.code_line()
        pinned = self.pinned_code
        stem = view_stem(self.view_parts(), code + (f"\npinned: {pinned}" if pinned else ""))
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        figures = self.frozen_figures()
        figures |= {f"pinned-{name}": go.Figure(copy.fig.to_dict()) for name, copy in self.pinned.items()}
        paths = [folder / f"{stem}-{name.replace('_', '-')}.{fmt}" for name in figures for fmt in EXPORT_FORMATS]
        text = self.export_markdown(stem, code, [p.name for p in paths])
        md = folder / f"{stem}.md"
        # The view is what precedes its status line (a status can change on one view: a late 'Not drawn' notice).
        if md.exists() and md.read_text(encoding="utf-8").partition(SHOWED)[0] != text.partition(SHOWED)[0]:
            raise FileExistsError(f"{md} holds another view; export to another folder or remove it.")
        written = write_images([fig for fig in figures.values() for _ in EXPORT_FORMATS], paths)
        return [*written, write_atomic(md, text)]

    def export_markdown(self, stem: str, code: str, files: Sequence[str]) -> str:
        """The markdown an export writes beside its images: the call that reproduces the view, its status line as
        text, the files, and the pinned view's call when one is pinned."""
        given = "" if not re.search(r"\((spec|model),", code) else (
            "\n`spec` / `model` is the ModelSpec or config you passed to the explorer.\n")
        pinned = f"\nPinned beside it:\n\n```python\n{self.pinned_code}\n```\n" if self.pinned_code else ""
        status = html.unescape(re.sub(r"<br>", " ", re.sub(r"<(?!br>)[^>]+>", "", self.status.value)))
        return (f"# {stem}\n\nReproduce this view:\n\n```python\n{self.CODE_IMPORTS}\nexplorer = {code}\n"
                f"explorer\n```\n{given}{pinned}{SHOWED}{status}\n\nFiles:\n\n" + "".join(f"- {name}\n" for name in files))

    def _export_clicked(self) -> None:
        try:
            paths = self.export(self.export_folder.value.strip() or DEFAULT_EXPORT_FOLDER)
        except (OSError, RuntimeError, ValueError) as err:
            self.export_note.value = f"<span style='color:#B00020'><b>Not exported:</b> {html.escape(str(err))}</span>"
            return
        self.export_note.value = html.escape(f"exported {len(paths)} files to {paths[-1].parent}: {paths[-1].name}, …")
