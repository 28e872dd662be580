"""Small server-rendered SVG charts: numbers in, markup out, no script and no CDN."""

from django.utils.html import format_html, format_html_join
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


def bar_chart(
    labels: list[str],
    series: dict[str, list[float]],
    *,
    width: int = 560,
    height: int = 180,
    label: str = "",
) -> SafeString:
    """Grouped bars: one group per label, one bar per series (a legend names them); values >= 0.

    Labels and series names may come from users (tag names), so every text goes through escaping.
    """
    pad, bottom = 28, 36
    top = 34  # room for the legend above the tallest bar's value
    names = list(series)
    peak = max([float(value) for values in series.values() for value in values] + [0.0]) or 1.0
    group_width = (width - 2 * pad) / max(len(labels), 1)
    bar_width = group_width * 0.8 / max(len(names), 1)
    plot_height = height - top - bottom
    bars, values_text, labels_text = [], [], []
    for group, group_label in enumerate(labels):
        left = pad + group * group_width + group_width * 0.1
        for index, name in enumerate(names):
            values = series[name]
            value = float(values[group]) if group < len(values) else 0.0
            bar_height = value / peak * plot_height
            x, y = left + index * bar_width, top + plot_height - bar_height
            shown = f"{value:g}" if value == int(value) else f"{value:.3f}"
            bars.append(
                (index % 4, f"{x:.1f}", f"{y:.1f}", f"{max(bar_width - 2, 1):.1f}",
                 f"{bar_height:.1f}", name, group_label, shown)
            )  # fmt: skip
            values_text.append((f"{x + bar_width / 2 - 1:.1f}", f"{y - 3:.1f}", shown))
        labels_text.append(
            (f"{pad + (group + 0.5) * group_width:.1f}", height - bottom + 14, group_label)
        )
    # The legend runs along the top, above the tallest bar's value.
    legend = [
        (index % 4, pad + 140 * index, 4, pad + 140 * index + 14, 13, name)
        for index, name in enumerate(names)
    ]
    return format_html(
        '<svg class="chart bars" viewBox="0 0 {w} {h}" width="{w}" height="{h}" role="img" '
        'aria-label="{label}"><line x1="{p}" y1="{base}" x2="{right}" y2="{base}" class="frame"/>'
        "{bars}{values}{labels}{legend}"
        '<text x="{p}" y="{h2}" class="axis">{label}</text></svg>',
        w=width, h=height, p=pad, base=height - bottom, right=width - pad, label=label,
        h2=height - 4,
        bars=format_html_join(
            "",
            '<rect class="bar s{}" x="{}" y="{}" width="{}" height="{}">'
            "<title>{}, {}: {}</title></rect>",
            bars,
        ),
        values=format_html_join(
            "", '<text x="{}" y="{}" class="value" text-anchor="middle">{}</text>', values_text
        ),
        labels=format_html_join(
            "",
            '<text x="{}" y="{}" class="axis" text-anchor="middle">{}</text>',
            labels_text,
        ),
        legend=format_html_join(
            "",
            '<rect class="bar s{}" x="{}" y="{}" width="10" height="10"/>'
            '<text x="{}" y="{}" class="axis">{}</text>',
            legend,
        ),
    )  # fmt: skip


SERIES_CLASSES = 6  # distinct line colours in app.css; more series reuse them


def _fmt(value: float, percent: bool) -> str:
    return f"{100 * value:.0f}%" if percent else f"{value:.3g}"


# The axis font (12px monospace) is about this wide a character: a legend entry takes its key,
# a gap and its name, so long names (version names, terminations) wrap instead of running over
# the next entry.
AXIS_CHAR_WIDTH = 7.3


def _legend_places(
    names: list[str], *, left: int, right: int, top: int
) -> tuple[list[tuple[str, int, str, int]], int]:
    """Where each legend entry goes, left to right and wrapping within [left, right]: (key x,
    key y, text x, text y) per name; and the rows the legend takes."""
    places, x, row = [], left, 0
    for name in names:
        entry_width = 24 + AXIS_CHAR_WIDTH * len(name)
        if x > left and x + entry_width > right:
            x, row = left, row + 1
        y = top + 16 * row
        places.append((f"{x:.0f}", y, f"{x + 14:.0f}", y + 9))
        x += entry_width
    return places, row + 1


