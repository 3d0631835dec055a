"""Static exports through Chromium: each figure as PNG and SVG (kaleido), and the deck as PDF (playwright);
written atomically (:mod:`workbench.runs.atomic`, as every output of a build). The browser is the one
:func:`workbench.core.chromium.find_chromium` names (``static.find_chromium`` is that function).
"""

from __future__ import annotations

import html
import re
from pathlib import Path
from typing import Mapping

from workbench.core.chromium import chromium_for_kaleido, find_chromium  # static.find_chromium: callers keep it
from workbench.runs.atomic import replace_atomic, temp_beside

#: The deck's slide size in CSS pixels (reveal.js's width and height; the PDF's viewport).
SLIDE_WIDTH, SLIDE_HEIGHT = 1280, 720
CHROMIUM_ARGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync")


def launch_chromium(playwright, **kwargs):
    """A headless Chromium through playwright with the flags that keep it off the network."""
    return playwright.chromium.launch(executable_path=find_chromium(), args=list(CHROMIUM_ARGS), headless=True, **kwargs)


def _slug(fig: Mapping) -> str:
    title = fig.get("layout", {}).get("title", {})
    text = title.get("text", "") if isinstance(title, Mapping) else str(title or "")
    text = re.sub(r"<[^>]+>.*", "", text)  # the title line only, no <br><sup> subtitle
    return re.sub(r"[^a-z0-9]+", "-", html.unescape(text).lower()).strip("-")[:48] or "figure"


def write_figures(figures: list[tuple[int, dict]], folder: Path, formats: tuple[str, ...] = ("png", "svg"),
                  *, width: int = 1200, height: int | None = None, scale: float = 2) -> list[Path]:
    """Write each ``(cell index, figure dict)`` as ``NN-<title>.<format>`` with kaleido (one Chromium for all)."""
    import plotly.io as pio

    if not figures:
        return []
    find_chromium()  # fails here with the clear message, not deep inside kaleido
    folder.mkdir(parents=True, exist_ok=True)
    figs, paths = [], []
    for k, (_, fig) in enumerate(figures):
        stem = f"{k + 1:02d}-{_slug(fig)}"
        for fmt in formats:
            figs.append(fig)
            paths.append(folder / f"{stem}.{fmt}")
    tmps = [temp_beside(p) for p in paths]
    try:
        with chromium_for_kaleido():
            pio.write_images(figs, tmps, width=width, height=height, scale=scale, validate=False)
        missing = [str(p) for p, t in zip(paths, tmps) if not t.is_file() or t.stat().st_size == 0]
        if missing:
            raise RuntimeError(f"kaleido wrote no image for: {missing}")
        for tmp, path in zip(tmps, paths):
            replace_atomic(tmp, path)
    finally:
        for tmp in tmps:
            tmp.unlink(missing_ok=True)
    return paths


def export_pdf(deck_html: Path, pdf: Path | None = None, *, timeout_s: float = 120) -> Path:
    """Print a deck made by :func:`export_slides` to PDF (reveal.js's print layout, one page per slide)."""
    from playwright.sync_api import sync_playwright

    pdf = pdf or deck_html.with_suffix(".pdf")
    tmp = temp_beside(pdf)
    try:
        with sync_playwright() as p:
            browser = launch_chromium(p)
            try:
                page = browser.new_page(viewport={"width": SLIDE_WIDTH, "height": SLIDE_HEIGHT})
                page.route("**/*", lambda route: route.continue_() if route.request.url.startswith(("file:", "data:"))
                           else route.abort())
                page.goto(deck_html.resolve().as_uri() + "?print-pdf", wait_until="load", timeout=timeout_s * 1000)
                page.wait_for_function("window.workbenchDeck && window.workbenchDeck.pdfReady",
                                       timeout=timeout_s * 1000)
                page.pdf(path=str(tmp), prefer_css_page_size=True, print_background=True)
            finally:
                browser.close()
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return replace_atomic(tmp, pdf)
