"""Diagnosis from telemetry: straggler detection, bottleneck labels with evidence, the HTML report."""
