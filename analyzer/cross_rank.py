"""Cross-rank reduce over per-rank summaries (`moetune.analyzer.rank_summary`): the `cross_rank`
section of the diagnosis for any number of ranks, from polars frames, never the full traces
(except the few ranks the cross-rank critical path passes through, when `load_rank` is given).

Figures (docs/cross-rank.md has the rules and thresholds):

- alignment: per-rank clock offsets on the lowest rank's clock, from collective ends, linear in
  the number of collective instances (no rank pairs): each matched collective group names an
  anchor (its lowest rank); every member's offset to the anchor is the median over the group's
  instances of end_anchor − end_member; these edges (one per member and group) form a graph
  whose maximum spanning forest (edges weighted by instances) gives every rank's offset by one
  walk from each component's lowest rank. Where a reader set session start offsets (nsys), those
  are used, as in `moetune.analyzer.clocks`.
- collectives: instances matched as `moetune.analyzer.collectives.match_collectives` matches
  them (same group, same index k, every member holding the same count), with the group made
  exact by the process group's rank list where the trace names one.
- process groups: arrival skew (max − min aligned start) per process group and per role
  (kernel_classes.yaml `process_groups`: ep_dispatch, grad_reduce, tp, pp, cp), last arrivers,
  and per rank the time it alone held a collective back (last start − second-last start).
- stragglers: the robust z rule of `moetune.analyzer.ranks.stragglers`, on per-rank median step
  time and on per-rank compute time per step (synchronous ranks wait for each other, so a slow
  rank's step is barely longer than its peers': its own compute is what stands out).
- EP load imbalance: per expert-parallel group, all-to-all rows received (sum of `Out split
  size`) and expert GEMM time per rank against the group mean.
- step time: per-rank median step time, its distribution over ranks.
- critical path of the median step across ranks: from the last-finishing rank back through each
  collective to the rank that arrived last at it (`moetune.analyzer.cross_rank_path`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl
from moetune.analyzer.classify import load_classes, match_expr
from moetune.analyzer.cross_rank_path import cross_rank_path
from moetune.analyzer.frames import Trace
from moetune.analyzer.rank_summary import Summaries
from moetune.analyzer.ranks import MAD_FLOOR, MIN_RANKS_FOR_STRAGGLERS, Z_THRESHOLD, stragglers

# Expert GEMM kernel classes (kernel_classes.yaml): the grouped GEMM that runs every local
# expert in one kernel. Per-expert GEMMs (SequentialMLP) share dense GEMMs' classes, so
# without it expert compute is not told apart.
EXPERT_CLASSES = ("compute.gemm.grouped_cutlass",)
OVERLOAD_RATIO = 1.25  # a rank's load ≥ this × its EP group's mean: overloaded
TOP_GROUPS = 20  # process groups / EP groups listed individually (the worst first)
TOP_RANKS = 10  # ranks listed in per-rank rankings
ROLE_NONE = "unknown"


def cross_rank(summaries: Summaries, *, load_rank: Callable[[int], Trace] | None = None
               ) -> dict[str, Any]:
    """`{"cross_rank": {...}}` for the diagnosis document (schemas/diagnosis.schema.json)."""
    s = summaries
    ranks = sorted({int(r) for t in (s.meta, s.steps, s.collectives)
                    for r in t.get_column("rank").unique().to_list()})
    out: dict[str, Any] = {"ranks": len(ranks)}
    if len(ranks) < 2:
        why = "one rank: nothing to compare across ranks" if ranks else "no rank"
        return {"cross_rank": out | {"unobservable": why}}
    inst, gtab, match = _instances(s.collectives)
    al = _align(inst, s.meta, ranks)
    out["alignment"] = al.doc
    out["collectives"] = match
    ai = _aligned(inst, al.offsets)
    del inst
    per = _per_instance(ai, gtab)
    out["alignment"]["residual_s"] = _dist_s(per.get_column("end_spread")) if per.height else None
    out["process_groups"] = _groups_section(per)
    step_s = _step_time(s.steps)
    out["step_time"] = _step_time_section(step_s)
    compute_s = _compute_per_step(s.kernels, s.steps)
    out["stragglers"] = _stragglers_section(step_s, compute_s, per, al.component)
    out["ep_imbalance"] = _ep_section(s.collectives, gtab, s.kernels, s.steps)
    _explain(out)
    out["critical_path"] = cross_rank_path(s.steps, ai, per, gtab, al.offsets, al.component,
                                           load_rank)
    return {"cross_rank": out}


# --------------------------------------------------------------------------- collectives


def _instances(coll: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame, dict[str, Any]]:
    """Collective kernels that can be matched across ranks as integers (rank, gid, k, ts_ns,
    end_ns), the table of their groups (gid → group, process group `pg`, description, role,
    collective, members, `gh`), and the matching counts. Strings stay in the small group table:
    the instance rows of thousands of ranks are numbers only, grouped by a 64-bit hash of
    (group, rank list) instead of the strings (DP rank lists run to hundreds of characters)."""
    lf = coll.lazy().with_columns(gh=_group_hash())
    counts = lf.group_by("gh", "rank").len().group_by("gh").agg(
        n_ranks=pl.len(), lo=pl.col("len").min(), hi=pl.col("len").max()).collect()
    good = counts.filter((pl.col("lo") == pl.col("hi")) & (pl.col("n_ranks") >= 2))
    gtab = (lf.filter(pl.col("gh").is_in(good.get_column("gh").implode()))
            .group_by("gh").agg(pl.col("group", "pg_ranks").first(),
                                pl.col("pg_name", "pg_desc", "collective").drop_nulls().first())
            .collect()
            .join(good.select("gh", members="n_ranks"), on="gh")
            .sort("group", "pg_ranks", nulls_last=True).with_row_index("gid")
            .with_columns(
                pg=pl.when(pl.col("pg_name").is_not_null())
                .then(pl.concat_str([pl.col("pg_name"), pl.col("pg_ranks").fill_null("")],
                                    separator="|"))
                .otherwise(pl.col("group")),
                role=_role_expr()))
    inst = (lf.join(gtab.lazy().select("gh", "gid"), on="gh", how="inner")
            .select("rank", "gid", "k", "ts_ns", "end_ns").collect())
    doc = {
        "kernels": coll.height,
        "matched": inst.height,
        "instances": inst.select(pl.struct("gid", "k").n_unique()).item() if inst.height else 0,
        "groups": good.height,
        "groups_unmatched": counts.filter(pl.col("lo") != pl.col("hi")).height,
        "groups_on_one_rank": counts.filter((pl.col("lo") == pl.col("hi"))
                                            & (pl.col("n_ranks") < 2)).height,
        "group_key": "process group name, collective and rank list (kernel name without them)",
    }
    return inst, gtab, doc


def _group_hash() -> pl.Expr:
    return pl.struct(pl.col("group"), pl.col("pg_ranks").fill_null("")).hash()


def _role_expr() -> pl.Expr:
    """The process group's role by its description (kernel_classes.yaml `process_groups`)."""
    role = pl.lit(ROLE_NONE)
    for rule in reversed(load_classes().process_groups):
        role = pl.when(match_expr(rule["match"], col="pg_desc")).then(
            pl.lit(rule["role"])).otherwise(role)
    return pl.when(pl.col("pg_desc").is_null()).then(pl.lit(ROLE_NONE)).otherwise(role)


