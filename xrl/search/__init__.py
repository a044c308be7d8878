"""Searches over rewrites: greedy, random, TASO's backtracking, Tensat's equality saturation, RL.

Each takes a Graph, a cost model and (for the rewrite-based ones) a RewriteEngine, and returns a
`SearchResult`. Import a search from its module (`xrl.search.greedy`, ...): this package imports
nothing heavy by itself. `xrl.search.registry` is the table of searches by name that `xrl optimize
--search`, `xrl compare` and the API run them through (`register_search`, the `xrl.searches` entry points).
"""

from xrl.search.result import SearchResult

__all__ = ["SearchResult"]
