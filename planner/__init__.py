"""RL task graph, plan simulator, searches and baselines (DESIGN §6)."""
