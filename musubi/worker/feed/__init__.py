"""What feeds a rank: loaders, the resumable sampler, loader worker plans and probes."""
