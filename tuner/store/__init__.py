"""Our tables beside Optuna's: build cache, measurements, environments, artifacts, leases, studies."""
