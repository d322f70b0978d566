"""GPU-machine runner for the Inductor backend: studies, side-by-side comparison, scaling check."""
