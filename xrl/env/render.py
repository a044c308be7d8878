"""A picture of the region a rewrite changed: the added nodes, and the nodes one edge away from them.

networkx lays the region out (`multipartite_layout` by topological depth, so data flows left to right)
and matplotlib (Agg, no display needed) draws it: added nodes in orange, their neighbours in grey.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np

from xrl.ir import Graph


def region(graph: Graph, focus: Iterable[str]) -> tuple[set[str], set[str]]:
    """(focus nodes present in `graph`, their producers and consumers)."""
    core = {n for n in focus if n in graph.nodes}
    around: set[str] = set()
    for name in core:
        node = graph.nodes[name]
        for v in node.inputs:
            p = graph.producer(v) if v else None
            if p is not None:
                around.add(p.name)
        for v in node.outputs:
            around.update(c.name for c in graph.consumers.get(v, ()))
    return core, around - core


def draw_region(graph: Graph, focus: Iterable[str], *, title: str = "") -> np.ndarray:
    """An RGB image (H, W, 3, uint8) of the rewritten region of `graph`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import networkx as nx

    core, around = region(graph, focus)
    names = core | around
    g = nx.DiGraph()
    depth: dict[str, int] = {}
    for node in graph.topological_order:  # depth inside the region: longest path from its sources
        if node.name not in names:
            continue
        preds = {p.name for v in node.inputs if v and (p := graph.producer(v)) is not None and p.name in names}
        depth[node.name] = 1 + max((depth[p] for p in preds), default=-1)
        g.add_node(node.name, layer=depth[node.name], label=f"{node.op}\n{node.name[:18]}")
        g.add_edges_from((p, node.name) for p in preds)
    fig, ax = plt.subplots(figsize=(8, 5), dpi=80)
    if g.number_of_nodes():
        pos = nx.multipartite_layout(g, subset_key="layer")
        colors = ["#f28e2b" if n in core else "#bab0ac" for n in g.nodes]
        nx.draw_networkx(g, pos, ax=ax, labels=nx.get_node_attributes(g, "label"), node_color=colors,
                         node_size=1400, font_size=7, arrows=True)
    else:
        ax.text(0.5, 0.5, "no rewrite yet", ha="center", va="center")
    ax.set_title(title, fontsize=9)
    ax.axis("off")
    fig.tight_layout()
    fig.canvas.draw()
    image = np.asarray(fig.canvas.buffer_rgba())[..., :3].copy()
    plt.close(fig)
    return image


def save_region(graph: Graph, focus: Iterable[str], path: str | Path, *, title: str = "") -> Path:
    """Write the picture of the rewritten region as a PNG."""
    import matplotlib.pyplot as plt

    path = Path(path)
    plt.imsave(path, draw_region(graph, focus, title=title))
    return path
