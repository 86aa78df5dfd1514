"""Inline SVG charts for `gpugate report`: pure functions from numbers to markup.

No script, no external asset, no style sheet: each chart is one `<svg>` with a `<title>` (what
a screen reader says) and every label escaped (check ids, categories and node counts come from
files anyone able to write a job log can influence).
"""

from __future__ import annotations

from html import escape

from gpugate.text import printable

# Colour-blind-safe (Okabe-Ito), then greys: series beyond these reuse them.
PALETTE = ("#0072b2", "#e69f00", "#009e73", "#d55e00", "#cc79a7", "#56b4e9", "#f0e442",
           "#000000", "#999999")  # fmt: skip
FONT = 'font-family="system-ui,sans-serif" font-size="12"'
TITLE_H = 24  # the caption's row above each plot


def label(value: object) -> str:
    """Text for an SVG element: printable and escaped (quotes too)."""
    return escape(printable(value), quote=True)


def colour(i: int) -> str:
    """The i-th series' colour."""
    return PALETTE[i % len(PALETTE)]


def _num(v: float) -> str:
    return f"{v:.1f}".rstrip("0").rstrip(".") if isinstance(v, float) else str(v)


def short(value: object, most: int = 24) -> str:
    """A label cut to `most` characters (an ellipsis says so; the tooltip has it whole)."""
    text = printable(value)
    return text if len(text) <= most else text[: most - 1] + "\u2026"


def _svg(cls: str, title: str, width: int, height: int, body: list[str]) -> str:
    # The title is drawn above the plot (what a person sees) and is the <title> (what a
    # screen reader says). No xmlns: inline SVG in HTML needs none, and the page names no URL.
    return (
        f'<svg class="chart {cls}" role="img" width="{width}" height="{height + TITLE_H}" '
        f'viewBox="0 0 {width} {height + TITLE_H}" aria-label="{label(title)}">'
        f"<title>{label(title)}</title>"
        f'<text class="caption" x="8" y="16" font-weight="600" {FONT}>{label(title)}</text>'
        f'<g transform="translate(0,{TITLE_H})">{"".join(body)}</g></svg>'
    )


def hbars(title: str, items: list[tuple[str, float]], unit: str = "", width: int = 640) -> str:
    """Horizontal bars, one per (label, value), in the order given."""
    row, left, right = 22, 170, 70
    height = max(1, len(items)) * row + 10
    top = max((v for _, v in items), default=0) or 1
    body = []
    for i, (name, value) in enumerate(items):
        y = 5 + i * row
        w = max(0.0, value) / top * (width - left - right)
        body.append(
            f'<text x="{left - 6}" y="{y + 15}" text-anchor="end" {FONT}>{label(short(name))}</text>'
            f'<rect class="bar" x="{left}" y="{y + 3}" width="{w:.1f}" height="{row - 6}" '
            f'fill="{colour(0)}"><title>{label(name)}: {label(_num(value))}{label(unit)}</title></rect>'
            f'<text x="{left + w + 4:.1f}" y="{y + 15}" {FONT}>{label(_num(value))}{label(unit)}</text>'
        )
    return _svg("hbars", title, width, height, body)


def vbars(title: str, items: list[tuple[str, float]], x_title: str = "", width: int = 640) -> str:
    """Vertical bars, one per (label, value), in the order given, the label under each."""
    height, bottom, top_pad = 200, 40, 18
    slot = (width - 20) / max(1, len(items))
    top = max((v for _, v in items), default=0) or 1
    body = []
    for i, (name, value) in enumerate(items):
        h = max(0.0, value) / top * (height - bottom - top_pad)
        x = 10 + i * slot + slot * 0.15
        y = height - bottom - h
        body.append(
            f'<rect class="bar" x="{x:.1f}" y="{y:.1f}" width="{slot * 0.7:.1f}" height="{h:.1f}" '
            f'fill="{colour(0)}"><title>{label(name)}: {label(_num(value))}</title></rect>'
            f'<text x="{x + slot * 0.35:.1f}" y="{y - 4:.1f}" text-anchor="middle" {FONT}>'
            f"{label(_num(value))}</text>"
            f'<text x="{x + slot * 0.35:.1f}" y="{height - bottom + 15}" text-anchor="middle" '
            f"{FONT}>{label(short(name, 10))}</text>"
        )
    body.append(f'<text x="{width / 2:.0f}" y="{height - 6}" text-anchor="middle" {FONT}>'
                f"{label(x_title)}</text>")  # fmt: skip
    return _svg("vbars", title, width, height, body)


def stacked_bars(
    title: str, columns: list[str], series: dict[str, list[float]], width: int = 760
) -> str:
    """Vertical bars per column, stacked by series (name -> one value per column), a legend."""
    height, bottom, legend_w = 220, 40, 170
    plot_w = width - legend_w - 20
    slot = plot_w / max(1, len(columns))
    totals = [sum(vals[i] for vals in series.values()) for i in range(len(columns))]
    top = max(totals, default=0) or 1
    body = []
    for i, col in enumerate(columns):
        x, y = 10 + i * slot + slot * 0.1, float(height - bottom)
        for k, (name, vals) in enumerate(series.items()):
            h = max(0.0, vals[i]) / top * (height - bottom - 18)
            if h <= 0:
                continue
            y -= h
            body.append(
                f'<rect class="seg" x="{x:.1f}" y="{y:.1f}" width="{slot * 0.8:.1f}" '
                f'height="{h:.1f}" fill="{colour(k)}"><title>{label(col)} {label(name)}: '
                f"{label(_num(vals[i]))}</title></rect>"
            )
        if len(columns) <= 16 or i % max(1, len(columns) // 8) == 0:  # labels that fit
            body.append(f'<text x="{x + slot * 0.4:.1f}" y="{height - bottom + 15}" '
                        f'text-anchor="middle" {FONT}>{label(col)}</text>')  # fmt: skip
    for k, name in enumerate(series):
        y = 10 + k * 18
        body.append(
            f'<rect x="{width - legend_w}" y="{y}" width="12" height="12" fill="{colour(k)}"/>'
            f'<text x="{width - legend_w + 18}" y="{y + 11}" {FONT}>{label(short(name))}</text>'
        )
    return _svg("stacked", title, width, max(height, 20 + 18 * len(series)), body)
