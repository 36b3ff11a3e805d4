"""Small inline-SVG charts for report.html: no JavaScript, nothing fetched.

Every data mark carries ``data-path`` (where its number lives: a JSON pointer into
the list of validation.json files, or ``plan:...`` for the serving plan's
arithmetic) and ``data-value`` (the exact number), plus a ``<title>`` a browser
shows on hover. Tests read those attributes back and compare them with the files.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field

PALETTE = ("#3366cc", "#e8743b", "#19a979", "#945ecf", "#ed4a7b", "#13a4b4")
PASS, FAIL, MUTED = "#2e9d55", "#c0392b", "#9aa3ad"
FONT = "font-family='system-ui,sans-serif' font-size='11'"


@dataclass
class Mark:
    """One number on a chart and where it came from."""

    value: float
    path: str
    label: str = ""
    color: str = PALETTE[0]
    # A per-bar limit drawn as a tick (e.g. the check's threshold): (value, path).
    limit: tuple[float, str] | None = None


@dataclass
class Series:
    name: str
    points: list[tuple[float, Mark]] = field(default_factory=list)  # (x, y mark)


def esc(text: object) -> str:
    return html.escape(str(text), quote=True)


def fmt(value: object) -> str:
    """How every number is written in the report (4 significant digits)."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, int):
        return f"{value:,}" if abs(value) >= 10000 else str(value)
    return "" if value is None else str(value)


def _attrs(mark: Mark) -> str:
    return f"data-path='{esc(mark.path)}' data-value='{esc(repr(mark.value))}'"


def _svg(width: int, height: int, body: list[str], label: str) -> str:
    return (
        f"<svg class='plot' xmlns='http://www.w3.org/2000/svg' role='img' "
        f"aria-label='{esc(label)}' width='{width}' height='{height}' "
        f"viewBox='0 0 {width} {height}'>{''.join(body)}</svg>"
    )


def bar_chart(
    marks: list[Mark],
    *,
    label: str,
    unit: str = "",
    log: bool = False,
    threshold: tuple[float, str] | None = None,
    lo: float | None = None,
    hi: float | None = None,
) -> str:
    """Horizontal bars, one per mark; ``log`` for numbers spanning decades
    (logprob differences), ``threshold`` draws a labelled vertical rule."""
    left, right, bar, gap, top = 150, 90, 16, 6, 20
    width = 640
    plot_w = width - left - right
    values = [m.value for m in marks] + ([threshold[0]] if threshold else [])
    values += [m.limit[0] for m in marks if m.limit]
    if log:
        positive = [v for v in values if v > 0] or [1.0]
        lo_e = math.floor(math.log10(lo if lo else min(positive)))
        hi_e = math.ceil(math.log10(hi if hi else max(positive)))
        hi_e = max(hi_e, lo_e + 1)

        def x(v: float) -> float:
            if v <= 0:
                return 0.0
            e = min(max(math.log10(v), lo_e), hi_e)
            return plot_w * (e - lo_e) / (hi_e - lo_e)

        ticks = [(10.0**e, f"1e{e}") for e in range(lo_e, hi_e + 1)]
    else:
        top_v = hi if hi is not None else _nice(max(values + [0.0]) * 1.05 or 1.0)

        def x(v: float) -> float:
            return plot_w * max(0.0, min(v, top_v)) / top_v

        ticks = [(top_v * i / 4, _tick(top_v * i / 4)) for i in range(5)]
    height = top + len(marks) * (bar + gap) + 34
    axis_y = top + len(marks) * (bar + gap)
    body = []
    for value, text in ticks:
        tx = left + x(value)
        body.append(
            f"<line x1='{tx:.1f}' y1='{top}' x2='{tx:.1f}' y2='{axis_y}' "
            "stroke='#e3e6ea'/>"
            f"<text class='tick' x='{tx:.1f}' y='{axis_y + 14}' text-anchor='middle' "
            f"{FONT} fill='#555'>{esc(text)}</text>"
        )
    for i, mark in enumerate(marks):
        y = top + i * (bar + gap)
        w = max(x(mark.value), 1.5)
        tick = x(mark.limit[0]) + 2 if mark.limit else 0.0
        body.append(
            f"<text x='{left - 6}' y='{y + bar - 4}' text-anchor='end' {FONT}>"
            f"{esc(mark.label)}</text>"
            f"<rect class='mark' {_attrs(mark)} x='{left}' y='{y}' width='{w:.1f}' "
            f"height='{bar}' fill='{mark.color}'>"
            f"<title>{esc(mark.label)}: {esc(fmt(mark.value))} {esc(unit)}</title>"
            "</rect>"
            f"<text x='{left + max(w, tick) + 4:.1f}' y='{y + bar - 4}' {FONT} "
            "fill='#333'>"
            f"{esc(fmt(mark.value))}</text>"
        )
        if mark.limit:
            lx = left + x(mark.limit[0])
            body.append(
                f"<line class='limit' data-path='{esc(mark.limit[1])}' "
                f"data-value='{esc(repr(mark.limit[0]))}' x1='{lx:.1f}' "
                f"y1='{y - 2}' x2='{lx:.1f}' y2='{y + bar + 2}' stroke='#1f2328' "
                f"stroke-width='2.5'><title>{esc(mark.label)}: limit "
                f"{esc(fmt(mark.limit[0]))}</title></line>"
            )
    if threshold:
        tx = left + x(threshold[0])
        body.append(
            f"<line x1='{tx:.1f}' y1='{top - 4}' x2='{tx:.1f}' y2='{axis_y}' "
            "stroke='#b3261e' stroke-dasharray='4 3' stroke-width='1.5'/>"
            f"<text x='{tx - 4:.1f}' y='{top - 8}' text-anchor='end' {FONT} "
            f"fill='#b3261e'>{esc(threshold[1])}</text>"
        )
    body.append(
        f"<line x1='{left}' y1='{axis_y}' x2='{left + plot_w}' y2='{axis_y}' "
        "stroke='#888'/>"
        f"<text x='{left + plot_w}' y='{axis_y + 28}' text-anchor='end' {FONT} "
        f"fill='#555'>{esc(unit)}</text>"
    )
    return _svg(width, height, body, label)


