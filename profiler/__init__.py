"""Microbenchmarks of devices, collectives, links and RL tasks, written as raw samples (DESIGN §3)."""
