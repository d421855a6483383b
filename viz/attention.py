"""Attention over the KV cache: heatmaps per head, all heads of a layer, the newest row, GQA sharing."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from viz.style import OKABE_ITO, SEQUENTIAL, finish, first_screen_height, kv_head_color, position_ticks, window
from viz.words import ENGLISH, Words


def heatmap_figure(
    matrix: np.ndarray,
    labels: list[str],
    title: str = "",
    large: bool = False,
    value_name: str = "p",
    zmin: float | None = 0.0,
    zmax: float | None = None,
    words: Words = ENGLISH,
    sliding_window: int | None = None,
) -> go.Figure:
    """A causal attention matrix (query rows × key columns); the masked future is blank (NaN or −inf). For a
    sliding-window layer, the keys before each query's window are blank too, and the window's edge is drawn."""
    n = matrix.shape[0]
    shown = window(n)
    sub = np.array(matrix[shown, shown], dtype=float)
    queries, keys = np.arange(shown.start, shown.stop)[:, None], np.arange(shown.start, shown.stop)[None, :]
    masked = keys > queries  # the causal mask: a query never sees later keys, drawn blank
    if sliding_window is not None:
        masked |= keys <= queries - sliding_window  # a local layer's query reads only its last `sliding_window` keys
    sub[masked | ~np.isfinite(sub)] = np.nan
    ticks = position_ticks(labels, shown)
    fig = go.Figure(
        go.Heatmap(
            z=sub,
            x=ticks,
            y=ticks,
            colorscale=SEQUENTIAL,
            zmin=zmin,
            zmax=zmax,
            hovertemplate=words["query"]
            + " %{y}<br>"
            + words["key"]
            + " %{x}<br>"
            + value_name
            + " = %{z:.3f}<extra></extra>",
            colorbar=dict(title=value_name),
        )
    )
    fig.update_layout(
        yaxis=dict(autorange="reversed", title=words["query_axis"]), xaxis=dict(title=words["key_axis"], tickangle=-60)
    )
    if sliding_window is not None:
        window_edge(fig, shown, sliding_window, words)
    return finish(fig, title, large, height=first_screen_height(large))  # the view's main figure


def window_edge(fig: go.Figure, shown: slice, sliding_window: int, words: Words) -> None:
    """A sliding window's left edge over the heatmap: a staircase left of each row's first readable key, where the
    window has begun to slide (category axes take cell indices, so ±0.5 is a cell's border)."""
    path = []
    for row, query in enumerate(range(shown.start, shown.stop)):
        first = query - sliding_window + 1 - shown.start  # the row's first key, as a cell index
        if first > 0:
            path.append(f"{'M' if not path else 'L'} {first - 0.5},{row - 0.5} L {first - 0.5},{row + 0.5}")
    if path:  # a window wider than the drawn positions has no edge in the picture: the words still say it
        fig.add_shape(
            type="path", path=" ".join(path), xref="x", yref="y", line=dict(color=OKABE_ITO["vermillion"], width=3)
        )
    fig.add_annotation(
        x=0,
        y=1,
        xref="paper",
        yref="paper",
        xanchor="left",
        yanchor="bottom",
        showarrow=False,
        text=words["window_edge"].format(w=f"{sliding_window:,}"),
        font=dict(color=OKABE_ITO["vermillion"]),
    )


def head_grid_figure(
    rows: np.ndarray, labels: list[str], group: int, title: str = "", large: bool = False
) -> go.Figure:
    """All Q heads' newest attention rows (q_heads × L), heads sharing a KV head drawn side by side in
    that KV head's colour (the GQA diagram's). One y range for all, up to the largest weight shown, so
    the heads compare and a diffuse row is not flattened against an axis up to 1."""
    q_heads, length = rows.shape
    shown = window(length)
    ticks = position_ticks(labels, shown)
    top = float(np.nanmax(rows[:, shown])) if length else 1.0
    y_range = [0, 1.05 * top if top > 0 else 1.0]
    cols = min(q_heads, 4)
    grid_rows = -(-q_heads // cols)
    cells = grid_cells(grid_rows, cols, q_heads)
    traces, layout, titles = [], {}, []
    for h, (x_domain, y_domain) in enumerate(cells):
        axis = "" if h == 0 else str(h + 1)
        traces.append(
            dict(
                type="bar",
                x=ticks,
                y=rows[h, shown],
                marker_color=kv_head_color(h // group),
                hovertemplate="%{x}: %{y:.3f}<extra>Q" + str(h) + "</extra>",
                showlegend=False,
                xaxis="x" + axis,
                yaxis="y" + axis,
            )
        )
        layout["xaxis" + axis] = dict(domain=x_domain, anchor="y" + axis, showticklabels=False)
        # one range for all: the first column's numbers read for its row, and on a phone the others' would lie on
        # the plot beside them
        layout["yaxis" + axis] = dict(domain=y_domain, anchor="x" + axis, range=y_range, showticklabels=h % cols == 0)
        titles.append(
            dict(
                text=f"Q{h} → KV{h // group}",
                x=sum(x_domain) / 2,
                y=y_domain[1],
                xref="paper",
                yref="paper",
                xanchor="center",
                yanchor="bottom",
                showarrow=False,
            )
        )
    # One construction: laying out subplots one call at a time cost ~0.25 s a figure, most of a step's drawing.
    fig = go.Figure(traces, layout=dict(layout, annotations=titles))
    return finish(fig, title, large, height=180 * grid_rows + 60)


def grid_cells(rows: int, cols: int, count: int, vertical_spacing: float = 0.12) -> list[tuple[list, list]]:
    """(x domain, y domain) of the first `count` cells of a rows × cols grid, row by row from the top, spaced as
    Plotly's subplots are (a fifth of the width between columns)."""
    horizontal_spacing = 0.2 / cols
    width = (1 - horizontal_spacing * (cols - 1)) / cols
    height = (1 - vertical_spacing * (rows - 1)) / rows
    cells = []
    for i in range(count):
        row, col = divmod(i, cols)
        left = col * (width + horizontal_spacing)
        top = 1 - row * (height + vertical_spacing)
        cells.append(([max(0.0, left), min(1.0, left + width)], [max(0.0, top - height), min(1.0, top)]))
    return cells


def newest_row_figure(
    row: np.ndarray, labels: list[str], title: str = "", large: bool = False, value_name: str = "p"
) -> go.Figure:
    """The newest token's attention over every cached token, as bars."""
    shown = window(len(row))
    ticks = position_ticks(labels, shown)
    fig = go.Figure(
        go.Bar(
            x=ticks, y=row[shown], marker_color=OKABE_ITO["vermillion"], hovertemplate="%{x}: %{y:.3f}<extra></extra>"
        )
    )
    fig.update_layout(xaxis=dict(tickangle=-60), yaxis=dict(title=value_name))
    return finish(fig, title, large, height=360)


def gqa_figure(q_heads: int, kv_heads: int, title: str = "", large: bool = False) -> go.Figure:
    """Lines from each Q head to the KV head it reads: q_heads / kv_heads Q heads share one K/V. Each KV
    head and its lines have that head's colour, as in the all-heads chart."""
    group = q_heads // kv_heads
    fig = go.Figure()
    for h in range(q_heads):
        kv = h // group
        fig.add_trace(
            go.Scatter(
                x=[0, 1],
                y=[h, kv * group + (group - 1) / 2],
                mode="lines",
                line=dict(color=kv_head_color(kv), width=2),
                hoverinfo="skip",
                showlegend=False,
            )
        )
    fig.add_trace(
        go.Scatter(
            x=[0] * q_heads,
            y=list(range(q_heads)),
            mode="markers+text",
            text=[f"Q{h}" for h in range(q_heads)],
            textposition="middle left",
            marker=dict(size=12, color=OKABE_ITO["grey"]),
            showlegend=False,
            hoverinfo="skip",
        )
    )
    fig.add_trace(
        go.Scatter(
            x=[1] * kv_heads,
            y=[k * group + (group - 1) / 2 for k in range(kv_heads)],
            mode="markers+text",
            text=[f"K/V{k}" for k in range(kv_heads)],
            textposition="middle right",
            marker=dict(size=18, color=[kv_head_color(k) for k in range(kv_heads)], symbol="square"),
            showlegend=False,
            hoverinfo="skip",
        )
    )
    fig.update_xaxes(visible=False, range=[-0.4, 1.4])
    fig.update_yaxes(visible=False, autorange="reversed")
    return finish(fig, title, large, height=max(220, 26 * q_heads + 60))


def focused_head(rows: np.ndarray) -> tuple[int, int]:
    """A (layer, head) whose attention shows a clear pattern, for the page to open on.

    rows: (layers, q_heads, L) attention weights of one query (e.g. the newest). Among the middle half of
    the layers (the first layers attend diffusely), the head that puts the most weight on one earlier
    token in the cache: not position 0, where many heads park their weight (a "sink") and show nothing,
    and not the query's own position. With fewer than 3 positions, (0, 0).
    """
    layers, _, length = rows.shape
    if length < 3:
        return 0, 0
    lo, hi = layers // 4, max(layers // 4 + 1, (3 * layers) // 4)
    focus = np.asarray(rows[lo:hi, :, 1:-1], dtype=float).max(-1)  # (hi - lo, q_heads)
    layer, head = np.unravel_index(int(np.argmax(focus)), focus.shape)
    return lo + int(layer), int(head)