# --------------------------------------------------------------------------- alignment


@dataclass(frozen=True, slots=True)
class _Alignment:
    offsets: dict[int, int]
    doc: dict[str, Any]
    component: dict[int, int]  # rank → lowest rank of the ranks its clock is aligned with


def _align(inst: pl.DataFrame, meta: pl.DataFrame, ranks: list[int]) -> _Alignment:
    """Offsets (ns) added to each rank's timestamps to put it on its component's lowest rank's
    clock; see the module docstring."""
    ref = ranks[0]
    sess = {int(r): int(o or 0) for r, o in meta.select("rank", "clock_offset_ns").iter_rows()}
    if any(sess.get(r, 0) for r in ranks):  # nsys session starts: one clock already
        base = sess.get(ref, 0)
        offs = {r: sess.get(r, 0) - base for r in ranks}
        return _Alignment(offs, {"method": "session_start", "reference_rank": ref,
                                 "offsets_ns": _by_rank(offs), "unaligned": [],
                                 "components": 1, "edges": 0}, dict.fromkeys(ranks, ref))
    if inst.height == 0:
        return _Alignment(dict.fromkeys(ranks, 0), {
            "method": "none", "reference_rank": ref, "offsets_ns": _by_rank(dict.fromkeys(ranks, 0)),
            "unaligned": ranks[1:], "components": len(ranks), "edges": 0,
            "reason": "no collective is held by two ranks: clocks cannot be related"},
            {r: r for r in ranks})
    lf = inst.lazy().select("gid", "k", "rank", "end_ns")
    anchor = lf.group_by("gid").agg(anchor=pl.col("rank").min())
    a_end = lf.join(anchor, on="gid").filter(pl.col("rank") == pl.col("anchor")).select(
        "gid", "k", "anchor", a_end="end_ns")
    edges = (lf.join(a_end, on=["gid", "k"]).filter(pl.col("rank") != pl.col("anchor"))
             .group_by("anchor", "rank")  # one edge per rank pair: the group with most instances
             .agg(d=(pl.col("a_end") - pl.col("end_ns")).median(), n=pl.len())
             .sort("n", "anchor", "rank", descending=[True, False, False]).collect())
    parent = {r: r for r in ranks}

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    adj: dict[int, list[tuple[int, int]]] = {}
    used = 0
    for a, b, d, _n in edges.iter_rows():  # Kruskal: the best-supported edges first
        ra, rb = find(a), find(b)
        if ra == rb:
            continue
        parent[max(ra, rb)] = min(ra, rb)
        d = round(d)
        adj.setdefault(a, []).append((b, d))  # offset_b = offset_a + d
        adj.setdefault(b, []).append((a, -d))
        used += 1
    offsets: dict[int, int] = {}
    roots = []
    for r in ranks:  # ascending: each component starts from its lowest rank
        if r in offsets:
            continue
        roots.append(r)
        offsets[r] = 0
        stack = [r]
        while stack:
            x = stack.pop()
            for y, d in adj.get(x, ()):
                if y not in offsets:
                    offsets[y] = offsets[x] + d
                    stack.append(y)
    main = find(ref)
    unaligned = [r for r in ranks if find(r) != main]
    doc: dict[str, Any] = {"method": "collective_end", "reference_rank": ref,
                           "offsets_ns": _by_rank(offsets), "unaligned": unaligned,
                           "components": len(roots), "edges": used}
    if unaligned:
        doc["reason"] = ("ranks that share no collective with the reference rank's component: "
                         "their offsets are to the lowest rank of their own component")
    return _Alignment(offsets, doc, {r: find(r) for r in ranks})


