"""Agent runners: launch attempts of queued rollouts as local processes or Kubernetes Jobs (DESIGN.md §5).

`base` holds the seams (the store protocol, the `Backend` protocol, the data between them), `runner` the core that
claims, retries and finishes, `local` the local-process backend, `k8s` the Kubernetes one; the `runner` addon
(`agl_lite.addons.runner`) drives them. See docs/runners.md.
"""
