"""executor/candidate.py: exactly one knob changed on a real Megatron command line."""

from __future__ import annotations

import pytest
from moetune.executor.candidate import (
    Launch,
    apply,
    current_value,
    diff,
    parse_change,
    split_command,
)

from moetune.errors import UserError

CMD = ("torchrun --nproc-per-node 8 pretrain_gpt.py --micro-batch-size 1 --enable-cuda-graph "
       "--recompute-granularity selective --recompute-modules core_attn mlp --bf16 --data-path x")


def base() -> Launch:
    return Launch(split_command(CMD))


@pytest.mark.parametrize(
    ("change", "removed", "added"),
    [
        ("micro_batch_size=4", ["1"], ["4"]),
        ("--micro-batch-size=2", ["1"], ["2"]),
        ("moe_grouped_gemm=true", [], ["--moe-grouped-gemm"]),
        # deprecated alias replaced by the current spelling (rules/knobs.yaml `deprecated`)
        ("cuda_graph_impl=local", ["--enable-cuda-graph"], ["--cuda-graph-impl", "local"]),
        ("recompute_modules=moe_act", ["core_attn", "mlp"], ["moe_act"]),
        ("bf16=false", ["--bf16"], []),
        ("overlap_p2p_comm=false", [], ["--no-overlap-p2p-communication"]),
    ],
)
def test_apply_one_change(change: str, removed: list[str], added: list[str]) -> None:
    b = base()
    ch = parse_change(change)
    c = apply(b, ch)
    d = diff(b, c)
    assert (d["removed"], d["added"], d["env"]) == (removed, added, {})
    assert b == base()  # input untouched
    assert c.argv[:4] == ("torchrun", "--nproc-per-node", "8", "pretrain_gpt.py")
    i = c.argv.index("--data-path")
    assert c.argv[i + 1] == "x"  # a flag's value stays with its flag


def test_env_knob_and_current_value() -> None:
    c = apply(base(), parse_change("CUDA_DEVICE_MAX_CONNECTIONS=1"))
    assert c.argv == base().argv and c.env == {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    ch = parse_change("recompute_modules=moe_act,layernorm")
    assert current_value(apply(base(), ch), ch.knob) == ["moe_act", "layernorm"]
    assert current_value(base(), parse_change("micro_batch_size=9").knob) == 1


@pytest.mark.parametrize("bad", ["micro_batch_size", "micro_batch_size=four", "moe_grouped_gemm=maybe",
                                 "moe_token_dispatcher_type=carrier-pigeon", "Bad Name=1"])
def test_bad_changes_are_user_errors(bad: str) -> None:
    with pytest.raises(UserError):
        parse_change(bad)


OLD = ("torchrun pretrain_gpt.py --moe-deepep-num-sms 20 --cuda-graph-scope attn moe_router "
       "--moe-enable-deepep --no-moe-grouped-gemm --bf16")


@pytest.mark.parametrize(
    ("change", "argv"),
    [
        # a renamed flag leaves with its value, also when the value is a list
        ("moe_flex_dispatcher_num_sms=24", "--moe-flex-dispatcher-num-sms 24 --cuda-graph-scope "
         "attn moe_router --moe-enable-deepep --no-moe-grouped-gemm --bf16"),
        ("cuda_graph_modules=attn", "--moe-deepep-num-sms 20 --cuda-graph-modules attn "
         "--moe-enable-deepep --no-moe-grouped-gemm --bf16"),
        # an old switch goes when the knob it sets is changed
        ("moe_token_dispatcher_type=alltoall", "--moe-deepep-num-sms 20 --cuda-graph-scope attn "
         "moe_router --moe-token-dispatcher-type alltoall --no-moe-grouped-gemm --bf16"),
        # `--no-` spellings of a store_true switch go too
        ("moe_grouped_gemm=true", "--moe-deepep-num-sms 20 --cuda-graph-scope attn moe_router "
         "--moe-enable-deepep --moe-grouped-gemm --bf16"),
        # numbers as the planner prints them
        ("moe_expert_capacity_factor=1.0", "--moe-deepep-num-sms 20 --cuda-graph-scope attn "
         "moe_router --moe-enable-deepep --no-moe-grouped-gemm --bf16 "
         "--moe-expert-capacity-factor 1"),
    ],
)
def test_deprecated_spellings_are_replaced(change: str, argv: str) -> None:
    b = Launch(split_command(OLD))
    assert apply(b, parse_change(change)).argv == ("torchrun", "pretrain_gpt.py", *argv.split())


def test_current_value_reads_every_spelling() -> None:
    b = Launch(split_command(OLD))
    assert current_value(b, parse_change("moe_flex_dispatcher_num_sms=1").knob) == 20
    assert current_value(b, parse_change("cuda_graph_modules=attn").knob) == ["attn", "moe_router"]
    assert current_value(b, parse_change("moe_token_dispatcher_type=flex").knob) == "flex"
    assert current_value(b, parse_change("moe_grouped_gemm=true").knob) is False
    assert current_value(base(), parse_change("cuda_graph_impl=none").knob) == "local"  # --enable-cuda-graph


def test_changes_named_by_old_flags_set_the_current_knob() -> None:
    ch = parse_change("--moe-deepep-num-sms=16")
    assert ch.knob.name == "moe_flex_dispatcher_num_sms" and ch.value == 16
    assert apply(Launch(("x.py",)), ch).argv == ("x.py", "--moe-flex-dispatcher-num-sms", "16")
    ad_hoc = parse_change("train_iters=3")
    assert ad_hoc.knob.flag == "--train-iters"
    assert apply(Launch(("x.py", "--train-iters", "9")), ad_hoc).argv == ("x.py", "--train-iters", "3")