def line_chart(
    series: list[Series],
    *,
    label: str,
    x_label: str,
    y_label: str,
    log_x: bool = False,
    y_max: float | None = None,
    integer_x: bool = True,
) -> str:
    """Lines with dots, one per series, and a legend below."""
    width, height = 640, 300
    left, right, top, bottom = 64, 20, 14, 62
    plot_w, plot_h = width - left - right, height - top - bottom
    xs = sorted({x for s in series for x, _ in s.points})
    ys = [m.value for s in series for _, m in s.points]
    y_top = y_max if y_max is not None else _nice(max(ys + [0.0]) * 1.1 or 1.0)

    def px(v: float) -> float:
        if len(xs) == 1:
            return left + plot_w / 2
        if log_x:
            a, b = math.log2(xs[0]), math.log2(xs[-1])
            return left + plot_w * (math.log2(v) - a) / (b - a)
        return left + plot_w * (v - xs[0]) / (xs[-1] - xs[0])

    def py(v: float) -> float:
        return top + plot_h * (1 - max(0.0, min(v, y_top)) / y_top)

    body = []
    for i in range(5):
        v = y_top * i / 4
        body.append(
            f"<line x1='{left}' y1='{py(v):.1f}' x2='{left + plot_w}' "
            f"y2='{py(v):.1f}' stroke='#e3e6ea'/>"
            f"<text class='tick' x='{left - 6}' y='{py(v) + 4:.1f}' "
            f"text-anchor='end' {FONT} fill='#555'>{esc(_tick(v))}</text>"
        )
    for v in xs:
        text = str(int(v)) if integer_x and float(v).is_integer() else fmt(v)
        body.append(
            f"<text class='tick' x='{px(v):.1f}' y='{top + plot_h + 16}' "
            f"text-anchor='middle' {FONT} fill='#555'>{esc(text)}</text>"
        )
    body.append(
        f"<line x1='{left}' y1='{top + plot_h}' x2='{left + plot_w}' "
        f"y2='{top + plot_h}' stroke='#888'/>"
        f"<line x1='{left}' y1='{top}' x2='{left}' y2='{top + plot_h}' "
        "stroke='#888'/>"
        f"<text x='{left + plot_w / 2}' y='{top + plot_h + 32}' text-anchor='middle' "
        f"{FONT} fill='#333'>{esc(x_label)}</text>"
        f"<text transform='translate(14 {top + plot_h / 2}) rotate(-90)' "
        f"text-anchor='middle' {FONT} fill='#333'>{esc(y_label)}</text>"
    )
    legend_x = left
    for i, s in enumerate(series):
        color = PALETTE[i % len(PALETTE)]
        pts = sorted(s.points, key=lambda p: p[0])
        if len(pts) > 1:
            d = " ".join(f"{px(x):.1f},{py(m.value):.1f}" for x, m in pts)
            body.append(
                f"<polyline points='{d}' fill='none' stroke='{color}' "
                "stroke-width='2'/>"
            )
        for x, m in pts:
            body.append(
                f"<circle class='mark' {_attrs(m)} cx='{px(x):.1f}' "
                f"cy='{py(m.value):.1f}' r='4' fill='{color}'>"
                f"<title>{esc(s.name)}, {esc(x_label)} {esc(fmt(x))}: "
                f"{esc(fmt(m.value))}</title></circle>"
            )
        ly = height - 12
        body.append(
            f"<rect x='{legend_x}' y='{ly - 9}' width='12' height='10' "
            f"fill='{color}'/><text x='{legend_x + 16}' y='{ly}' {FONT}>"
            f"{esc(s.name)}</text>"
        )
        legend_x += 28 + 7 * len(s.name)
    return _svg(width, height, body, label)


