"""Pure checks: readings in, one-line results out (PASS/WARN/FAIL, what was found, the fix)."""
