"""Only the compiled fast path of the Kineto reader lives here; everything else is pyproject.toml.

`optional=True`: on a machine without a C compiler the install still succeeds and the reader falls
back to its pure-Python path (same frames, ~2-3x slower; analyzer/readers/kineto.py).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "moetune.analyzer.readers._kineto_scan",
            ["analyzer/readers/_kineto_scan.c"],
            optional=True,
        )
    ]
)