def _aligned(inst: pl.DataFrame, offsets: dict[int, int]) -> pl.DataFrame:
    off = pl.DataFrame({"rank": list(offsets), "_off": list(offsets.values())},
                       schema={"rank": pl.Int32, "_off": pl.Int64})
    return inst.join(off, on="rank", how="left").with_columns(
        ats=pl.col("ts_ns") + pl.col("_off").fill_null(0),
        aend=pl.col("end_ns") + pl.col("_off").fill_null(0)).drop("_off")


def _per_instance(ai: pl.DataFrame, gtab: pl.DataFrame) -> pl.DataFrame:
    """One row per matched instance: arrival skew, the unique last arriver (null on a tie at the
    last arrival; `last_any`: the lowest of the tied), the time it alone held the others back,
    and the spread of aligned ends; with its group's attributes."""
    return ai.lazy().group_by("gid", "k").agg(
        members=pl.len(),
        first_ats=pl.col("ats").min(), last_ats=pl.col("ats").max(),
        second_ats=pl.col("ats").top_k(2).min(),  # every matched group has ≥ 2 members
        n_last=(pl.col("ats") == pl.col("ats").max()).sum(),
        last=pl.col("rank").get(pl.col("ats").arg_max()),
        last_any=pl.col("rank").filter(pl.col("ats") == pl.col("ats").max()).min(),
        end_spread=pl.col("aend").max() - pl.col("aend").min(),
    ).with_columns(
        skew=pl.col("last_ats") - pl.col("first_ats"),
        last=pl.when(pl.col("n_last") == 1).then("last"),
        held=pl.when(pl.col("n_last") == 1).then(pl.col("last_ats") - pl.col("second_ats"))
        .otherwise(0),
    ).join(gtab.lazy().select("gid", "group", "pg", "role", "collective", "pg_desc"),
           on="gid").collect()


# --------------------------------------------------------------------------- process groups


