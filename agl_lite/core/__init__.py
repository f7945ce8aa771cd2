"""The gateway core: flow, hooks, addon manager, server, upstream, SSE, config, routes, registry, tasks."""
