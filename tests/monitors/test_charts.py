"""The monitors' charts: a legend of long names (versions, terminations) wraps instead of
overlapping."""

import re
from itertools import pairwise

from reviewapp.charts import AXIS_CHAR_WIDTH, multi_line_chart, stacked_bar_chart

LONG = [f"support-agent-lessons-2-v{n}" for n in range(1, 4)]
LEGEND_TEXT = r'<text x="([\d.]+)" y="(\d+)" class="axis">([^<]+)</text>'


def test_long_version_names_wrap_onto_rows_that_never_overlap():
    svg = str(multi_line_chart(["d1"], {name: [1.0] for name in [*LONG, "base"]}))

    rows: dict[str, list[tuple[float, str]]] = {}
    for x, y, name in re.findall(LEGEND_TEXT, svg):
        if name in [*LONG, "base"]:
            rows.setdefault(y, []).append((float(x), name))
    assert len(rows) > 1  # 3 long names do not fit one 560-pixel row
    for row in rows.values():
        for (x, name), (next_x, _) in pairwise(row):
            assert next_x >= x + AXIS_CHAR_WIDTH * len(name)
    assert 'height="196"' in svg  # one more row of 16 pixels than the default 180
    assert '<text x="280.0" y="159" class="axis" text-anchor="middle">d1</text>' in svg


def test_short_names_keep_one_row_and_the_default_height():
    svg = str(multi_line_chart(["d1"], {"v1": [1.0], "v2": [2.0]}))

    assert 'height="180"' in svg
    assert len(set(re.findall(r'<rect class="key s\d" x="\d+" y="(\d+)"', svg))) == 1


def test_a_stacked_bar_legend_of_long_keys_never_overlaps():
    keys = ["completed", "client_disconnected", "tool_error", "max_steps", "timeout"]
    svg = str(stacked_bar_chart([("v1", dict.fromkeys(keys, 1))], keys))

    rows: dict[str, list[tuple[float, str]]] = {}
    for x, y, name in re.findall(LEGEND_TEXT, svg):
        if name in keys:
            rows.setdefault(y, []).append((float(x), name))
    assert sum(len(row) for row in rows.values()) == len(keys)
    for row in rows.values():
        for (x, name), (next_x, _) in pairwise(row):
            assert next_x >= x + AXIS_CHAR_WIDTH * len(name)
