"""Where each press of a class went: the server's record (ui/host/press_log.py, written when the server's
environment names KVSCOPE_PRESS_LOG) read against each press's window, from the press being sent to its step's
header being sent (the "→ step sent" a class's figures are about).

Stretches nest (a wait for a turn inside the engine's pass, when long work shares its turn; a wait for a turn
inside a wait for a shared run's lock), so each instant of a press counts once, for the innermost part covering it
(`INNERMOST_FIRST`); what no stretch covers is "other": Streamlit's elements and messages, the paint gap, the
figures a view builds without the memo.
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

INNERMOST_FIRST = ("turn", "run lock", "figures", "engine")
COLUMNS = (*INNERMOST_FIRST, "other")


@dataclass(frozen=True)
class Press:
    role: str  # the student's role in the class ("light", "heavy", "evict")
    session: str  # the server's id of the student's browser session
    sent: float  # when the press was sent (the machine's monotonic clock, s)
    shown: float  # when its step's header was sent
    sent_bytes: int  # what the server sent the page from the press to the end of its run


def nearest_rank(ordered: list, share: float) -> int:
    """The index in `ordered` (sorted) of its `share` quantile, by nearest rank (0.9: the p90)."""
    return min(len(ordered) - 1, int(share * len(ordered)))


def stretches(path: Path) -> dict[str, list[tuple[str, float, float]]]:
    """The server's record by browser session: (part, start, end) each."""
    by_session: dict[str, list[tuple[str, float, float]]] = defaultdict(list)
    if path.exists():
        for line in path.read_text().splitlines():
            item = json.loads(line)
            by_session[item["session"]].append((item["part"], item["at"], item["at"] + item["seconds"]))
    return by_session


def parts_of(press: Press, record: list[tuple[str, float, float]]) -> dict[str, float]:
    """Seconds of `press`'s window (sent → shown) in each of `COLUMNS`, each instant counted once."""
    inside = [(part, max(start, press.sent), min(end, press.shown)) for part, start, end in record]
    inside = [stretch for stretch in inside if stretch[1] < stretch[2]]
    edges = sorted({press.sent, press.shown, *(t for _, start, end in inside for t in (start, end))})
    seconds = dict.fromkeys(COLUMNS, 0.0)
    for left, right in zip(edges, edges[1:]):
        covering = {part for part, start, end in inside if start <= left and right <= end}
        seconds[next((part for part in INNERMOST_FIRST if part in covering), "other")] += right - left
    return seconds


def breakdown(presses: list[Press], path: Path) -> dict[str, dict[str, str]]:
    """Per role: the typical press (the median of each part) and the slowest tenth (the mean of each part over the
    presses at or beyond the p90 of → step sent), in ms, with the MB sent."""
    record = stretches(path)
    rows: dict[str, dict[str, str]] = {}
    for role in sorted({press.role for press in presses}):
        mine = sorted((p for p in presses if p.role == role), key=lambda p: p.shown - p.sent)
        slow = mine[nearest_rank(mine, 0.9) :]
        for name, group, middle in (("typical", mine, statistics.median), ("slowest tenth", slow, statistics.fmean)):
            parts = [parts_of(p, record.get(p.session, [])) for p in group]
            cells = {column: f"{1000 * middle([part[column] for part in parts]):.0f}" for column in COLUMNS}
            cells["→ step sent"] = f"{1000 * middle([p.shown - p.sent for p in group]):.0f}"
            cells["MB sent"] = f"{middle([p.sent_bytes for p in group]) / 1e6:.2f}"
            rows[f"{role}, {name} ({len(group)})"] = cells
    return rows


def table(rows: dict[str, dict[str, str]]) -> str:
    """`breakdown`'s rows as a markdown table (ms)."""
    columns = ["→ step sent", *COLUMNS, "MB sent"]
    lines = ["| presses | " + " | ".join(columns) + " |", "|---|" + "---:|" * len(columns)]
    return "\n".join(
        lines + [f"| {name} | " + " | ".join(cells[c] for c in columns) + " |" for name, cells in rows.items()]
    )


def turns_held(roles: dict[str, str], path: Path) -> str:
    """Who the waits were behind: per role (`roles`: session id → role), the turns its pages held (opens and
    presses alike), as a markdown table: how many, the seconds in all and their share, and a turn's p50 / p90 / longest
    in ms."""
    held: dict[str, list[float]] = defaultdict(list)
    for session, record in stretches(path).items():
        held[roles.get(session, "other")] += [end - start for part, start, end in record if part == "turn held"]
    everything = sum(map(sum, held.values())) or 1.0
    lines = ["| role | turns held | s in all | share | p50 / p90 / longest, ms |", "|---|---:|---:|---:|---:|"]
    for role, spans in sorted(((r, s) for r, s in held.items() if s), key=lambda item: -sum(item[1])):
        ordered = sorted(spans)
        p50, p90 = ordered[nearest_rank(ordered, 0.5)], ordered[nearest_rank(ordered, 0.9)]
        lines.append(
            f"| {role} | {len(spans)} | {sum(spans):.0f} | {sum(spans) / everything:.0%} | "
            f"{1000 * p50:.0f} / {1000 * p90:.0f} / {1000 * ordered[-1]:.0f} |"
        )
    return "\n".join(lines)
