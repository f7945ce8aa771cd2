"""The built-in addons, one per module (they never import each other: they talk through `flow.metadata`), and
the chain a gateway runs when its config names none, as mitmproxy's `addons/__init__.py` holds `default_addons()`.

The core knows no addon by name: whoever loads a config for the product (`agl_lite.service.load_config`) hands it
`DEFAULT_CHAIN`, and whoever builds a chain hands it `ADDONS` to resolve the short names.
"""

__all__ = ["ADDONS", "DEFAULT_CHAIN"]

ADDONS: dict[str, str] = {
    "store": "agl_lite.addons.store:Storage",
    "auth": "agl_lite.addons.auth:Auth",
    "store_api": "agl_lite.addons.store_api:StoreApi",
    "dashboard": "agl_lite.addons.dashboard:Dashboard",
    "metrics": "agl_lite.addons.metrics:Metrics",
    "control": "agl_lite.addons.control:Control",
    "route": "agl_lite.addons.router:Router",
    "anthropic": "agl_lite.addons.anthropic:Anthropic",
    "responses": "agl_lite.addons.responses:Responses",
    "capture": "agl_lite.addons.capture:Capture",
    "tokens": "agl_lite.addons.tokens:Tokens",
    "sink": "agl_lite.addons.sink:Sink",
    "runner": "agl_lite.addons.runner:AgentRunner",
}
"""Short name → import string of every built-in addon (imported only when a chain names it)."""

DEFAULT_CHAIN: tuple[str, ...] = (
    "store",
    "auth",
    "store_api",
    "dashboard",
    "control",
    "metrics",
    "route",
    "anthropic",
    "responses",
    "capture",
    "tokens",
    "sink",
)
"""The addon chain when the config names none. Order matters: the store first (others look it up), auth on every
flow, then the addons that answer their own paths, then the LLM path (pause, route, the Anthropic and Responses
translations, capture, tokens) and the sink that commits the captured call."""
