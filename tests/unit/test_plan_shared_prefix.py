"""The memory plan's shared-prefix rows and the RL step's matrix products (`rl.shared_prefix`,
issue #64 item 4), on hand-computed cases."""

from __future__ import annotations

from paravt_core.cli import main
from paravt_core.config import load_config
from paravt_core.plan import (
    GB,
    QWEN3_VL_8B,
    ModelShape,
    TrainedKind,
    _activations,
    memory_plan,
    rank_micro_batches,
    step_products,
    trained_kinds,
)

from tests.unit.test_plan import CONFIG_8B, H100

# paravt_8b.yaml at the protocol's bounds: a 64-frame prompt of 1024 + 64 x (50176 / 16^2 / 2^2 + 8)
# tokens, then 4 turns of 2048 new tokens and 3 rounds of 5 tool responses of 512 + 16.
PROMPT_8B = 1024 + 64 * 57
SUFFIX_8B = 4 * 2048 + 3 * 5 * (512 + 16)
PATCHES_8B = 64 * 196
# Bytes per token and per patch kept under activation checkpointing at 8B (plan.py's docstring):
# each layer's input (2h, 2vh) over the stack plus one layer's full set recomputed.
TOKEN_8B = 36 * 2 * 4096 + (24 * 4096 + 16 * 4096 + 16 * 1024 + 8 * 12288)
PATCH_8B = 27 * 2 * 1152 + (34 * 1152 + 4 * 4304)

# A toy shape whose products are easy by hand: text projections W = 1 x (2 x 4 x (4 + 4) + 3 x 4 x 8)
# = 160, vision blocks W_vis = 4 x 2^2 + 2 x 2 x 4 = 32, attention 4 x 1 layer x 4 = 16 FLOP a pair.
TOY = ModelShape("toy", hidden=4, layers=1, heads=1, kv_heads=1, head_dim=4, intermediate=8, vocab=10, tied=True,
                 vision_hidden=2, vision_depth=1, vision_intermediate=4, vision_out=4, deepstack=0)
# One group of 3 on one rank, micro-batches of 2; no tool rounds: a 2-frame prompt of
# 1024 + 2 x (1024 / 16^2 / 2^2 + 8) = 1042 tokens (8 patches), one turn of 10 new tokens.
TOY_RUN = ["rl.num_ranks=1", "rl.prompts_per_step=1", "rl.group_size=3", "rl.micro_batch_size=2",
           "rl.rollout.max_turns=0", "rl.rollout.max_new_tokens=10", "rl.gating.enabled=false", "video.nframes=2",
           "video.max_pixels=1024", "rl.rollout.engine=hf", "rl.shared_prefix=true"]


def _forward(tokens: int, pairs: int, patches: int) -> int:
    return 2 * 160 * tokens + 16 * pairs + 2 * 32 * patches


def _stage(overrides: list[str]):
    plan = memory_plan(load_config(CONFIG_8B, overrides), QWEN3_VL_8B, 8, H100)
    (stage,) = [s for s in plan.stages if s.stage == "RL policy pass"]
    return plan, stage


def test_the_8b_rank_packs_each_group_of_its_micro_batch_into_one_row():
    cfg = load_config(CONFIG_8B, ["rl.shared_prefix=true"])
    main_kind, sub = trained_kinds(cfg)
    assert main_kind == TrainedKind(PROMPT_8B, SUFFIX_8B, PATCHES_8B)
    assert sub == TrainedKind(1024 + 16 * 57, 2048, 16 * 196)
    batches = rank_micro_batches(cfg)  # 8 main agents (one group), then 8 x 15 sub-agents, by 2
    assert batches[:4] == [((main_kind, 2),)] * 4 and batches[4:] == [((sub, 1), (sub, 1))] * 60
    # a group of 3 by 2: the second micro-batch meets the group's last member and a sub-agent
    odd = rank_micro_batches(load_config(CONFIG_8B, ["rl.shared_prefix=true", "rl.group_size=3"]))
    assert odd[:2] == [((main_kind, 2),), ((main_kind, 1), (sub, 1))]


def test_the_shared_rows_keep_less_by_the_prompt_the_packing_saves_and_plan_the_piecewise_mask():
    _, per_row = _stage([])
    plan, shared = _stage(["rl.shared_prefix=true"])
    length, width = PROMPT_8B + SUFFIX_8B, PROMPT_8B + 2 * SUFFIX_8B
    # per row: 2 rows of the longest trajectory, their media twice, SDPA's [2, L, L] padding mask
    assert dict(per_row.parts)["activations"] == 2 * length * TOKEN_8B + 2 * PATCHES_8B * PATCH_8B + 3 * 2 * length ** 2
    parts = dict(shared.parts)
    # packed: one row, the prompt and its media once: one prompt's tokens and patches fewer
    assert parts["activations"] == width * TOKEN_8B + PATCHES_8B * PATCH_8B
    assert dict(per_row.parts)["activations"] - 3 * 2 * length ** 2 - parts["activations"] == \
        PROMPT_8B * TOKEN_8B + PATCHES_8B * PATCH_8B
    # the resident [1, 1, N, N] bool mask, and the longest suffix's piece (bool and bf16 bias): the
    # recompute under checkpointing attends piecewise too
    assert parts["shared-prefix mask"] == width ** 2 + 3 * SUFFIX_8B * (PROMPT_8B + SUFFIX_8B)
    assert shared.total < per_row.total and plan.fits
    assert f"1 row(s) of {width} tokens (per-row: 2 x {length})" in shared.note


