"""Small server-rendered SVG charts: numbers in, markup out, no script and no CDN."""

from django.utils.html import format_html
from django.utils.safestring import SafeString


def line_chart(
    values: list[float], *, width: int = 560, height: int = 160, label: str = ""
) -> SafeString:
    """A polyline over the values with min/max labels; empty input draws an empty frame."""
    pad = 28
    numbers = [float(value) for value in values]
    points = ""
    low = high = 0.0
    if numbers:
        low, high = min(numbers), max(numbers)
        span = (high - low) or 1.0
        step = (width - 2 * pad) / max(len(numbers) - 1, 1)
        points = " ".join(
            f"{pad + i * step:.1f},{height - pad - (value - low) / span * (height - 2 * pad):.1f}"
            for i, value in enumerate(numbers)
        )
    return format_html(
        '<svg class="chart" viewBox="0 0 {w} {h}" width="{w}" height="{h}" role="img" '
        'aria-label="{label}"><rect x="{p}" y="{p}" width="{iw}" height="{ih}" class="frame"/>'
        '<polyline points="{points}" class="line"/>'
        '<text x="2" y="{top}" class="axis">{high}</text>'
        '<text x="2" y="{bottom}" class="axis">{low}</text>'
        '<text x="{p}" y="{h2}" class="axis">{label} ({n} steps)</text></svg>',
        w=width, h=height, p=pad, iw=width - 2 * pad, ih=height - 2 * pad, points=points,
        top=pad + 4, bottom=height - pad, high=f"{high:.3f}", low=f"{low:.3f}", label=label,
        n=len(numbers), h2=height - 6,
    )  # fmt: skip
