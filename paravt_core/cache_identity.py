"""Cache identity: which settings of the config key which cached result, in one place (issue #63).

A stage's cache key (its run folder's name, its Prefect task key) hashes the settings its
output depends on. Every field of the typed config (`config.PipelineConfig`) is classified
here once; tests/unit/test_cache_identity.py walks the config and fails on a field that is not:

- `HASHED`: hashed at every value;
- `HASHED_ONLY_WHEN_SET`: knobs added after stages were cached under their section: left out
  while at their default, so configs that do not use a knob keep their keys;
- `NEVER_HASHED`: knobs that never change what a stage produces (how much disk it keeps, how
  many processes probe the media, how rows are fanned out): changing one keeps the stage's key
  and resumes its run folder instead of starting it over.

A field that is a section of its own (`rl.rollout.vllm`) may be classified whole; its own
fields then count only while it is hashed. The server section of a rollout engine registered
after these tables (`rollout_engines.py`; `later_server_sections`) is classified by rule: hashed
only when set, whole (any of its fields away from its default puts all of them in the key),
left out of `rollout_json` while at its default, and never in an RL run folder's key.

The keys read these tables through the functions below, never by hand:
- `section_hash`: the hash of whole sections (`PipelineConfig.section_hash`);
- `eval_results_settings`: the evaluation's per-sample results (`eval/stage.results_config`),
  less `NOT_PER_RESULT`;
- `rl_run_config`: the RL run folder's, less where its rollout server runs (`server_location`);
- `rollout_json`: the grammar check's rollout protocol (`grammar_key_parts`);
- `model_runtime`: the `model.*` run settings a stage applies since #63 gave every stage
  the same model builder (`model.loading.build_model`), hashed when set (`APPLIED_SINCE_63`).
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Any

from pydantic_core import to_jsonable_python

from paravt_core.rollout_engines import server_engines

if TYPE_CHECKING:
    from pydantic import BaseModel

    from paravt_core.config import ModelConfig, PipelineConfig, RolloutConfig

# vLLM's placement on the machine (`rl.rollout.vllm`): hashed only when set, also in `rollout_json`.
VLLM_PLACEMENT_KNOBS = ("placement", "gpus", "tp_size", "gpu_memory_utilization")

# section (a dotted path) -> its fields hashed at every value.
HASHED: dict[str, tuple[str, ...]] = {
    "run": ("name", "output_dir", "seed"),
    "model": ("base", "dtype", "attn_implementation", "registered_name"),
    "model.tiny": ("seed", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                   "num_attention_heads", "num_key_value_heads", "head_dim", "vision_depth", "vision_hidden_size",
                   "vision_intermediate_size", "vision_num_heads", "patch_size", "spatial_merge_size",
                   "temporal_patch_size"),
    "model.pretrain": ("enabled", "seed", "videos", "windows_per_video", "event_windows", "max_steps",
                       "micro_batch_size", "learning_rate", "warmup_ratio", "checkpoint_every", "reading_rows",
                       "reading_steps", "reading_transcripts", "sft_replay_rows"),
    "video": ("nframes", "min_pixels", "max_pixels", "crop_fps", "crop_min_frames", "crop_max_frames", "sft_fps",
              "sft_max_frames"),
    "data": ("source", "hub_cache_dir", "parquet_repo", "source_repo", "revision", "benchmark_revisions",
             "download_retries", "on_bad_rows"),
    "data.synth": ("seed", "train_videos", "eval_videos_per_split", "eval_rows_per_split", "min_duration_s",
                   "max_duration_s", "fps", "width", "height", "min_events", "max_events", "min_event_s",
                   "max_event_s", "overview_blind_frames", "overview_blind_budgets", "visible_event_share",
                   "visible_event_min_s", "visible_event_max_s", "sft_traces_per_video", "rl_prompts_per_video",
                   "no_tool_share", "max_calls_per_trace", "max_crop_s", "event_kinds", "prompts", "direct_share",
                   "final_reasoning", "question_topics", "colours", "option_order", "teacher_windows",
                   "subagent_traces_per_video", "rl_overview_share", "second_wording", "second_wording_look",
                   "codec", "empty_videos", "revision"),
    "sft": ("max_steps", "learning_rate", "lr_schedule", "warmup_ratio", "weight_decay", "grad_clip",
            "micro_batch_size", "grad_accum_steps", "max_seq_len", "overlong", "zero_stage", "num_ranks", "hostfile",
            "gradient_checkpointing", "checkpoint_every"),
    "sft.deepspeed": ("offload_optimizer", "offload_param", "nvme_path", "pin_memory", "cpu_optimizer",
                      "overlap_comm", "reduce_bucket_size", "allgather_bucket_size", "stage3_prefetch_bucket_size",
                      "stage3_param_persistence_threshold"),
    "rl": ("row", "max_steps", "prompts_per_step", "group_size", "temperature", "question_types", "reward_shift",
           "reward_scale", "reward_clip", "clip_eps", "kl_mode", "kl_coef", "ref_temperature", "kl_clamp", "adv_eps",
           "batch_norm_advantages", "moments_main_agent_only", "decoupled_ppo", "behaviour_weight_cap",
           "learning_rate", "weight_decay", "grad_clip", "anchoring_mode", "train_subagents", "micro_batch_size",
           "logprob_chunk", "zero_stage", "num_ranks", "hostfile", "checkpoint_every"),
    "rl.deepspeed": ("offload_optimizer", "offload_param", "nvme_path", "pin_memory", "cpu_optimizer",
                     "overlap_comm", "reduce_bucket_size", "allgather_bucket_size", "stage3_prefetch_bucket_size",
                     "stage3_param_persistence_threshold"),
    "rl.reward": ("scope", "format_weight", "answer_suffix", "anchor_weight", "unclosed_think_penalty",
                  "use_tool_reward", "oe_mode"),
    "rl.rollout": ("max_turns", "max_parallel", "tool_response_max_tokens", "think_prefix", "max_new_tokens",
                   "subagent_max_new_tokens", "engine"),
    "rl.rollout.sglang": ("url", "placement", "gpus", "tp_size", "mem_fraction_static", "startup_timeout_s",
                          "request_timeout_s"),
    "rl.rollout.vllm": ("url", "python", "max_model_len", "startup_timeout_s", "request_timeout_s"),
    "rl.gating": ("enabled", "choices"),
    "eval": ("splits", "prompt_mode", "grounding_prompt_mode", "tool_mode", "dispatch", "nframes", "max_new_tokens",
             "max_turns", "max_parallel", "engine", "endpoint", "served_model_name", "request_timeout_s",
             "concurrency", "max_samples_per_split"),
    "mlflow": ("tracking_uri", "experiment"),
    "reproduce": ("rows", "seeds"),
    "reproduce.probe": ("enabled", "split", "questions", "samples", "frames", "temperature", "seed"),
}

# (section, field), in the order they came.
HASHED_ONLY_WHEN_SET: tuple[tuple[str, str], ...] = (
    ("video", "sft_frame_choices"), ("sft", "loss_impl"), ("sft", "liger_kernels"), ("sft", "packing"),
    ("mlflow", "enabled"), ("rl", "gradient_checkpointing"), ("model", "vision_attention"),
    ("model", "vision_dedupe"), ("model", "patch_embed"), ("model", "prefill_attention"),
    ("sft", "data_workers"), ("sft", "host_positions"), ("eval", "server_python"), ("rl.rollout", "vllm"),
    ("data.synth", "validation"), ("rl.gating", "draw_key"), ("sft", "grammar_batch"),
    ("rl", "served_logprob_tolerance"),
    ("data", "max_quarantine_share"),
    # After ("rl.rollout", "vllm"): a vllm section at its default is gone by then.
    *(("rl.rollout.vllm", knob) for knob in VLLM_PLACEMENT_KNOBS),
    # Also in the evaluation's results (`eval_results_settings`): a sampled probe's draws depend on
    # how a turn is cut, and a GPU's greedy kernels on the rows of a batch.
    ("eval", "hf_batch_tokens"),
    ("eval", "server"), ("eval", "gpus"), ("eval", "server_startup_timeout_s"),
    ("sft", "pin_memory"), ("sft", "host_pixel_dtype"), ("sft", "compile_text_layers"),
    ("reproduce", "probe"), ("sft", "seed"), ("data.synth", "crop_opening"),
    ("data.synth", "teacher_budgets"), ("data.synth", "subagent_error_rate"),
    ("data.synth", "skip_when_seen"), ("model.pretrain", "overview_rows"), ("data.synth", "direct_check"),
    ("model.pretrain", "num_ranks"), ("reproduce", "rl_validation"), ("reproduce", "variants"),
    # Float rounding only (tests/integration/test_shared_prefix.py), keyed when set as the model's
    # rounding switches are.
    ("rl", "shared_prefix"),
    # The one-step off-policy schedule (issue #65, `rl/overlap.py`): 0 is the step as it was cached.
    ("rl", "overlap"),
    # SFT builds of the reproduction (#62 item 4): empty is the one SFT model as it was cached.
    ("reproduce", "sft_seeds"),
)

# run.fanout: how many rows run at once and on how many threads (docs/scale.md, "Fanning out RL rows").
# reproduce.report_dir: where the report (never cached) is written; reproduce.budget_sweep: whether it
# measures the sweep (a part of a profile without it is a part of the same profile).
# rl.overlap_*_threads: how a rank's threads are split under rl.overlap (as run.fanout's budget, never keyed).
NEVER_HASHED: tuple[tuple[str, str], ...] = (("sft", "keep_last"), ("rl", "keep_last"), ("data", "probe_workers"),
                                            ("run", "fanout"), ("reproduce", "report_dir"),
                                            ("reproduce", "budget_sweep"), ("rl", "overlap_trainer_threads"),
                                            ("rl", "overlap_engine_threads"))

# `eval` fields that choose, schedule or start samples without changing any one result (the
# served-model check holds whatever serves to the checkpoint): not in the results' key.
NOT_PER_RESULT = ("splits", "max_samples_per_split", "concurrency", "server_python", "server", "gpus",
                  "server_startup_timeout_s")


def server_location() -> tuple[str, ...]:
    """The `rl.rollout` sections that say where a rollout server runs (every registered server
    engine's): not part of an RL run's folder key, so a run whose server died resumes from its
    checkpoint against a new one. A function: the config registers the engines after importing this."""
    return server_engines()


def later_server_sections() -> tuple[str, ...]:
    """The server sections these tables do not classify: those of engines registered after them."""
    return tuple(name for name in server_engines() if f"rl.rollout.{name}" not in HASHED)


def hashed_only_when_set() -> tuple[tuple[str, str], ...]:
    """`HASHED_ONLY_WHEN_SET` and the later server sections, each whole."""
    return (*HASHED_ONLY_WHEN_SET, *(("rl.rollout", name) for name in later_server_sections()))

# `model.*` run settings each stage applies since #63 (`model.loading.build_model`) and did not
# before: hashed into that stage's key only when set, as a knob added after it was cached (the
# stage ran them at these defaults until then). SFT applied `vision_attention` already and the
# evaluation every run setting but the attention; the RL stage and the sampled probe all of them.
RUN_SETTINGS = ("vision_dedupe", "patch_embed", "prefill_attention")
APPLIED_SINCE_63 = {
    "sft": RUN_SETTINGS,
    "sft-grammar": ("vision_attention", *RUN_SETTINGS),
    "eval": ("attn_implementation",),
}

# The `model` fields a cached pretraining depends on (`miniature/pretrain_cache.pretraining_key`),
# besides those `APPLIED_SINCE_63["sft"]` adds when set (it trains with the SFT worker).
PRETRAIN_MODEL_FIELDS = ("dtype", "attn_implementation", "vision_attention")


def _hash(value: Any, length: int = 16) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:length]


def _default(section: BaseModel, field: str) -> Any:
    """A field's default as a JSON dump holds it (a model as a dict, a tuple as a list)."""
    return to_jsonable_python(type(section).model_fields[field].default)


def section_hash(cfg: PipelineConfig, *names: str) -> str:
    """Stable hash (16 hex) of some top-level sections of `cfg` (all when none given), by the tables."""
    dumped = cfg.model_dump(mode="json")
    for section, field in hashed_only_when_set():
        owner, values = cfg, dumped
        for part in section.split("."):
            owner, values = getattr(owner, part), values.get(part, {})
        if field in values and values[field] == _default(owner, field):
            del values[field]
    for section, field in NEVER_HASHED:
        dumped[section].pop(field, None)
    return _hash({n: dumped[n] for n in (names or tuple(dumped))})


def model_runtime(model: ModelConfig, stage: str) -> dict[str, str]:
    """`APPLIED_SINCE_63[stage]`'s settings that `model` sets to other than their defaults."""
    return {name: getattr(model, name) for name in APPLIED_SINCE_63[stage]
            if getattr(model, name) != type(model).model_fields[name].default}


def eval_results_settings(cfg: PipelineConfig) -> dict[str, Any]:
    """The settings an evaluation's per-sample result depends on (`eval/stage.results_config`
    adds the prompts' source digest): the `eval` section by the tables, less `NOT_PER_RESULT`;
    the `video` section whole (every cached result's key holds every field of it); the model's
    dtype and run settings (`model_runtime`); the rollout's token caps the evaluation reads."""
    shaping = cfg.eval.model_dump(mode="json", exclude=set(NOT_PER_RESULT))
    for section, field in HASHED_ONLY_WHEN_SET:
        if section == "eval" and field in shaping and shaping[field] == _default(cfg.eval, field):
            del shaping[field]
    rollout = cfg.rl.rollout
    settings = {"eval": shaping, "video": cfg.video.model_dump(mode="json"), "dtype": cfg.model.dtype,
                "subagent_max_new_tokens": rollout.subagent_max_new_tokens,
                "tool_response_max_tokens": rollout.tool_response_max_tokens}
    if runtime := model_runtime(cfg.model, "eval"):
        settings["model_runtime"] = runtime
    return settings


def rl_run_config(cfg: PipelineConfig) -> PipelineConfig:
    """`cfg` with `server_location()` at their defaults: what an RL run folder's key hashes."""
    rollout = cfg.rl.rollout
    blank = {name: type(getattr(rollout, name))() for name in server_location()}
    return cfg.model_copy(update={"rl": cfg.rl.model_copy(update={"rollout": rollout.model_copy(update=blank)})})


def rollout_json(rollout: RolloutConfig) -> str:
    """The rollout section's JSON, less the vLLM placement knobs and the later server sections
    while at their defaults."""
    default = type(rollout.vllm)()
    unset = {knob for knob in VLLM_PLACEMENT_KNOBS if getattr(rollout.vllm, knob) == getattr(default, knob)}
    fields = type(rollout).model_fields
    later = {name: True for name in later_server_sections() if getattr(rollout, name) == fields[name].default}
    return rollout.model_dump_json(exclude={"vllm": unset, **later})


def sft_run_settings(cfg: PipelineConfig) -> str:
    """What an SFT run folder's key reads of the config: the `sft`, `video` and `run` sections and
    the model run settings SFT applies since #63 when set."""
    runtime = model_runtime(cfg.model, "sft")
    return section_hash(cfg, "sft", "video", "run") + (f"|model={_hash(runtime)}" if runtime else "")


def grammar_key_parts(cfg: PipelineConfig) -> tuple[str, ...]:
    """What the SFT grammar check's key reads of the config: the rollout protocol, the frame
    settings, and the model run settings it applies since #63 when set."""
    runtime = model_runtime(cfg.model, "sft-grammar")
    return (rollout_json(cfg.rl.rollout), section_hash(cfg, "video"), *([_hash(runtime)] if runtime else []))


def pretrain_model_settings(model: ModelConfig) -> dict[str, Any]:
    """The `model` settings a cached pretraining depends on (`PRETRAIN_MODEL_FIELDS`, and the SFT
    worker's run settings when set)."""
    return {**model.model_dump(mode="json", include=set(PRETRAIN_MODEL_FIELDS)), **model_runtime(model, "sft")}
