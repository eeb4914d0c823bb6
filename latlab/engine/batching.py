"""How the model runner groups a step's short query runs for attention (torch-free, so the
simulator can count the groups a step makes without the model), and what describes a step's
cost (`step_features`: what `latlab serve --step-log` writes and the simulator charges).

Runs of at most MAX_GROUP_QUERIES new tokens of a sequence (decodes, decodes with speculative
tokens, short prompts) go first, by length, longest context first; one joins the current group
while it has as many queries and its block table is longer than 1/GROUP_SPREAD of the group's
longest: padding then costs at most that factor in KV bytes read. Each group is one attention
call per layer; longer runs are attended one chunk at a time.
"""

from __future__ import annotations

from collections.abc import Sequence

GROUP_SPREAD = 1.5
MAX_GROUP_QUERIES = 8


def query_groups(runs: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """`[start, end)` of each group of the leading short runs, given each run as `(queries,
    block-table length)` in the runner's batch order; the runs after the last group are not
    grouped."""
    groups = []
    i = 0
    while i < len(runs) and runs[i][0] <= MAX_GROUP_QUERIES:
        queries, width = runs[i]
        end = i + 1
        while end < len(runs) and runs[end][0] == queries and runs[end][1] * GROUP_SPREAD > width:
            end += 1
        groups.append((i, end))
        i = end
    return groups


def decode_groups(widths: Sequence[int]) -> list[tuple[int, int]]:
    """The groups of decodes (one query each) whose block-table lengths are `widths`,
    longest first."""
    return query_groups([(1, w) for w in widths])


def step_features(scheduled: Sequence[tuple[object, int]]) -> list[int]:
    """(tokens, decodes, prefills, sampled, decode groups, decode context, prefill attention)
    of a step the scheduler made (`(sequence, tokens)`, blocks allocated), before it runs."""
    tokens = decodes = prefills = sampled = context = attention = 0
    widths = []
    for seq, n in scheduled:
        c = seq.num_computed_tokens
        tokens += n
        if n == 1:
            decodes += 1
            context += c + 1
            widths.append(len(seq.block_table))
        else:
            prefills += 1
            attention += n * (c + n)
        if c + n == seq.num_tokens:
            sampled += 1
    widths.sort(reverse=True)
    return [tokens, decodes, prefills, sampled, len(decode_groups(widths)), context, attention]
