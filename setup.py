"""The one thing pyproject.toml cannot say: the optional C extension of the capture path's byte scans.

`optional=True`: where no C compiler or Python headers are found, the install goes on without it and
agl_lite/capture/native.py uses the same scans in Python (docs/performance.md says what that costs). The module
carries the SHA-256 of the source it was built from, so that the tests can tell a stale build (a C change that
was not rebuilt) from a current one.
"""

import hashlib
from pathlib import Path

from setuptools import Extension, setup

SOURCE = "agl_lite/capture/_native.c"
DIGEST = hashlib.sha256((Path(__file__).resolve().parent / SOURCE).read_bytes()).hexdigest()

setup(
    ext_modules=[
        Extension(
            "agl_lite.capture._native",
            [SOURCE],
            optional=True,
            extra_compile_args=["-O2", "-std=c11"],
            define_macros=[("AGL_NATIVE_SOURCE_SHA256", f'"{DIGEST}"')],
        )
    ]
)