def _groups_section(per: pl.DataFrame) -> dict[str, Any]:
    if per.height == 0:
        return {"unobservable": "no collective matched across ranks"}
    q = [0.5, 0.9]
    by_pg = per.group_by("pg").agg(
        role=pl.col("role").first(), desc=pl.col("pg_desc").first(),
        collectives=pl.col("collective").unique().drop_nulls().sort(),
        members=pl.col("members").max(), instances=pl.len(),
        **{f"p{int(x * 100)}": pl.col("skew").quantile(x, "lower") for x in q},
        max=pl.col("skew").max(), held=pl.col("held").sum(),
    ).sort(["max", "pg"], descending=[True, False])
    last = (per.drop_nulls("last").group_by("pg", "last").len()
            .sort(["pg", "len", "last"], descending=[False, True, False]))
    top_last = {pg: [{"rank": int(r), "count": int(c)} for _, r, c in part.head(3).iter_rows()]
                for (pg,), part in last.group_by("pg", maintain_order=True)}
    groups = [{
        "group": pg, "role": role, "description": desc, "collectives": list(colls),
        "members": int(m), "instances": int(n),
        "skew_s": {"p50": _s(p50), "p90": _s(p90), "max": _s(mx)},
        "held_back_s": _s(held), "last_arrival": top_last.get(pg, []),
    } for pg, role, desc, colls, m, n, p50, p90, mx, held in by_pg.head(TOP_GROUPS).iter_rows()]
    roles = {}
    for (role,), part in per.group_by("role", maintain_order=True):
        lr = part.drop_nulls("last").group_by("last").len().sort(
            ["len", "last"], descending=[True, False])
        roles[str(role)] = {
            "groups": part.get_column("pg").n_unique(), "instances": part.height,
            "skew_s": _dist_s(part.get_column("skew")),
            "last_arrival": [{"rank": int(r), "count": int(c)}
                             for r, c in lr.head(TOP_RANKS).iter_rows()],
        }
    held = (per.drop_nulls("last").group_by("last")
            .agg(held=pl.col("held").sum(), n=pl.len())
            .sort(["held", "last"], descending=[True, False]))
    return {
        "count": by_pg.height, "instances": per.height,
        "skew_s": _dist_s(per.get_column("skew")),
        "by_role": dict(sorted(roles.items())),
        "groups": groups, "groups_listed": len(groups),
        "held_back": [{"rank": int(r), "s": _s(h), "last_arrivals": int(n)}
                      for r, h, n in held.head(TOP_RANKS).iter_rows()],
        "rule": "skew = last − first aligned start of an instance's members; held back = last − "
                "second-last start, counted for the last arriver when it is alone last",
    }


# --------------------------------------------------------------------------- step time


def _step_time(steps: pl.DataFrame) -> dict[int, float]:
    """Median step time (s) per rank (the steps table's GPU windows)."""
    t = steps.group_by("rank").agg(((pl.col("end_ns") - pl.col("start_ns")).median() / 1e9)
                                   .alias("s"))
    return {int(a): float(b) for a, b in t.sort("rank").iter_rows()}


def _step_time_section(step_s: dict[int, float]) -> dict[str, Any]:
    if not step_s:
        return {"unobservable": "no analysed step on any rank"}
    xs = np.array(list(step_s.values()))
    ks = list(step_s)
    return {"ranks": len(xs), "p50": _r(np.quantile(xs, 0.5, method="lower")),
            "p90": _r(np.quantile(xs, 0.9, method="lower")), "min": _r(xs.min()),
            "max": _r(xs.max()), "slowest_rank": int(ks[int(xs.argmax())]),
            "fastest_rank": int(ks[int(xs.argmin())]),
            "by_rank": {str(k): _r(v) for k, v in step_s.items()}}


def _compute_per_step(kernels: pl.DataFrame, steps: pl.DataFrame) -> dict[int, float]:
    """GPU compute seconds per analysed step per rank (kernel classes `compute.*`)."""
    n = steps.group_by("rank").agg(n=pl.len())
    t = (kernels.filter(pl.col("cls").str.starts_with("compute."))
         .group_by("rank").agg(s=pl.col("s").sum()).join(n, on="rank")
         .select("rank", s=pl.col("s") / pl.col("n")).sort("rank"))
    return {int(a): float(b) for a, b in t.iter_rows()}


