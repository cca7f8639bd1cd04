"""DCP save/load, async staging, the COMMITTED marker, safe reading and resume (the trainer decides when)."""