def multi_line_chart(
    x_labels: list[str],
    series: dict[str, list[float | None]],
    *,
    width: int = 560,
    height: int = 180,
    label: str = "",
    percent: bool = False,
) -> SafeString:
    """One line per series over shared x labels, a dot per point; None leaves a gap.

    The y axis starts at 0; series names (model versions) are escaped like any other text.
    """
    pad, bottom = 36, 34
    plot_width, plot_height = width - 2 * pad, height - pad - bottom
    numbers = [value for values in series.values() for value in values if value is not None]
    peak = max([*numbers, 0.0]) or 1.0
    step = plot_width / max(len(x_labels) - 1, 1)

    def point(index: int, value: float) -> tuple[str, str]:
        x = pad + (index * step if len(x_labels) > 1 else plot_width / 2)
        return f"{x:.1f}", f"{pad + plot_height - value / peak * plot_height:.1f}"

    lines, dots = [], []
    for number, (name, values) in enumerate(series.items()):
        css = f"s{number % SERIES_CLASSES}"
        run: list[str] = []
        for index, value in enumerate(values):
            if value is None:
                if len(run) > 1:
                    lines.append((css, " ".join(run)))
                run = []
                continue
            x, y = point(index, value)
            run.append(f"{x},{y}")
            shown = x_labels[index] if index < len(x_labels) else ""
            dots.append((css, x, y, name, shown, _fmt(value, percent)))
        if len(run) > 1:
            lines.append((css, " ".join(run)))
    places, rows = _legend_places(list(series), left=pad, right=width - pad, top=height - 14)
    legend = [
        (f"s{number % SERIES_CLASSES}", *place, name)
        for number, (name, place) in enumerate(zip(series, places, strict=True))
    ]
    ticks = [
        (f"{pad + i * step:.1f}", height - bottom + 13, text) for i, text in enumerate(x_labels)
    ]
    if len(x_labels) > 8:  # first, middle and last only, so the labels stay readable
        ticks = [ticks[0], ticks[len(ticks) // 2], ticks[-1]]
    if len(x_labels) == 1:
        ticks = [(f"{pad + plot_width / 2:.1f}", height - bottom + 13, x_labels[0])]
    return format_html(
        '<svg class="chart lines" viewBox="0 0 {w} {h}" width="{w}" height="{h}" role="img" '
        'aria-label="{label}"><rect x="{p}" y="{p}" width="{pw}" height="{ph}" class="frame"/>'
        '<text x="2" y="{top}" class="axis">{high}</text>'
        '<text x="2" y="{base}" class="axis">0</text>'
        '<text x="{p}" y="{title_y}" class="axis title">{label}</text>'
        "{lines}{dots}{ticks}{legend}</svg>",
        w=width, h=height + 16 * (rows - 1), p=pad, pw=plot_width, ph=plot_height, top=pad + 4,
        base=pad + plot_height, high=_fmt(peak, percent), label=label, title_y=pad - 8,
        lines=format_html_join("", '<polyline class="series {}" points="{}"/>', lines),
        dots=format_html_join(
            "",
            '<circle class="dot {}" cx="{}" cy="{}" r="3"><title>{} · {}: {}</title></circle>',
            dots,
        ),
        ticks=format_html_join(
            "", '<text x="{}" y="{}" class="axis" text-anchor="middle">{}</text>', ticks
        ),
        legend=format_html_join(
            "",
            '<rect class="key {}" x="{}" y="{}" width="10" height="10"/>'
            '<text x="{}" y="{}" class="axis">{}</text>',
            legend,
        ),
    )  # fmt: skip


def stacked_bar_chart(
    rows: list[tuple[str, dict[str, int]]],
    keys: list[str],
    *,
    width: int = 560,
    label: str = "",
) -> SafeString:
    """One horizontal bar per row, split by key in proportion (e.g. terminations per version).

    The legend names only the keys that occur, wrapping onto as many lines as it needs.
    """
    pad, top, row_height, label_width = 8, 24, 22, 150
    present = [key for key in keys if any(counts.get(key) for _, counts in rows)]
    legend_top = top + row_height * len(rows) + 6
    places, legend_rows = _legend_places(present, left=label_width, right=width, top=legend_top)
    height = legend_top + 16 * legend_rows + pad
    plot_width = width - label_width - 2 * pad
    segments, names = [], []
    for number, (row_label, counts) in enumerate(rows):
        total = sum(counts.values()) or 1
        y = top + number * row_height
        names.append((pad, y + 14, row_label))
        x = float(label_width)
        for key in present:
            count = counts.get(key, 0)
            if not count:
                continue
            part = count / total * plot_width
            segments.append(
                (key, f"{x:.1f}", y + 2, f"{part:.1f}", row_height - 6, row_label, key, count,
                 f"{100 * count / total:.0f}%")
            )  # fmt: skip
            x += part
    legend = [(key, *place, key) for key, place in zip(present, places, strict=True)]
    return format_html(
        '<svg class="chart stacked" viewBox="0 0 {w} {h}" width="{w}" height="{h}" role="img" '
        'aria-label="{label}"><text x="{p}" y="14" class="axis title">{label}</text>'
        "{names}{segments}{legend}</svg>",
        w=width, h=height, p=pad, label=label,
        names=format_html_join("", '<text x="{}" y="{}" class="axis">{}</text>', names),
        segments=format_html_join(
            "",
            '<rect class="part {}" x="{}" y="{}" width="{}" height="{}">'
            "<title>{}, {}: {} ({})</title></rect>",
            segments,
        ),
        legend=format_html_join(
            "",
            '<rect class="part {}" x="{}" y="{}" width="10" height="10"/>'
            '<text x="{}" y="{}" class="axis">{}</text>',
            legend,
        ),
    )  # fmt: skip