def _stragglers_section(step_s: dict[int, float], compute_s: dict[int, float],
                        per: pl.DataFrame, component: dict[int, int]) -> dict[str, Any]:
    """`ranks.stragglers` within each set of ranks joined by collectives (one job: ranks that
    share none are not peers, and mixing them would make the median of two populations)."""
    rule = (f"robust z = 0.6745·(x − median)/MAD > {Z_THRESHOLD} over the ranks joined by "
            f"collectives (MAD floor {MAD_FLOOR:.0%} of the median; ≥ "
            f"{MIN_RANKS_FOR_STRAGGLERS} ranks), x = per-rank median step time, and x = "
            "per-rank GPU compute time per step")
    out: dict[str, Any] = {"rule": rule}
    comps: dict[int, list[int]] = {}
    for r, c in component.items():
        comps.setdefault(c, []).append(r)
    by_step: list[int] = []
    by_comp: list[int] = []
    z_step: dict[int, float] = {}
    z_comp: dict[int, float] = {}
    judged = 0
    for members in comps.values():
        if len(members) < MIN_RANKS_FOR_STRAGGLERS:
            continue
        judged += len(members)
        f, z = stragglers({r: step_s[r] for r in members if r in step_s})
        by_step += f
        z_step |= z
        f, z = stragglers({r: compute_s[r] for r in members if r in compute_s})
        by_comp += f
        z_comp |= z
    if not judged:
        return out | {"ranks": None, "unobservable": f"no {MIN_RANKS_FOR_STRAGGLERS} ranks "
                                                     "joined by collectives to compare"}
    last = (per.drop_nulls("last").group_by("last").len() if per.height
            else pl.DataFrame(schema={"last": pl.Int32, "len": pl.UInt32}))
    lasts = {int(r): int(c) for r, c in last.iter_rows()}
    flagged = sorted(set(by_step) | set(by_comp))
    out |= {
        "ranks": flagged,
        "by_step_time": sorted(by_step), "by_compute_time": sorted(by_comp),
        "detail": [{"rank": r, "step_time_s": _r(step_s[r]) if r in step_s else None,
                    "step_time_z": z_step.get(r), "compute_s": _r(compute_s[r])
                    if r in compute_s else None, "compute_z": z_comp.get(r),
                    "last_arrivals": lasts.get(r, 0)} for r in flagged],
    }
    if judged < len(component):
        out["ranks_not_judged"] = len(component) - judged
    return out


# --------------------------------------------------------------------------- EP imbalance


def _ep_section(coll: pl.DataFrame, gtab: pl.DataFrame, kernels: pl.DataFrame,
                steps: pl.DataFrame) -> dict[str, Any]:
    rule = (f"per EP group (role ep_dispatch, all-to-all), a rank is overloaded when its load ≥ "
            f"{OVERLOAD_RATIO} × the group mean; load = all-to-all rows received (sum of `Out "
            "split size`) where every member's splits are known, else the share of its compute "
            f"time in expert GEMMs ({', '.join(EXPERT_CLASSES)}): a slow GPU stretches all its "
            "compute alike, more tokens only the experts'")
    out: dict[str, Any] = {"rule": rule}
    ep = gtab.filter((pl.col("role") == "ep_dispatch")
                     & pl.col("collective").str.starts_with("all_to_all"))
    if ep.height == 0:
        return out | {"groups": 0, "overloaded": [],
                      "unobservable": "no all-to-all on an expert-parallel process group"}
    rows = (coll.lazy().with_columns(gh=_group_hash())
            .join(ep.lazy().select("gh", "pg"), on="gh")
            .with_columns(
                recv=pl.col("out_split").str.strip_chars("[] ").str.split(",")
                .list.eval(pl.element().str.strip_chars().cast(pl.Int64, strict=False))
                .list.sum(),
                known=pl.col("out_split").is_not_null() & (pl.col("out_split") != "[]"))
            .group_by("pg", "rank").agg(recv=pl.col("recv").sum(), known=pl.col("known").all()))
    n = steps.group_by("rank").agg(n=pl.len()).lazy()
    kern = kernels.lazy().group_by("rank").agg(
        expert=pl.col("s").filter(pl.col("cls").is_in(EXPERT_CLASSES)).sum(),
        compute=pl.col("s").filter(pl.col("cls").str.starts_with("compute.")).sum())
    t = (rows.join(kern, on="rank", how="left").join(n, on="rank", how="left")
         .with_columns(expert_s=pl.col("expert") / pl.col("n"),
                       share=pl.col("expert") / pl.col("compute"))
         .with_columns(
             recv_ratio=pl.col("recv") / pl.col("recv").mean().over("pg"),
             expert_ratio=pl.col("expert_s") / pl.col("expert_s").mean().over("pg"),
             share_ratio=pl.col("share") / pl.col("share").mean().over("pg"),
             by_recv=pl.col("known").all().over("pg") & (pl.col("recv").sum().over("pg") > 0),
             by_share=(pl.col("expert").sum().over("pg") > 0))
         .with_columns(
             basis=pl.when("by_recv").then(pl.lit("a2a_received_rows"))
             .when("by_share").then(pl.lit("expert_compute_share")),
             ratio=pl.when("by_recv").then("recv_ratio").when("by_share").then("share_ratio"))
         .collect())
    over = t.filter(pl.col("ratio") >= OVERLOAD_RATIO).sort(["ratio", "rank"],
                                                            descending=[True, False])
    groups = (t.group_by("pg").agg(
        members=pl.len(), basis=pl.col("basis").first(), max_ratio=pl.col("ratio").max(),
        # the highest ratio; of equal ones the lowest rank (group order is not deterministic)
        max_rank=pl.col("rank").sort_by(["ratio", "rank"], descending=[False, True]).last(),
        recv_max_ratio=pl.col("recv_ratio").max(), expert_max_ratio=pl.col("expert_ratio").max())
        .sort(["max_ratio", "pg"], descending=[True, False], nulls_last=True))
    unobs = t.filter(pl.col("basis").is_null()).get_column("pg").n_unique()
    out |= {
        "groups": groups.height,
        "overloaded": [{"rank": int(r["rank"]), "group": r["pg"], "basis": r["basis"],
                        "ratio": _r(r["ratio"]), "received_rows": r["recv"] if r["known"] else None,
                        "expert_s": _r(r["expert_s"]), "expert_share": _r(r["share"])}
                       for r in over.iter_rows(named=True)],
        "by_group": [{"group": g, "members": int(m), "basis": b, "max_ratio": _r(x),
                      "max_rank": int(mr) if x is not None and x > 1 else None,  # none on a tie
                      "received_max_ratio": _r(rr), "expert_max_ratio": _r(er)}
                     for g, m, b, x, mr, rr, er in groups.head(TOP_GROUPS).iter_rows()],
    }
    if unobs:
        out["groups_unobservable"] = unobs
    return out


