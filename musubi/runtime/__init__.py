"""What runs inside each rank: init, device binding, wrapping, loop, AMP, checkpoints."""
