"""Collectives matched across ranks: each rank's communication kernels numbered within their group,
and the k-th instance of a group on one rank paired with the k-th on every other rank holding it.

The timeline graph links matched instances (`collective` edges), clock alignment takes their
common end as a time reference, and the cross-rank view measures their arrival skew.
"""

from __future__ import annotations

import polars as pl
from moetune.analyzer.event_walls import wall_of
from moetune.analyzer.frames import Trace


def comm_instances(trace: Trace) -> pl.DataFrame:
    """Communication kernels of the whole trace numbered per (rank, group), node = event row
    index (`collective_instances` over every rank)."""
    lf = trace.events.lazy().with_row_index("node").filter(
        pl.col("kind") == "kernel")
    if "wall" in trace.events.columns:  # classified: only communication kernels are numbered
        lf = lf.filter(pl.col("wall") == "communication")
    gpu = lf.with_columns(pl.col("node").cast(pl.Int64)).collect()
    gpu = gpu.with_columns(wall=wall_of(gpu), end_ns=pl.col("ts_ns") + pl.col("dur_ns"))
    return collective_instances(gpu, trace.comms)


def collective_instances(gpu: pl.DataFrame, comms: pl.DataFrame) -> pl.DataFrame:
    """Communication kernels numbered within their group on each rank.

    Group = process group name + collective from `comms` when the kernel links to it (by
    correlation, else external id), else the kernel name. Columns: node, rank, group, k, ts_ns,
    end_ns.
    """
    ck = gpu.filter((pl.col("wall") == "communication") & (pl.col("kind") == "kernel"))
    if ck.height == 0:
        return pl.DataFrame(schema={"node": pl.Int64, "rank": pl.Int32, "group": pl.String,
                                    "k": pl.Int64, "ts_ns": pl.Int64, "end_ns": pl.Int64})
    ck = ck.with_columns(pl.lit(None, dtype=pl.String).alias("group"))
    if comms.height and {"pg_name", "collective"} <= set(comms.columns):
        meta = comms.select(
            "rank", "correlation", "external_id",
            g=pl.concat_str([pl.col("pg_name").fill_null("?"), pl.col("collective").fill_null("?")],
                            separator=":"),
        )
        by_corr = meta.drop_nulls("correlation").unique(["rank", "correlation"], keep="first")
        by_ext = meta.drop_nulls("external_id").unique(["rank", "external_id"], keep="first")
        ck = ck.join(by_corr.select("rank", "correlation", g1="g"), on=["rank", "correlation"],
                     how="left")
        if "external_id" in ck.columns:
            ck = ck.join(by_ext.select("rank", "external_id", g2="g"),
                         on=["rank", "external_id"], how="left")
        else:
            ck = ck.with_columns(g2=pl.lit(None, dtype=pl.String))
        ck = ck.with_columns(group=pl.coalesce("g1", "g2"))
    ck = ck.with_columns(group=pl.coalesce("group", pl.col("name").str.split("(").list.first()))
    return (
        ck.sort("rank", "group", "ts_ns", "node")
        .with_columns(k=pl.col("node").cum_count().over("rank", "group").cast(pl.Int64) - 1)
        .select("node", "rank", "group", "k", "ts_ns", "end_ns")
    )


def match_collectives(
    inst: pl.DataFrame, offsets: dict[int, int], unlinked: dict[str, int] | None = None
) -> pl.DataFrame:
    """Instances of one collective across ranks: same group and k on every rank that holds the
    group, provided every such rank holds the same count of it (else the group stays unlinked).
    Adds aligned start/end (`ats_ns`, `aend_ns`) and `members` (ranks in the instance)."""
    if inst.height == 0:
        return inst.with_columns(ats_ns=pl.col("ts_ns"), aend_ns=pl.col("end_ns"),
                                 members=pl.lit(0, dtype=pl.UInt32))
    off = pl.DataFrame({"rank": list(offsets), "_off": list(offsets.values())},
                       schema={"rank": pl.Int32, "_off": pl.Int64})
    inst = inst.join(off, on="rank", how="left").with_columns(
        ats_ns=pl.col("ts_ns") + pl.col("_off").fill_null(0),
        aend_ns=pl.col("end_ns") + pl.col("_off").fill_null(0),
    ).drop("_off")
    counts = inst.group_by("group", "rank").len()
    per_group = counts.group_by("group").agg(
        n_ranks=pl.col("rank").n_unique(), lo=pl.col("len").min(), hi=pl.col("len").max())
    bad = per_group.filter((pl.col("lo") != pl.col("hi")) | (pl.col("n_ranks") < 2))
    mismatched = per_group.filter(pl.col("lo") != pl.col("hi")).get_column("group")
    if unlinked is not None:
        unlinked["collectives_unmatched"] = inst.filter(pl.col("group").is_in(mismatched.implode())).height
    good = inst.filter(~pl.col("group").is_in(bad.get_column("group").implode()))
    return good.with_columns(members=pl.col("rank").n_unique().over("group", "k"))
