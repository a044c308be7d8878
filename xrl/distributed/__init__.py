"""xrl on a Ray cluster (`pip install 'xrl[ray]'`; docs/ray.md).

    ray_collector   RayCollector: rollouts on Ray actors behind the RolloutCollector interface (the collector
                    `ray` of the entry-point group xrl.collectors, declared in pyproject.toml)
    ray_service     measurement actors (RemoteCostModel) and the cluster's shared op-timing cache

Ray is imported inside these modules only: `import xrl` never needs it.
"""
