"""Records of a run: its success criteria and checklist, and comparison with other runs."""