def _explain(out: dict[str, Any]) -> None:
    """Stragglers that are overloaded EP ranks: their slowness is their load."""
    over = {o["rank"] for o in out["ep_imbalance"].get("overloaded", [])}
    for d in out["stragglers"].get("detail", []):
        d["explained_by"] = "ep_overload" if d["rank"] in over else None


# --------------------------------------------------------------------------- helpers


def _by_rank(d: dict[int, int]) -> dict[str, int]:
    return {str(k): int(v) for k, v in sorted(d.items())}


def _dist_s(ns: pl.Series) -> dict[str, float | None]:
    if ns.len() == 0:
        return {"p50": None, "p90": None, "max": None}
    return {"p50": _s(ns.quantile(0.5, "lower")), "p90": _s(ns.quantile(0.9, "lower")),
            "max": _s(ns.max())}


def _s(ns: float | int | None) -> float | None:
    return None if ns is None else round(float(ns) / 1e9, 9)


def _r(x: float | int | None) -> float | None:
    return None if x is None else round(float(x), 9)


def summary_lines(section: dict[str, Any]) -> list[str]:
    """Terminal lines for the cross-rank section."""
    c = section.get("cross_rank")
    if not c or "unobservable" in c:
        return []
    al = c["alignment"]
    st = c["stragglers"]

    def why(d: dict[str, Any]) -> str:
        by = [w for w, k in (("step time", "by_step_time"), ("compute", "by_compute_time"))
              if d["rank"] in st.get(k, [])]
        if d.get("explained_by") == "ep_overload":
            by.append("EP overload")
        return f"{d['rank']} ({', '.join(by)})"

    verdict = (f"unobservable ({st['unobservable']})" if "unobservable" in st
               else ", ".join(why(d) for d in st.get("detail", [])) or "none")
    lines = [f"cross-rank: {c['ranks']} ranks · alignment {al['method']}"
             + (f" ({len(al['unaligned'])} unaligned)" if al["unaligned"] else "")
             + " · stragglers: " + verdict]
    ep = c["ep_imbalance"]
    if ep.get("overloaded"):
        lines.append("  overloaded EP ranks: " + ", ".join(
            f"{o['rank']} ({o['ratio']:.2f}× group mean, {o['basis']})" for o in ep["overloaded"]))
    cp = c["critical_path"]
    if "ranks" in cp:
        detail = {"critical_path": "each rank's stretch from its full trace",
                  "mixed": "some ranks' stretches from their full traces",
                  "collective": "at collective granularity"}.get(cp["granularity"],
                                                                  cp["granularity"])
        lines.append(f"  median step {cp['step']} crosses ranks "
                     + ", ".join(map(str, cp["ranks"][:8]))
                     + (" …" if len(cp["ranks"]) > 8 else "") + f" ({detail})")
    return lines

