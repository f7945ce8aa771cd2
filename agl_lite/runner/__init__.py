"""Agent runners: launch attempts of queued rollouts as local processes or Kubernetes Jobs (DESIGN.md §5)."""
