"""Only the compiled fast paths live here (the Kineto reader's scanner, the timeline graph's
loops: cycle check, critical-path walk and the what-if replay); everything else is pyproject.toml.

`optional=True`: on a machine without a C compiler the install still succeeds and each falls back
to its pure-Python path (same results, slower; analyzer/readers/kineto_scan.py, analyzer/graph.py
`_acyclic`, analyzer/critical_path.py `_walk_py`, analyzer/replay.py `_replay_py`).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "moetune.analyzer.readers._kineto_scan",
            ["analyzer/readers/_kineto_scan.c"],
            optional=True,
        ),
        Extension(
            "moetune.analyzer._graph_loops",
            ["analyzer/_graph_loops.c"],
            optional=True,
        ),
    ]
)
