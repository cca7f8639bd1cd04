"""Surviving faults: OOM and numerical guards, the watchdog, fault injection, goodput and repeated failures."""
