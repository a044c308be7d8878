"""The deployment path's stages (`xrl.api.optimize`), each a function that returns one typed value.

`deployment`: the target, device, threads, cost model and timers (`Deployment`). `starts`: exact merges
(`exact_merges`: the rules tagged `exact_merge`), the pre-pass chain, each peer pass alone, the pre-check
(`Starts`). `search`: the search from the starts,
its file verified (`Searched`). `candidates`: one record per result the guard may write (`Candidate`,
from `xrl.search.exported`: label, graph, the file's head and weights, its rewrites), so the guard's winner
carries its own file.
`guard`: the guard's timing and what is written (`Written`), and the written file's measurement.
`clock`: each stage's wall seconds.
"""
