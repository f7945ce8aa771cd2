"""`python -m agl_lite` is `agl-lite`."""

from agl_lite.cli import main

main()
