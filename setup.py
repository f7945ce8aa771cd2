"""The one thing pyproject.toml cannot say: the optional C extension of the capture path's byte scans.

`optional=True`: where no C compiler or Python headers are found, the install goes on without it and
agl_lite/capture/native.py uses the same scans in Python (docs/performance.md says what that costs).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "agl_lite.capture._native",
            ["agl_lite/capture/_native.c"],
            optional=True,
            extra_compile_args=["-O2", "-std=c11"],
        )
    ]
)
