"""The input layer of preflight: functions that read the machine into plain readings (no verdicts)."""
