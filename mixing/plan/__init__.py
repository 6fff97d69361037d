"""The plan: length statistics, the curriculum's per-step quotas, document draws, the realized mixture."""
