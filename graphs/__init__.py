"""Built-in benchmark graphs (imported as xrl.graphs)."""
