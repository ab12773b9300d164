"""The what-if section's own cost on one trace: the episode build, and every replay a diagnosis
makes, compiled (`_graph_loops.replay`) against the Python loop (`replay._replay_py`) on the same
episodes and edits (their results are checked equal).

    python bench/bench_whatif.py TRACE     # e.g. the x16 replica bench_kineto.py writes
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", type=Path)
    a = ap.parse_args(argv)
    from moetune.analyzer import replay as graph_replay
    from moetune.analyzer import whatif

    from moetune.analysis import analyze
    from moetune.errors import UserError

    if graph_replay._replay_c is None:
        print("the compiled extension is not built (pip install -e .)", file=sys.stderr)
        return 2
    spent = {"episode": 0.0, "compiled": 0.0, "python": 0.0}
    calls = [0]
    compiled, build = graph_replay.replay, whatif.episode

    def episode(*args, **kw):
        t = time.perf_counter()
        try:
            return build(*args, **kw)
        finally:
            spent["episode"] += time.perf_counter() - t

    def replay(ep, edit, host_scale=1.0):
        t0 = time.perf_counter()
        c = compiled(ep, edit, host_scale)
        t1 = time.perf_counter()
        p = graph_replay._replay_py(ep, edit, host_scale)
        spent["compiled"] += t1 - t0
        spent["python"] += time.perf_counter() - t1
        calls[0] += 1
        assert c == p, (c, p)
        return c

    # every caller: the section's episode and estimates (whatif), the host-scale bisection (replay)
    whatif.episode, whatif.replay, graph_replay.replay = episode, replay, replay
    try:
        nodes = (analyze(a.trace).diagnosis.get("whatif") or {}).get("nodes", 0)
    except UserError as exc:
        print(f"bench_whatif.py: {exc}", file=sys.stderr)
        return 2
    print(f"{a.trace.name}: episode of {nodes} nodes {spent['episode']:.3f} s; {calls[0]} replays:"
          f" compiled {spent['compiled'] * 1e3:.1f} ms, Python {spent['python'] * 1e3:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