def test_packed_rows_that_outweigh_what_they_save_say_so_and_name_the_switch():
    # micro-batches of 16: a group's row of 4672 + 8 x 16112 tokens and 8 sub-agents' rows padded to
    # it, their mask 9 x N^2 = 161 GB with the longest suffix's piece
    plan, shared = _stage(["rl.shared_prefix=true", "rl.micro_batch_size=16"])
    _, per_row = _stage(["rl.micro_batch_size=16"])
    width = PROMPT_8B + 8 * SUFFIX_8B
    assert dict(shared.parts)["shared-prefix mask"] == 9 * width ** 2 + 3 * SUFFIX_8B * (PROMPT_8B + SUFFIX_8B)
    assert shared.over
    assert shared.total > per_row.total
    assert f"set rl.shared_prefix: false (plans {per_row.total / GB:.1f} GB" in "\n".join(plan.refusals)
    # where packing saves more than its mask costs, the switch is not named
    _, fits = _stage(["rl.shared_prefix=true"])
    assert "rl.shared_prefix" not in fits.knobs


def test_without_checkpointing_the_mask_is_the_resident_bool_and_the_longest_suffix_piece():
    _, shared = _stage(["rl.shared_prefix=true", "rl.gradient_checkpointing=false"])
    width = PROMPT_8B + 2 * SUFFIX_8B
    assert dict(shared.parts)["shared-prefix mask"] == width ** 2 + 3 * SUFFIX_8B * (PROMPT_8B + SUFFIX_8B)
    assert dict(shared.parts)["activations"] == _activations(QWEN3_VL_8B, 1, width, PATCHES_8B, False, "sdpa",
                                                             packed=True)


def test_step_products_on_a_hand_computed_case():
    prompt, length = 1042, 1052
    alone = _forward(length, length * (length + 1) // 2, 8)
    prompt_alone = _forward(prompt, prompt * (prompt + 1) // 2, 8)
    # packed: micro-batch 1 one row of the prompt and 2 suffixes of 10, micro-batch 2 the prompt and 1
    prefix_pairs, suffix_pairs = prompt * (prompt + 1) // 2, 10 * prompt + 10 * 11 // 2
    packed = _forward(prompt + 20, prefix_pairs + 2 * suffix_pairs, 8) + _forward(prompt + 10, prefix_pairs +
                                                                                   suffix_pairs, 8)
    assert (alone, prompt_alone, packed) == (9_199_200, 9_028_400, 18_569_200)
    rows = step_products(load_config(CONFIG_8B, [*TOY_RUN, "rl.gradient_checkpointing=false"]), TOY)
    assert rows == (("policy forward+backward", 3 * 3 * alone, 3 * packed), ("reference forward", 3 * alone, packed),
                    ("rollout prefill", 3 * prompt_alone, prompt_alone),
                    ("total", 12 * alone + 3 * prompt_alone, 4 * packed + prompt_alone))
    # under checkpointing the recompute attends piecewise too: the same products (its forward not counted)
    assert step_products(load_config(CONFIG_8B, [*TOY_RUN, "rl.gradient_checkpointing=true"]), TOY) == rows


def test_paravt_plan_prints_the_products_with_the_switch_and_nothing_new_without(capsys):
    args = ["plan", "--config", CONFIG_8B, "--gpus", "8", "--gpu-memory-gib", "79"]
    assert main(args) == 0
    off = capsys.readouterr().out
    assert "matrix products" not in off and "shared-prefix" not in off
    assert memory_plan(load_config(CONFIG_8B), QWEN3_VL_8B, 8, H100).products == ()
    assert main([*args, "--set", "rl.shared_prefix=true"]) == 0
    on = capsys.readouterr().out
    table = on[on.index("matrix products"):].splitlines()
    products = step_products(load_config(CONFIG_8B, ["rl.shared_prefix=true"]), QWEN3_VL_8B)
    for (name, flat, shared), line in zip(products, table[2:]):
        assert line.split() == [*name.split(), f"{flat / 1e12:,.0f}", f"{shared / 1e12:,.0f}", f"{flat / shared:.2f}x"]
    assert "dense mask" not in on and "vllm's prefix cache" in on
    assert products[0][1] > products[0][2]  # the paper's config (checkpointing) shares its policy pass too
    # the memory rows other than the policy pass's are the same either way
    assert [line for line in off.splitlines() if "RL policy pass" not in line] == \
        [line for line in on[:on.index("RL step's matrix")].rstrip("\n").splitlines() if "RL policy pass" not in line]
