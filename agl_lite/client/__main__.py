"""`python -m agl_lite.client` is `agl-client`."""

from agl_lite.client.cli import main

main()
