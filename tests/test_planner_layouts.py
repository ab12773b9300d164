"""Layout enumerator: Parallel Folding arithmetic and legality on real model dimensions."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from moetune.analyzer.planner.layouts import (
    Topology,
    enumerate_layouts,
    pipeline_split,
    topology_problem,
)
from moetune.analyzer.planner.memory import Workload, model_spec
from moetune.analyzer.planner.plan import read_contract

CONTRACTS = Path(__file__).resolve().parents[1] / "fixtures" / "contracts"
QWEN30 = model_spec(read_contract(CONTRACTS / "fit_qwen3_30b_h100.yaml")["model"])
WORK = Workload(seq_length=4096, global_batch_size=1024)


def test_every_layout_obeys_the_folding_arithmetic():
    enum = enumerate_layouts(QWEN30, WORK, Topology(16, 8, 8))
    assert enum.layouts
    for lay in enum.layouts:
        assert lay.tp * lay.cp * lay.dp * lay.pp == 16
        assert lay.etp * lay.ep * lay.edp * lay.pp == 16
        assert QWEN30.num_experts % lay.ep == 0 and lay.tp <= 8 and lay.etp <= 8
        assert lay.cp == 1 or 4096 % (2 * lay.cp) == 0
        assert 1024 % (lay.dp * 1) == 0
        assert sorted(i for s in lay.stages for i in s) == list(range(48))
        assert lay.sequence_parallel == (lay.tp > 1)
        assert lay.vpp is None or lay.pp > 1
    keys = {lay.key() for lay in enum.layouts}
    assert (1, 1, 16, 1, None, 16, 1) in keys  # the published TP1 EP16
    assert not any(k[5] in (3, 5, 6) for k in keys)


def test_ep_overlap_with_pp_requires_vpp():
    enum = enumerate_layouts(QWEN30, WORK, Topology(16, 8, 8), ep_overlap=True)
    assert all(lay.pp == 1 or lay.vpp for lay in enum.layouts)
    assert enum.rejected["ep_overlap_needs_vpp"] > 0


def test_heads_and_gqa_groups_bound_tp():
    # 4 query groups: TP8 is illegal although 8 GPUs per node would allow it
    enum = enumerate_layouts(QWEN30, WORK, Topology(16, 8, 8))
    assert max(lay.tp for lay in enum.layouts) == 4
    assert enum.rejected["heads_divisible_by_tp"] > 0


@pytest.mark.parametrize(("layers", "pp", "vpp", "mtp", "how", "sizes", "text"), [
    (32, 4, 8, 0, "even", [1] * 32, None),  # Mixtral PP4 VP8
    (94, 8, 4, 0, "account_for_embedding_and_loss", [2] + [3] * 30 + [2], None),  # Qwen3-235B
    (61, 8, 4, 1, "layout", None, None),  # DeepSeek-V3 needs --pipeline-model-parallel-layout
    (4, 8, None, 0, None, None, None),  # more stages than layers
])
def test_pipeline_splits(layers, pp, vpp, mtp, how, sizes, text):
    split = pipeline_split(layers, pp, vpp, mtp)
    if how is None:
        assert split is None
        return
    stages, got_how, layout = split
    assert got_how == how and len(stages) == pp * (vpp or 1)
    assert sum(len(s) for s in stages) == layers
    if sizes:
        assert [len(s) for s in stages] == sizes
    if how == "layout":
        assert layout.startswith("E") and layout.endswith("mL")
        assert max(len(s) for s in stages) == 2 and len(stages[0]) == 1


@pytest.mark.parametrize(("topo", "word"), [
    (Topology(0, 8, 8), "gpus must be ≥ 1"),
    (Topology(4, 8, 8), "gpus_per_node (8) > gpus (4)"),
    (Topology(12, 8, 8), "whole number of nodes"),
])
def test_contradictory_topologies(topo, word):
    assert word in topology_problem(topo)
    assert enumerate_layouts(QWEN30, WORK, topo).layouts == []


@settings(max_examples=25, deadline=None)
@given(nodes=st.sampled_from([1, 2, 4, 8]), per_node=st.sampled_from([2, 4, 8]))
def test_layout_count_grows_with_gpus_and_stays_legal(nodes, per_node):
    world = nodes * per_node
    enum = enumerate_layouts(QWEN30, WORK, Topology(world, per_node, per_node))
    assert enum.layouts  # TP1 PP1 EP1 DP=world is always legal for 1024 % world == 0
    assert all(lay.world == world and lay.tp <= per_node for lay in enum.layouts)
    assert len(enum.layouts) + sum(enum.rejected.values()) >= enum.candidates
