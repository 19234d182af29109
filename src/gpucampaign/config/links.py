"""The calendar's ``after`` links checked: unique step names, known targets, no cycle."""

from __future__ import annotations

from collections import Counter

from gpucampaign.config.lots import Step


def check_links(calendar: tuple[Step, ...]) -> None:
    """Unique step names, ``after`` links to known steps, and no cycle.

    O(steps + links): one dict of names, one pass over the links, and a cycle search only when
    some step waits for a step below it in the table (links that all point up cannot close a
    cycle). The search itself (Kahn's algorithm) is linear too; the depth-first walk that names
    the cycle runs only when there is one.
    """
    names = [s.name for s in calendar]
    index = {n: i for i, n in enumerate(names)}
    if len(index) != len(names):
        dup = sorted(n for n, k in Counter(names).items() if k > 1)
        raise ValueError(f"calendar: duplicate step name(s) {dup}; give every step a unique name")
    backward = True
    for i, s in enumerate(calendar):
        for a in s.after:
            j = index.get(a)
            if j is None:
                missing = [a for a in s.after if a not in index]
                raise ValueError(
                    f"calendar step '{s.name}': 'after' names unknown step(s) {missing}; "
                    f"use names of steps in the calendar"
                )
            if j >= i:
                backward = False
    if backward or _acyclic([[index[a] for a in s.after] for s in calendar]):
        return
    cycle = _find_cycle({s.name: s.after for s in calendar})
    raise ValueError(
        "calendar: the 'after' links form a cycle "
        + " -> ".join(cycle)
        + "; remove one of these links"
    )


def _acyclic(after: list[list[int]]) -> bool:
    """Kahn's algorithm on indices: True when every step can be ordered after what it waits for."""
    waiting = [len(a) for a in after]
    dependents: list[list[int]] = [[] for _ in after]
    for i, a in enumerate(after):
        for d in a:
            dependents[d].append(i)
    ready = [i for i, n in enumerate(waiting) if n == 0]
    done = 0
    while ready:
        i = ready.pop()
        done += 1
        for j in dependents[i]:
            waiting[j] -= 1
            if waiting[j] == 0:
                ready.append(j)
    return done == len(after)


def _find_cycle(graph: dict[str, tuple[str, ...]]) -> list[str]:
    """One cycle of ``graph`` as names (the first repeated at the end), ``[]`` when none.

    Depth-first, iterative, O(steps + links); run only to name a cycle already found.
    """
    color: dict[str, int] = {}
    for root in graph:
        if color.get(root):
            continue
        stack: list[tuple[str, int]] = [(root, 0)]
        path: list[str] = []
        while stack:
            node, i = stack.pop()
            if i == 0:
                color[node] = 1
                path.append(node)
            deps = graph[node]
            if i < len(deps):
                stack.append((node, i + 1))
                nxt = deps[i]
                if color.get(nxt) == 1:
                    return path[path.index(nxt) :] + [nxt]
                if not color.get(nxt):
                    stack.append((nxt, 0))
            else:
                color[node] = 2
                path.pop()
    return []
