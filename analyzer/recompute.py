"""Where non-reentrant activation checkpointing re-runs the forward inside backward.

torch.utils.checkpoint without reentrance (PyTorch's default; torchtitan, FSDP2) records no scope
of its own. In the forward it saves holders instead of tensors (`_checkpoint_hook.pack_hook`); in
backward the first autograd node that unpacks one of them (`_checkpoint_hook.unpack_hook`, called
from the node's apply before its own gradient math) re-runs the checkpointed forward under
`_recomputation_hook`, whose `pack_hook` detaches every tensor the re-run saves, and stops right
after the last one (early stop). A profile therefore shows, inside the node's op
(`AddmmBackward0`, on autograd's device thread with CUDA, on the one thread on CPU): the re-run
forward first — its ops at the top level of the node, each op that saved a tensor with an
`aten::detach` inside — then the node's own gradient ops (`aten::t`, `aten::mm`, …), which save
nothing.

So the re-run spans from the node's start to the end of its last top-level op holding a detach
(`kernel_classes.yaml` `recompute.repack_ops`), whatever the re-run ops are called (grouped GEMMs,
element-wise products, extension ops), not only the forward-only ops that reveal it
(`recompute.forward_ops`, which must be there for a node to count: a node with a detach inside
and no forward op, such as CUDA-graph replay's `GraphedBackward`, re-runs nothing). Without a
detach inside (a writer that drops them), the span ends with the last forward-only op.
"""

from __future__ import annotations

import polars as pl
from moetune.analyzer.classify import KernelClasses, match_expr
from moetune.analyzer.intervals import END, START

BY = ["rank", "tid"]


def rerun_regions(events: pl.DataFrame, ops: pl.DataFrame, classes: KernelClasses
                  ) -> pl.DataFrame:
    """rank, tid, START, END of the forward re-runs inside backward nodes (module doc). `ops`:
    `walls.recompute_ops` of `events` (flags `backward`, `in_backward`)."""
    empty = pl.DataFrame(schema={"rank": pl.Int32, "tid": pl.Int64, START: pl.Int64,
                                 END: pl.Int64})
    fwd = ops.filter(pl.col("in_backward"))
    if fwd.height == 0:
        return empty
    nodes = ops.filter(pl.col("backward")).select(
        *BY, n0=pl.col("ts_ns"), n1=pl.col("ts_ns") + pl.col("dur_ns")).sort("n0")
    # each re-run forward op's innermost backward op: nodes nest inside their
    # `evaluate_function` wrappers, so the latest-starting one that still contains it
    inner = (fwd.select(*BY, "ts_ns", f1=pl.col("ts_ns") + pl.col("dur_ns")).sort("ts_ns")
             .join_asof(nodes, left_on="ts_ns", right_on="n0", by=BY, strategy="backward",
                        check_sortedness=False)
             .filter(pl.col("n1").is_not_null() & (pl.col("ts_ns") < pl.col("n1"))))
    if inner.height == 0:
        return empty
    per_node = inner.group_by(*BY, "n0", "n1").agg(fwd_end=pl.col("f1").max())
    repack = classes.repack_ops
    lo, hi = per_node.get_column("n0").min(), per_node.get_column("n1").max()
    host = (events.lazy()
            .filter(pl.col("kind").is_in(["cpu_op", "annotation"]) & (pl.col("ts_ns") > lo)
                    & (pl.col("ts_ns") < hi))
            .join(per_node.lazy().select(*BY).unique(), on=BY, how="semi")
            .select(*BY, "name", "ts_ns", end=pl.col("ts_ns") + pl.col("dur_ns"))
            .collect().sort("ts_ns"))
    inside = (host.join_asof(per_node.select(*BY, "n0", "n1").sort("n0"), left_on="ts_ns",
                             right_on="n0", by=BY, strategy="backward", check_sortedness=False)
              .filter(pl.col("n1").is_not_null() & (pl.col("ts_ns") > pl.col("n0"))
                      & (pl.col("ts_ns") < pl.col("n1"))))
    node = [*BY, "n0"]
    # the node's top-level ops: each starts at or after every earlier op inside the node ended
    # (ties: the enclosing op, the longer, first)
    inside = inside.sort(*node, "ts_ns", pl.col("end"), descending=[False] * 4 + [True])
    prior = pl.col("end").cum_max().shift(1).over(node)
    top = inside.with_columns(
        _top=(pl.col("ts_ns") >= prior).fill_null(True),
        _rep=match_expr(repack) if repack else pl.lit(False),
    ).with_columns(_grp=pl.col("_top").cum_sum().over(node))
    rerun_end = (top.group_by(*node, "_grp").agg(end=pl.col("end").max(), rep=pl.col("_rep").any())
                 .filter(pl.col("rep")).group_by(node).agg(rep_end=pl.col("end").max()))
    return (per_node.join(rerun_end, on=node, how="left")
            .select(pl.col("rank").cast(pl.Int32), pl.col("tid").cast(pl.Int64),
                    pl.col("n0").alias(START),
                    pl.max_horizontal("fwd_end", "rep_end").alias(END)))
