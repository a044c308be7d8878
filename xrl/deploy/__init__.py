"""The deployment path's stages (`xrl.api.optimize`): the typed values that pass between them.

`candidates`: one record per result the guard may write (label, the graph its file is exported from, the
file's head and weights, its rewrites), so the guard's winner carries its own file.
"""
