"""The VERL bridge: triplets, trajectory merge and AglLiteDaemon (DESIGN.md §6)."""
