"""The reviewer's checks of tests/figure_checks.py, on measured-looking input (the browser tests feed them
real figures): each flags what it names and passes what is fine, so a green browser test means something."""

from figure_checks import collide, fractional_steps, hidden_lines, problems


def text(label, x, y, w=100.0, h=14.0, angle=0.0, role="tick"):
    """A text whose box, as the browser reports it, is centred at (x, y); turned texts report the upright
    box around the turned one."""
    import math

    t = math.radians(angle)
    bw, bh = abs(w * math.cos(t)) + abs(h * math.sin(t)), abs(w * math.sin(t)) + abs(h * math.cos(t))
    return {"text": label, "role": role, "angle": angle, "w": w, "h": h,
            "box": {"x0": x - bw / 2, "x1": x + bw / 2, "y0": y - bh / 2, "y1": y + bh / 2}}


def test_turned_tick_labels_collide_only_where_their_letters_do():
    # Two 100 px labels at 30 degrees, 40 px apart along the axis: 20 px apart across their lines (> 14 px).
    a, b = text("a", 0, 0, angle=30), text("b", 40, 0, angle=30)
    assert a["box"]["x1"] > b["box"]["x0"]  # their upright boxes overlap ...
    assert not collide(a, b)  # ... the labels do not
    assert collide(text("a", 0, 0, angle=30), text("b", 20, 0, angle=30))  # 10 px across: on each other
    assert collide(text("a", 0, 0), text("b", 60, 0)) and not collide(text("a", 0, 0), text("b", 120, 0))


def seen(lines=(), axes=(), texts=()):
    box = {"x0": 0, "y0": 0, "x1": 1000, "y1": 500}
    return {"box": box, "texts": list(texts), "cells": [], "modebar": [], "lines": list(lines), "axes": list(axes)}


def line(name, points="[[0,1],[2,3]]", dash="solid", axes="xy"):
    return {"name": name, "points": points, "dash": dash, "axes": axes}


def test_a_line_hidden_under_another_is_found_unless_drawn_apart_or_said():
    assert hidden_lines("f", seen([line("ddp"), line("fsdp")])) == [
        "f: line 'fsdp' hides under 'ddp' (same points, same dash, not said)"]
    assert hidden_lines("f", seen([line("ddp"), line("fsdp", dash="dash")])) == []
    assert hidden_lines("f", seen([line("ddp"), line("fsdp", axes="x2y2")])) == []
    said = text("coincide: ddp = fsdp", 300, 20, role="title")
    assert hidden_lines("f", seen([line("ddp"), line("fsdp")], texts=[said])) == []


def test_a_step_axis_has_whole_steps_only():
    steps = {"name": "xaxis", "title": "step", "ticks": ["0", "0.5", "1", "1.5", "2"]}
    assert fractional_steps("f", seen(axes=[steps])) == ["f: the step axis xaxis ('step') has fractional ticks ['0.5', '1.5']"]
    assert fractional_steps("f", seen(axes=[{**steps, "ticks": ["0", "1", "2"]}])) == []
    assert fractional_steps("f", seen(axes=[{**steps, "title": "step time (ms)"}])) == []  # not an axis of steps


def test_an_annotation_on_a_bar_is_found():
    bar = {"x0": 100, "x1": 140, "y0": 100, "y1": 400}
    on = dict(seen(texts=[text("tail", 120, 200, w=30, role="annotation")]), bars=[bar])
    off = dict(seen(texts=[text("tail", 120, 80, w=30, role="annotation")]), bars=[bar])
    assert problems("f", on) == ["f: annotation 'tail' sits on a bar"] and problems("f", off) == []
