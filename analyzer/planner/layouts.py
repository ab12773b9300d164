"""Legal Parallel Folding layouts: (TP, CP, DP, PP, VPP) × (ETP, EP, EDP) for a GPU count.

Arithmetic and checks follow Megatron-LM (`megatron/training/arguments.py`,
`megatron/core/parallel_state.py`) and the MoE Parallel Folding paper (arXiv:2504.14960):
world % (TP·PP·CP) == 0, DP = world/(TP·PP·CP); world % (ETP·EP·PP) == 0, EDP = world/(ETP·EP·PP);
PP is shared. Candidates are built from divisors, so those two hold by construction; every other
check is a named `Constraint` whose rejections are counted, so an empty result can name what bound
it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

from moetune.analyzer.planner.config import builtin
from moetune.analyzer.planner.memory import Layout, ModelSpec, Workload

# id -> the rule as a user reads it (also the vocabulary of `relax`)
CONSTRAINTS: dict[str, str] = {
    "tp_within_node": "TP ≤ GPUs per node (tensor parallelism needs NVLink)",
    "heads_divisible_by_tp": "num_attention_heads and num_query_groups divisible by TP",
    "seq_divisible_by_2cp": "seq_length % (2·CP) == 0 when CP > 1",
    "layers_cover_stages": "at least one decoder layer per (virtual) pipeline stage",
    "gbs_divisible_by_dp": "global_batch_size % (micro_batch_size·DP) == 0",
    "interleaved_microbatches": "interleaved PP: micro-batches per step % PP == 0 (schedules.py)",
    "experts_divisible_by_ep": "num_experts % EP == 0",
    "etp_within_node": "ETP ≤ GPUs per node",
    "moe_ffn_divisible_by_etp": "moe_ffn_hidden_size % ETP == 0",
    "ep_overlap_needs_vpp": "--overlap-moe-expert-parallel-comm with PP > 1 needs VPP",
}


@dataclass(frozen=True, slots=True)
class Topology:
    gpus: int
    gpus_per_node: int
    nvlink_domain: int

    @property
    def nodes(self) -> int:
        return max(1, self.gpus // self.gpus_per_node)


@dataclass(slots=True)
class Enumeration:
    """Legal layouts plus, per constraint id, how many candidates it rejected."""

    layouts: list[Layout] = field(default_factory=list)
    rejected: Counter[str] = field(default_factory=Counter)
    candidates: int = 0


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def topology_problem(topo: Topology) -> str | None:
    """Why the topology itself is contradictory, or None."""
    if topo.gpus < 1:
        return f"gpus must be ≥ 1 (got {topo.gpus})"
    if topo.gpus_per_node < 1:
        return f"gpus_per_node must be ≥ 1 (got {topo.gpus_per_node})"
    if topo.gpus_per_node > topo.gpus:
        return (f"gpus_per_node ({topo.gpus_per_node}) > gpus ({topo.gpus}): a partial node; set "
                "hardware.gpus_per_node to the GPUs per node actually used")
    if topo.gpus % topo.gpus_per_node:
        return (f"gpus ({topo.gpus}) is not a whole number of nodes of {topo.gpus_per_node} GPUs")
    if topo.nvlink_domain > topo.gpus:
        return f"nvlink_domain_size ({topo.nvlink_domain}) > gpus ({topo.gpus})"
    return None


# --------------------------------------------------------------------------------------------
# pipeline splits


def _compress(stages: list[str]) -> str:
    """Megatron layout syntax: stages joined by '|', runs of equal stages as '(x|)*n'."""
    parts: list[str] = []
    i = 0
    while i < len(stages):
        j = i
        while j + 1 < len(stages) and stages[j + 1] == stages[i]:
            j += 1
        n = j - i + 1
        parts.append(f"({stages[i]}|)*{n}" if n > 2 else "|".join([stages[i]] * n) + "|")
        i = j + 1
    return "".join(parts).rstrip("|")


def pipeline_split(num_layers: int, pp: int, vpp: int | None, mtp: int
                   ) -> tuple[tuple[tuple[int, ...], ...], str, str | None] | None:
    """Decoder layers per virtual stage (index v = chunk·PP + rank), how the split is expressed,
    and the `--pipeline-model-parallel-layout` string when needed; None when impossible.

    Order of preference: even (`num_layers % (PP·VPP) == 0`); Megatron's
    `--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split`
    ((L+2) % (PP·VPP) == 0, first and last stage one layer short); else an explicit layout with
    the extra layers on middle stages (as DeepSeek-V3's `Et*3|(tt|)*29m|L`)."""
    s = pp * (vpp or 1)
    if s > num_layers:
        return None
    if num_layers % s == 0:
        sizes = [num_layers // s] * s
        how, layout = "even", None
    elif pp > 1 and (num_layers + 2) % s == 0 and (num_layers + 2) // s >= 2:
        n = (num_layers + 2) // s
        sizes = [n - 1] + [n] * (s - 2) + [n - 1]
        how, layout = "account_for_embedding_and_loss", None
    else:
        base, extra = divmod(num_layers, s)
        sizes = [base] * s
        middle = list(range(1, s - 1)) or list(range(s))
        for i in range(extra):  # spread from the middle outward, never onto stage 0/last first
            sizes[middle[(len(middle) // 2 + (i + 1) // 2 * (-1) ** i) % len(middle)]] += 1
        if min(sizes) < 1:
            return None
        names = ["t" * n for n in sizes]
        names[0] = "E" + names[0]
        names[-1] = names[-1] + "m" * mtp + "L"
        how, layout = "layout", _compress(names)
    stages, start = [], 0
    for n in sizes:
        stages.append(tuple(range(start, start + n)))
        start += n
    return tuple(stages), how, layout


# --------------------------------------------------------------------------------------------
# enumeration


def enumerate_layouts(model: ModelSpec, work: Workload, topo: Topology, *,
                      ep_overlap: bool = False, max_vpp: int | None = None,
                      relax: frozenset[str] = frozenset()) -> Enumeration:
    """Every legal layout for `topo.gpus` GPUs (VPP up to `max_vpp`, planner.yaml
    `layouts.max_vpp` by default). `relax` skips named constraints (used only to find which
    constraint binds when nothing fits; such layouts are not runnable)."""
    out = Enumeration()
    max_vpp = builtin().max_vpp if max_vpp is None else max_vpp
    if topology_problem(topo):
        return out
    world = topo.gpus

    def ok(cid: str, cond: bool, n: int = 1) -> bool:
        if cond or cid in relax:
            return True
        out.rejected[cid] += n
        return False

    experts = model.num_experts or 1
    for tp in divisors(world):
        for cp in divisors(world // tp):
            for pp in divisors(world // (tp * cp)):
                dp = world // (tp * cp * pp)
                # expert-side folds for this PP: counted once per attention candidate
                folds = [(etp, ep) for etp in divisors(world // pp)
                         for ep in divisors(world // (pp * etp))]
                for vpp in _vpp_options(model.num_layers, pp, max_vpp):
                    out.candidates += len(folds)
                    n = len(folds)
                    if not (ok("tp_within_node", tp <= topo.gpus_per_node, n)
                            and ok("heads_divisible_by_tp", model.num_attention_heads % tp == 0
                                   and model.num_query_groups % tp == 0, n)
                            and ok("seq_divisible_by_2cp",
                                   cp == 1 or work.seq_length % (2 * cp) == 0, n)):
                        continue
                    split = pipeline_split(model.num_layers, pp, vpp, model.mtp_num_layers)
                    if split is None:  # cannot be relaxed: there is nothing to build
                        out.rejected["layers_cover_stages"] += n
                        continue
                    stages, how, layout_str = split
                    micro = work.microbatches(dp)
                    gbs = work.global_batch_size
                    if not ok("gbs_divisible_by_dp",
                              gbs is None or gbs % (work.micro_batch_size * dp) == 0, n):
                        continue
                    if not ok("interleaved_microbatches",
                              vpp is None or micro is None or (micro >= pp and micro % pp == 0), n):
                        continue
                    if not ok("ep_overlap_needs_vpp", not ep_overlap or pp == 1 or vpp, n):
                        continue
                    for etp, ep in folds:
                        if not (ok("experts_divisible_by_ep", experts % ep == 0)
                                and ok("etp_within_node", etp <= topo.gpus_per_node)
                                and ok("moe_ffn_divisible_by_etp",
                                       model.moe_ffn_hidden_size % etp == 0 or not model.num_experts)):
                            continue
                        if not model.num_experts and (ep > 1 or etp != tp):
                            continue  # dense model: the MoE mesh does not exist
                        out.layouts.append(Layout(
                            tp=tp, cp=cp, dp=dp, pp=pp, vpp=vpp, ep=ep, etp=etp,
                            edp=world // (pp * etp * ep), stages=stages,
                            pp_layout=layout_str, pp_split=how))  # type: ignore[arg-type]
    return out


def _vpp_options(num_layers: int, pp: int, max_vpp: int) -> Iterator[int | None]:
    yield None
    if pp == 1:
        return  # VPP ⇒ PP > 1
    for v in range(2, max_vpp + 1):
        if pp * v <= num_layers:
            yield v
