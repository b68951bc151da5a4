"""Line charts of a run's metric series as inline SVG, drawn on the server (DESIGN §8).

No chart library and nothing fetched at run time: a chart is a ``<figure>`` holding one
``<svg>`` whose ``viewBox`` scales to any width (laptop or phone), one ``<polyline>`` per series
in step order, and a legend. A short series is drawn point by point (a replayed step once, with
its newest value); a long one as the minimum and maximum of each bucket of steps
(:mod:`ito.server.services.metric_buckets`), so a page costs the same whatever the history and
a spike stays visible. The figure says how many points it drew (``data-points``) and how many
the run reported (``data-reported``), and the legend says when buckets were drawn, so a reader
(or a test) can check the chart against the API's ``runs metrics``. Every text is escaped.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from markupsafe import Markup

__all__ = ["Series", "line_chart"]

WIDTH = 640
HEIGHT = 220
_LEFT, _RIGHT, _TOP, _BOTTOM = 64, 12, 12, 28
PALETTE = ("#1565c0", "#c62828", "#2e7d32", "#6a1b9a", "#ef6c00", "#00838f", "#5d4037")
MARKERS_UP_TO = 60
"""A series with this many points or fewer also gets a dot per point (an eval measured at a
few gates would otherwise be a bare segment, or nothing at all with one point)."""


@dataclass(frozen=True)
class Series:
    """One named line: ``(x, y)`` points in the order they were reported."""

    name: str
    points: Sequence[tuple[float, float]]
    reported: int | None = None
    """Points the run reported (``None``: those drawn)."""
    width: int = 1
    """1: drawn point by point; else the steps per bucket whose minimum and maximum are drawn."""
    last: float | None = None
    """The value reported last (``None``: the last point's)."""


def _span(values: list[float]) -> tuple[float, float]:
    low, high = min(values), max(values)
    if high - low <= 1e-12 * max(1.0, abs(high)):
        pad = abs(high) * 0.1 or 1.0
        return low - pad, high + pad
    return low, high


def _number(value: float) -> str:
    return f"{value:.4g}"


def line_chart(
    key: str,
    title: str,
    series: Sequence[Series],
    *,
    unit: str = "",
    marks: Sequence[tuple[float, str]] = (),
) -> Markup:
    """The figure for ``series`` (non-finite points are not drawn, nor counted), with a dashed
    vertical line and its label at each of ``marks`` inside the steps drawn (where a stage
    begins)."""
    clean = [
        Series(
            s.name,
            [(x, y) for x, y in s.points if math.isfinite(x) and math.isfinite(y)],
            s.reported,
            s.width,
            s.last,
        )
        for s in series
    ]
    clean = [s for s in clean if s.points]
    total = sum(len(s.points) for s in clean)
    reported = sum(s.reported if s.reported is not None else len(s.points) for s in clean)
    head = Markup(
        '<figure class="chart" id="chart-{key}" data-chart="{key}" data-points="{total}" '
        'data-reported="{reported}"><figcaption>{title}{unit}</figcaption>'
    ).format(
        key=key,
        total=total,
        reported=reported,
        title=title,
        unit=Markup(' <span class="muted">({})</span>').format(unit) if unit else "",
    )
    if not clean:
        return head + Markup('<p class="muted">No points reported yet.</p></figure>')
    xs = [x for s in clean for x, _ in s.points]
    ys = [y for s in clean for _, y in s.points]
    x0, x1 = _span(xs)
    y0, y1 = _span(ys)
    plot_w, plot_h = WIDTH - _LEFT - _RIGHT, HEIGHT - _TOP - _BOTTOM

    def px(x: float) -> str:
        return f"{_LEFT + (x - x0) / (x1 - x0) * plot_w:.1f}"

    def py(y: float) -> str:
        return f"{_TOP + (1 - (y - y0) / (y1 - y0)) * plot_h:.1f}"

    parts = [
        Markup(
            '<svg viewBox="0 0 {w} {h}" role="img" aria-label="{title}" '
            'xmlns="http://www.w3.org/2000/svg">'
            '<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="#fafbfc" '
            'stroke="#d5d9e0"/>'
        ).format(w=WIDTH, h=HEIGHT, title=title, left=_LEFT, top=_TOP, pw=plot_w, ph=plot_h)
    ]
    for y in (y0, (y0 + y1) / 2, y1):
        parts.append(
            Markup(
                '<text x="{x}" y="{y}" text-anchor="end" font-size="11" fill="#556">{v}</text>'
            ).format(x=_LEFT - 6, y=f"{float(py(y)) + 4:.1f}", v=_number(y))
        )
    for x, anchor in ((x0, "start"), (x1, "end")):
        parts.append(
            Markup(
                '<text x="{x}" y="{y}" text-anchor="{anchor}" font-size="11" fill="#556">'
                "step {v}</text>"
            ).format(x=px(x), y=HEIGHT - 8, anchor=anchor, v=_number(x))
        )
    for x, label in marks:
        if x0 < x <= x1:
            parts.append(
                Markup(
                    '<line class="mark" x1="{x}" x2="{x}" y1="{top}" y2="{bottom}" '
                    'stroke="#9aa3b0" stroke-dasharray="4 3"/>'
                    '<text x="{tx}" y="{ty}" text-anchor="{anchor}" font-size="10" fill="#667">'
                    "{label}</text>"
                ).format(
                    x=px(x),
                    top=_TOP,
                    bottom=_TOP + plot_h,
                    # Near the right edge the label goes left of its line, inside the plot.
                    anchor="end" if float(px(x)) > WIDTH - 90 else "start",
                    tx=f"{float(px(x)) + (-3 if float(px(x)) > WIDTH - 90 else 3):.1f}",
                    ty=_TOP + 11,
                    label=label,
                )
            )
    legend = []
    for i, s in enumerate(clean):
        colour = PALETTE[i % len(PALETTE)]
        parts.append(
            Markup(
                '<polyline data-series="{name}" data-points="{n}" points="{coords}" fill="none" '
                'stroke="{colour}" stroke-width="1.6" vector-effect="non-scaling-stroke"/>'
            ).format(
                name=s.name,
                n=len(s.points),
                coords=" ".join(f"{px(x)},{py(y)}" for x, y in s.points),
                colour=colour,
            )
        )
        if len(s.points) <= MARKERS_UP_TO:
            parts.extend(
                Markup('<circle cx="{x}" cy="{y}" r="2.5" fill="{colour}"/>').format(
                    x=px(x), y=py(y), colour=colour
                )
                for x, y in s.points
            )
        last = s.last if s.last is not None and math.isfinite(s.last) else s.points[-1][1]
        count = s.reported if s.reported is not None else len(s.points)
        how = (
            Markup(", drawn as the min and max of every {w} steps").format(w=s.width)
            if s.width > 1
            else ""
        )
        legend.append(
            Markup(
                '<li><span class="swatch" style="background:{colour}"></span>{name} '
                '<span class="muted">last {last}, {n} point(s){how}</span></li>'
            ).format(colour=colour, name=s.name, last=_number(last), n=count, how=how)
        )
    return (
        head
        + Markup("").join(parts)
        + Markup("</svg>")
        + Markup('<ul class="legend">')
        + Markup("").join(legend)
        + Markup("</ul></figure>")
    )
