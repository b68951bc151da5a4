"""The dashboard's server-rendered SVG charts: every reported point drawn and counted, scaled
into the plot, nothing unescaped, an empty series said in words."""

from __future__ import annotations

import math
import re
import xml.etree.ElementTree as ET

from ito.server.web.charts import HEIGHT, WIDTH, Series, line_chart

SVG = "{http://www.w3.org/2000/svg}"


def _parse(html: str) -> ET.Element:
    # Our own output, not untrusted input: the stdlib parser checks it is well-formed.
    return ET.fromstring(html)  # noqa: S314


def _points(polyline: ET.Element) -> list[tuple[float, float]]:
    pairs = polyline.attrib["points"].split()
    return [(float(a), float(b)) for a, b in (p.split(",") for p in pairs)]


def test_every_point_of_every_series_is_drawn_and_counted() -> None:
    loss = Series("loss", [(float(s), 5.0 / s) for s in range(1, 301)])
    evals = Series("heldout_loss/web", [(0.0, 6.0), (150.0, 3.0), (300.0, 2.0)])
    figure = _parse(str(line_chart("loss", "Training loss", [loss, evals])))
    assert figure.tag == "figure" and figure.attrib["data-points"] == "303"
    lines = figure.findall(f".//{SVG}polyline")
    assert [line.attrib["data-series"] for line in lines] == ["loss", "heldout_loss/web"]
    assert [len(_points(line)) for line in lines] == [300, 3]
    assert [line.attrib["data-points"] for line in lines] == ["300", "3"]
    # A short series also gets a dot per point; a long one does not.
    assert len(figure.findall(f".//{SVG}circle")) == 3


def test_points_stay_inside_the_view_box_and_keep_their_order() -> None:
    figure = _parse(str(line_chart("x", "x", [Series("s", [(10, -3.0), (20, 7.5), (30, 1.0)])])))
    drawn = _points(figure.find(f".//{SVG}polyline"))  # type: ignore[arg-type]
    assert all(0 <= x <= WIDTH and 0 <= y <= HEIGHT for x, y in drawn)
    xs = [x for x, _ in drawn]
    assert xs == sorted(xs)
    # The highest value is drawn highest (smallest y), the lowest lowest.
    assert drawn[1][1] < drawn[2][1] < drawn[0][1]


def test_a_flat_series_and_a_single_point_are_drawn() -> None:
    flat = _parse(str(line_chart("f", "flat", [Series("s", [(1, 2.0), (2, 2.0)])])))
    assert flat.attrib["data-points"] == "2"
    one = _parse(str(line_chart("o", "one", [Series("s", [(5, 0.25)])])))
    assert one.attrib["data-points"] == "1"
    assert len(one.findall(f".//{SVG}circle")) == 1
    assert all(
        math.isfinite(v)
        for line in one.findall(f".//{SVG}polyline")
        for pair in _points(line)
        for v in pair
    )


def test_non_finite_points_are_neither_drawn_nor_counted() -> None:
    figure = _parse(
        str(line_chart("m", "m", [Series("s", [(1, math.nan), (2, 0.5), (3, math.inf)])]))
    )
    assert figure.attrib["data-points"] == "1"


def test_no_points_says_so_in_words() -> None:
    html = str(line_chart("mfu", "MFU", [Series("mfu", [])]))
    figure = _parse(html)
    assert figure.attrib["data-points"] == "0"
    assert figure.find(f".//{SVG}svg") is None and figure.find(".//p") is not None


def test_names_and_titles_are_escaped() -> None:
    html = str(line_chart("k", "<script>t</script>", [Series('"><img src=x>', [(1, 1.0)])]))
    assert "<script>" not in html and "<img" not in html
    assert re.search(r"&lt;script&gt;", html)
    _parse(html)  # still well-formed


def test_stage_marks_inside_the_steps_are_drawn_with_their_label() -> None:
    loss = Series("loss", [(float(s), 1.0 / s) for s in range(1, 31)])
    marks = [(1.0, "pretrain"), (20.0, "midtrain"), (99.0, "later")]
    figure = _parse(str(line_chart("loss", "Training loss", [loss], marks=marks)))
    lines = figure.findall(f".//{SVG}line")
    assert len(lines) == 1  # the first stage starts at the left edge; 99 is past the end
    labels = [t.text for t in figure.findall(f".//{SVG}text")]
    assert "midtrain" in labels and "pretrain" not in labels and "later" not in labels
    assert figure.attrib["data-points"] == "30"  # marks are not points
