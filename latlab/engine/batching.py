"""How the model runner batches a step's decodes for attention (torch-free, so the
simulator can count the groups a step makes without the model).

Decodes go longest context first; one joins the current group while its block table is longer
than 1/GROUP_SPREAD of the group's longest: padding then costs at most that factor in KV bytes
read. Each group is one attention call per layer.
"""

from __future__ import annotations

from typing import Sequence

GROUP_SPREAD = 1.5


def decode_groups(widths: Sequence[int]) -> list[tuple[int, int]]:
    """`[start, end)` of each group of decodes whose block-table lengths are `widths`,
    longest first."""
    groups = []
    start = 0
    while start < len(widths):
        end = start + 1
        while end < len(widths) and widths[end] * GROUP_SPREAD > widths[start]:
            end += 1
        groups.append((start, end))
        start = end
    return groups
