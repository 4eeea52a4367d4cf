"""Charts drawn on the server as SVG: a record's metric series as a line (the average per
step) inside its band (minimum to maximum per step), on the window's time axis."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.utils.dateparse import parse_datetime

WIDTH = 600
HEIGHT = 120
# Up to this many points a chart marks each one (a lone point would otherwise be invisible).
DOTS_UP_TO = 60


@dataclass(frozen=True)
class Chart:
    """One series, ready for ``_chart.html``: SVG point lists in a WIDTH by HEIGHT box."""

    name: str
    labels: str
    line: str
    band: str
    dots: list[tuple[float, float]]
    low: str
    high: str
    last: str
    points: int
    width: int = WIDTH
    height: int = HEIGHT


def _number(value: float) -> str:
    return f"{value:.4g}"


def line_chart(series: dict[str, Any], *, start: datetime, end: datetime) -> Chart:
    """``series`` as ``metric_series`` gives it (name, labels, points with at/avg/min/max/last)."""
    points = series["points"]
    span = max((end - start).total_seconds(), 1e-6)
    low = min((p["min"] for p in points), default=0.0)
    high = max((p["max"] for p in points), default=0.0)
    if high == low:  # a flat series sits in the middle of the box
        low, high = low - 1, high + 1

    def x(at: str) -> float:
        moment = parse_datetime(at)
        assert moment is not None
        return round(min(max((moment - start).total_seconds() / span, 0.0), 1.0) * WIDTH, 1)

    def y(value: float) -> float:
        return round(HEIGHT - (value - low) / (high - low) * HEIGHT, 1)

    line = [(x(p["at"]), y(p["avg"])) for p in points]
    top = [(x(p["at"]), y(p["max"])) for p in points]
    bottom = [(x(p["at"]), y(p["min"])) for p in reversed(points)]
    return Chart(
        name=series["name"],
        labels=", ".join(f"{k}={v}" for k, v in sorted((series.get("labels") or {}).items())),
        line=" ".join(f"{px},{py}" for px, py in line),
        band=" ".join(f"{px},{py}" for px, py in [*top, *bottom]),
        dots=line if len(line) <= DOTS_UP_TO else [],
        low=_number(low),
        high=_number(high),
        last=_number(points[-1]["last"]) if points else "—",
        points=sum(p["count"] for p in points),
    )