def stacked_bars(
    rows: list[tuple[str, list[Mark], float]], *, label: str, unit: str
) -> str:
    """One horizontal bar per row split into parts (the marks, in order); each
    row's third item is its full length (e.g. the device's usable memory)."""
    left, right, bar, gap, top = 130, 110, 20, 12, 8
    width = 640
    plot_w = width - left - right
    most = max((full for _, _, full in rows), default=1.0) or 1.0
    height = top + len(rows) * (bar + gap) + 26
    body = []
    legend: dict[str, str] = {}
    for i, (name, parts, full) in enumerate(rows):
        y = top + i * (bar + gap)
        x = float(left)
        body.append(
            f"<text x='{left - 6}' y='{y + bar - 6}' text-anchor='end' {FONT}>"
            f"{esc(name)}</text>"
            f"<rect x='{left}' y='{y}' width='{plot_w * full / most:.1f}' "
            f"height='{bar}' fill='#f1f3f5' stroke='#c9ced4'/>"
        )
        for m in parts:
            w = plot_w * max(m.value, 0.0) / most
            body.append(
                f"<rect class='mark' {_attrs(m)} x='{x:.1f}' y='{y}' "
                f"width='{max(w, 1.0):.1f}' height='{bar}' fill='{m.color}'>"
                f"<title>{esc(name)}: {esc(m.label)} {esc(fmt(m.value))} "
                f"{esc(unit)}</title></rect>"
            )
            x += w
            legend.setdefault(m.label, m.color)
        body.append(
            f"<text x='{left + plot_w * full / most + 4:.1f}' y='{y + bar - 6}' "
            f"{FONT} fill='#333'>{esc(_tick(full))} {esc(unit)}</text>"
        )
    lx = left
    for name, color in legend.items():
        body.append(
            f"<rect x='{lx}' y='{height - 18}' width='12' height='10' "
            f"fill='{color}'/><text x='{lx + 16}' y='{height - 9}' {FONT}>"
            f"{esc(name)}</text>"
        )
        lx += 30 + 6 * len(name)
    return _svg(width, height, body, label)


def _nice(v: float) -> float:
    """The next 1/2/5 x 10^k at or above v (a round axis top)."""
    e = 10 ** math.floor(math.log10(v))
    for m in (1, 2, 2.5, 5, 10):
        if m * e >= v:
            return m * e
    return 10 * e


def _tick(v: float) -> str:
    if abs(v) >= 1000:
        return f"{v:,.0f}"  # 1,000 rather than 1e+03
    return f"{v:.3g}"
