"""Optuna wiring: study set-up and resume checks, sampler, budget, outcomes, leases and reaping."""
