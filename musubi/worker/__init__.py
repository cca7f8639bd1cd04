"""What runs inside each rank: world and device binding, wrapping, the trainer and its step, AMP, LR, RNG."""
