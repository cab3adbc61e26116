"""Typed pipeline configuration, loaded from `conf/**/*.yaml` and validated at load.

Every model is frozen and forbids unknown keys, and no float may be inf or nan, so a typo
or a bad value fails when the YAML is read, before any model loads. A YAML file or a
`--set` value that does not parse is a `ConfigError` naming the file or the item. Defaults are the SPEC's (section cited per field
group); `conf/pipeline/paravt_8b.yaml` spells the paper's run out in full and
`conf/pipeline/tiny.yaml` is the embedded CPU default.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError

from paravt_core import cache_identity
from paravt_core.atomic import folder_problem
from paravt_core.data.synth.config import SynthConfig
from paravt_core.eval.splits import EVAL_SPLITS, LAYOUTS, VALIDATION_SPLITS
from paravt_core.rollout_engines import (ROLLOUT_ENGINES, RolloutEngineSpec, ServerSection, register_rollout_engine,
                                         rollout_engine_spec)
from paravt_core.seeds import Seed


# The most threads or processes a knob may ask of one machine (#61 item 6): well above the
# hardware threads of any one node (384 on a two-socket, 192-core one), and far below what
# makes the OS refuse threads (torch.set_num_threads(65536) ends in SIGSEGV once libgomp
# cannot create them). A count above this machine's cores only oversubscribes it.
MAX_WORKERS = 1024
# The attention implementations `rl.shared_prefix` runs under: those that take an explicit mask.
SHARED_PREFIX_ATTENTION = ("sdpa", "eager")


class _Section(BaseModel):
    # allow_inf_nan=False: `rl.learning_rate=.inf` or `rl.reward.format_weight=.nan` would
    # otherwise pass every unbounded float field and surface only as a diverged run.
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class FanoutConfig(_Section):
    """How `paravt reproduce` and the ablations flow run their RL rows (issue #45 item 5,
    docs/scale.md "Fanning out RL rows"): at most `max_concurrent` rows at once, each row's
    RL run and its evaluations one unit of work, on Prefect's thread pool task runner.

    `threads_per_run` is one row's CPU thread budget: its RL ranks share it (OMP_NUM_THREADS
    of each rank: the budget over the ranks, at least 1) and its in-process evaluations run
    torch on that many threads. None keeps what a run got before: the host's cores shared
    by the ranks (or OMP_NUM_THREADS where set) and torch's default in process. On CPU a
    row's weights differ between 1 and 2 threads (bench/fanout.py), so a row compared across
    runs should keep it."""

    max_concurrent: int = Field(1, ge=1)  # 1: one row after the other, as before
    threads_per_run: int | None = Field(None, ge=1, le=MAX_WORKERS)
    # "threads": the rows run in this flow's process (above). "work_pool": each RL row is a flow
    # run of the `paravt/rl-row` deployment taken by a worker of `work_pool` (one per node, limit
    # 1), its artifacts under run.output_dir, which every node must mount (docs/scale.md "Rows on
    # a cluster"); max_concurrent then bounds only the jobs that stay here (the SFT measurements).
    runner: Literal["threads", "work_pool"] = "threads"
    work_pool: str = Field("paravt-rows", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


class RunConfig(_Section):
    name: str = Field("paravt-tiny", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    output_dir: Path = Path("outputs/tiny")
    seed: Seed = 0  # 0 to paravt_core.seeds.MAX_SEED (2^26 - 1), as every seed
    fanout: FanoutConfig = FanoutConfig()


class PretrainConfig(_Section):
    """Perception pretraining of the tiny base model (`paravt_core.miniature.pretrain`, #15).

    The real Qwen3-VL arrives able to describe a clip; the random-weight tiny one does not,
    and cold-start SFT at batch 1 never taught it to (the sub-agent named held-out event
    colours at chance). Off by default; `conf/pipeline/reproduce.yaml` turns it on.
    """

    enabled: bool = False
    seed: Seed = 0  # the corpus's own video stream (never a training or evaluation video)
    videos: int = Field(300, ge=1)
    windows_per_video: int = Field(8, ge=1)
    # The share of a video's random clip windows (those beyond its grid segments) drawn to hold
    # an event whole (`pretrain.clip_windows`). 0: drawn anywhere, so with one short event per
    # video about seven windows in ten show nothing and the first word of a caption is mostly
    # "Nothing" (`paravt miniature caption-probe`'s `detected`).
    event_windows: float = Field(0.0, ge=0.0, le=1.0)
    max_steps: int = Field(1000, ge=1)
    micro_batch_size: int = Field(8, ge=1)  # per rank: a step trains on micro_batch_size x num_ranks rows
    # Data-parallel ranks of both phases (DeepSpeed, as cold-start SFT's `sft.num_ranks`), each on its
    # share of the host's cores (why the reproduction runs 2: docs/log/config-notes.md). A
    # step's loss is then the mean of the ranks' own token means, not one token mean over its rows.
    num_ranks: int = Field(1, ge=1, le=MAX_WORKERS)
    learning_rate: float = Field(1e-3, gt=0)
    warmup_ratio: float = Field(0.05, ge=0, lt=1)
    checkpoint_every: int = Field(200, ge=1)
    # A second phase on text-only reading rows (`paravt_core.miniature.pretrain.reading_row`): a
    # video's notes, a multiple-choice question on one of its events as the evaluation asks
    # it, the answer quoted from the notes and the options checked. 0 rows: no reading phase.
    # Same micro-batch and learning rate.
    reading_rows: int = Field(0, ge=0)
    reading_steps: int = Field(3000, ge=1)
    # The share of reading rows written as a text-only agent transcript (`pretrain.transcript_row`):
    # the question, the teacher's crop calls, the notes as the tool's replies and the final turn,
    # so the options stand as far back as in an agent's own transcript (hundreds of tokens).
    reading_transcripts: float = Field(0.0, ge=0, le=1)
    # Overview rows per pretraining video in the captioning corpus (`pretrain.overview_row`): the
    # whole video's K overview frames (K from data.synth.teacher_budgets, else the SFT budgets),
    # captioned with what those K frames show, so the main agent can read an overview as the real
    # base model can (#46 item 2). 0: clips only.
    overview_rows: int = Field(0, ge=0)
    # Rows of the pretraining corpora (reading rows and captioned clips, drawn uniformly from
    # the reading phase's corpus) mixed into cold-start SFT's rows, so that SFT does not undo
    # what pretraining taught (`paravt_core.miniature.pretrain.replay_shard`). 0: none.
    sft_replay_rows: int = Field(0, ge=0)


class TinyModelSpec(BaseModel):
    """Sizes of the tiny Qwen3-VL (`paravt_core.model.tiny` builds it). Defaults give about 1.5 M parameters."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    seed: Seed = 0
    vocab_size: int = Field(2048, ge=512, le=32768)
    hidden_size: int = Field(128, ge=16)
    intermediate_size: int = Field(384, ge=16)
    num_hidden_layers: int = Field(4, ge=1)
    num_attention_heads: int = Field(4, ge=1)
    num_key_value_heads: int = Field(2, ge=1)
    head_dim: int = Field(32, ge=4)
    vision_depth: int = Field(2, ge=1)
    vision_hidden_size: int = Field(64, ge=8)
    vision_intermediate_size: int = Field(128, ge=8)
    vision_num_heads: int = Field(2, ge=1)
    patch_size: int = 16
    spatial_merge_size: int = 2
    temporal_patch_size: int = 2


class ModelConfig(_Section):
    """Which base model the pipeline starts from.

    `base: tiny` builds the random-weight tiny Qwen3-VL locally (`paravt_core.model.tiny`);
    anything else is a local model directory or a hub id such as
    `Qwen/Qwen3-VL-8B-Instruct`, loaded with the same `load_model` call.
    """

    base: str = "tiny"
    tiny: TinyModelSpec = TinyModelSpec()
    dtype: Literal["float32", "bfloat16"] = "float32"  # on GPUs; CPU ranks train in fp32
    # sdpa: PyTorch's fused attention, any device. flash_attention_2: the flash-attn package,
    # CUDA and bf16 only. eager: the plain matmul-softmax reference (debugging).
    attn_implementation: Literal["sdpa", "flash_attention_2", "eager"] = "sdpa"
    # The vision tower's attention without flash-attn: per_item is transformers' one call per
    # frame; batched is one call per run of equal-sized frames, the same arithmetic
    # (paravt_core/model/vision_attention.py). Applied wherever a stage runs a model: every load
    # goes through `model.loading.build_model` (SFT, RL, the grammar check, the evaluation, the
    # probes; tests/unit/test_one_road.py). On CPU with sdpa the two give the same bits
    # (log-probs and gradients, tests/integration/test_speed_determinism.py); batched is the faster (docs/speed.md).
    vision_attention: Literal["per_item", "batched"] = "per_item"
    # Faster paths of a loaded model (paravt_core/model/fast_paths.py, docs/speed.md), applied
    # where vision_attention is. vision_dedupe: a batch's repeated frames (a group's shared
    # overview frames) go through the vision tower once; no_grad (rollout prefills, the
    # reference, evaluation) gives the same bits, always also in the policy's update, whose
    # gradient is then summed in another order. patch_embed linear: the patch Conv3d as one
    # matrix product. prefill_attention causal_rows: a left-padded prefill or teacher-forced
    # pass runs the causal kernel on each row's unpadded part instead of an explicit mask.
    # The last two change float rounding (bounds in tests/integration/test_speed_determinism.py).
    # no_grad's same bits are shown on CPU; a GPU's matrix products over fewer rows may pick
    # other kernels, so there `never` is the one that keeps the bits of the code before #45.
    vision_dedupe: Literal["never", "no_grad", "always"] = "no_grad"
    patch_embed: Literal["conv", "linear"] = "conv"
    prefill_attention: Literal["masked", "causal_rows"] = "masked"
    registered_name: str = "paravt-tiny"
    pretrain: PretrainConfig = PretrainConfig()

    @property
    def is_tiny(self) -> bool:
        return self.base == "tiny"

    @model_validator(mode="after")
    def _pretrain_only_tiny(self) -> ModelConfig:
        if self.pretrain.enabled and not self.is_tiny:
            raise ValueError("model.pretrain.enabled is for the tiny model (base: tiny); a real checkpoint "
                             f"({self.base}) already sees")
        if self.pretrain.sft_replay_rows and not (self.pretrain.enabled and self.pretrain.reading_rows):
            raise ValueError(f"model.pretrain.sft_replay_rows={self.pretrain.sft_replay_rows} replays the reading "
                             "phase's corpus: set model.pretrain.enabled and reading_rows, or sft_replay_rows: 0")
        corpus = self.pretrain.reading_rows + self.pretrain.videos * self.pretrain.windows_per_video
        if self.pretrain.sft_replay_rows > corpus:
            raise ValueError(f"model.pretrain.sft_replay_rows={self.pretrain.sft_replay_rows} > the {corpus} rows of "
                             "the reading phase's corpus (reading_rows + videos x windows_per_video): lower it")
        return self

    @model_validator(mode="after")
    def _flash_attention_needs_bf16(self) -> ModelConfig:
        if self.attn_implementation == "flash_attention_2" and self.dtype != "bfloat16":
            raise ValueError("model.attn_implementation: flash_attention_2 runs in bf16 only; set model.dtype: bfloat16")
        return self


class VideoConfig(_Section):
    """Frame sampling (SPEC §1, §3)."""

    nframes: int = Field(64, ge=1)
    min_pixels: int = Field(784, ge=1)
    max_pixels: int = Field(50176, ge=1)
    crop_fps: float = Field(1.0, gt=0)
    crop_min_frames: int = Field(1, ge=1)
    crop_max_frames: int = Field(16, ge=1)
    sft_fps: float = Field(1.0, gt=0)
    sft_max_frames: int = Field(64, ge=1)
    # SFT overview frame budgets: each main-agent row gets at most K overview frames, K drawn
    # from these by a stable hash of the row (`sft.dataset.overview_budget`), so that a model that
    # cannot generalize across frame counts (the tiny one) has seen every budget RL's nFrames
    # gating (rl.gating.choices, SPEC §5) asks for. None: every row gets sft_max_frames.
    sft_frame_choices: tuple[Annotated[int, Field(ge=1)], ...] | None = Field(None, min_length=1)

    @model_validator(mode="after")
    def _bounds(self) -> VideoConfig:
        if self.min_pixels > self.max_pixels:
            raise ValueError(f"video.min_pixels ({self.min_pixels}) exceeds video.max_pixels ({self.max_pixels})")
        if self.crop_min_frames > self.crop_max_frames:
            raise ValueError("video.crop_min_frames exceeds video.crop_max_frames")
        if self.sft_frame_choices and max(self.sft_frame_choices) > self.sft_max_frames:
            raise ValueError(f"video.sft_frame_choices {list(self.sft_frame_choices)} go past video.sft_max_frames "
                             f"({self.sft_max_frames}), which caps every SFT overview")
        return self


class DataConfig(_Section):
    """Where the ParaVT release and the benchmarks come from (SPEC §8).

    `source: synth` generates the long-video world (`paravt_core.data.synth`) and lays it
    out as a local hub cache, so the same download code then runs offline against it;
    `source: hub` downloads the real repositories (into `hub_cache_dir` when set).
    """

    source: Literal["synth", "hub"] = "synth"
    synth: SynthConfig = SynthConfig()
    hub_cache_dir: Path | None = None
    parquet_repo: str = "ParaVT/ParaVT-Parquet"
    source_repo: str = "ParaVT/ParaVT-Source"
    revision: str = "main"
    # Benchmark repo id -> the revision (a commit sha for a reproducible eval) to fetch it at
    # with `source: hub`; unlisted benchmark repos come from "main".
    benchmark_revisions: dict[str, str] = Field(default_factory=dict)
    download_retries: int = Field(3, ge=0)
    on_bad_rows: Literal["fail", "quarantine"] = "fail"
    # Under quarantine, the most a contract may set aside: the share of a kind's rows (SFT, RL,
    # each eval split). One bad video among ~10^5 rows is set aside instead of failing hours of
    # checks; a broken archive or a bad mirror, which takes many, still stops the stage. None: no
    # ceiling. Moot under `fail`, which sets nothing aside (so `--set data.on_bad_rows=fail` alone
    # makes the 8B config strict).
    max_quarantine_share: float | None = Field(None, ge=0, le=1)
    # Processes probing the videos of the media-health rule (`paravt_core.video.health`); None: one
    # per CPU core. Changes no verdict (NEVER_HASHED).
    probe_workers: int | None = Field(None, ge=1, le=MAX_WORKERS)

    @model_validator(mode="after")
    def _pins_name_benchmark_repos(self) -> DataConfig:
        known = sorted({layout.repo_id for layout in LAYOUTS.values()})
        unknown = sorted(set(self.benchmark_revisions) - set(known))
        if unknown:
            raise ValueError(f"benchmark_revisions names {unknown}, which no split reads; benchmark repos: {known}")
        if self.benchmark_revisions and self.source == "synth":
            raise ValueError("benchmark_revisions applies to source: hub (the synth mirror sits at synth.revision)")
        return self


Offload = Literal["none", "cpu", "nvme"]


class DeepSpeedConfig(_Section):
    """ZeRO memory settings shared by SFT and RL; the stage is the section's `zero_stage`.

    `paravt config show --config C` prints the DeepSpeed JSON these turn into. Offloading
    the optimizer moves its fp32 master weights and Adam moments (12 bytes per parameter)
    to host memory or NVMe; offloading parameters (ZeRO-3 only) moves the bf16 weights too.
    DeepSpeed refuses a client optimizer with optimizer offload unless told otherwise
    (`zero_force_ds_cpu_optimizer`): `cpu_optimizer` picks DeepSpeed's CPU Adam (its C++
    op is JIT-built on first use; DeepSpeed's tutorial measures it 5-7x faster than the
    PyTorch AdamW on CPU) or keeps PyTorch's AdamW stepping on the host (no build, slower).
    Bucket sizes are in elements; the defaults are DeepSpeed's own.
    """

    offload_optimizer: Offload = "none"
    offload_param: Offload = "none"
    nvme_path: Path | None = None  # a fast local NVMe folder, needed by either `nvme` offload
    pin_memory: bool = True  # page-locked host buffers: faster copies, but they cannot be swapped out
    cpu_optimizer: Literal["deepspeed_cpu_adam", "torch_adamw"] = "deepspeed_cpu_adam"
    overlap_comm: bool | None = None  # None: DeepSpeed's default for the stage (on for ZeRO-3 only)
    reduce_bucket_size: int = Field(500_000_000, ge=1)
    allgather_bucket_size: int = Field(500_000_000, ge=1)  # ZeRO-1/2
    stage3_prefetch_bucket_size: int = Field(50_000_000, ge=1)
    stage3_param_persistence_threshold: int = Field(100_000, ge=0)

    def check_stage(self, zero_stage: int, section: str) -> None:
        """Refuse offload settings that the ZeRO stage cannot honour."""
        where = f"{section}.deepspeed"
        if self.offload_optimizer != "none" and zero_stage == 0:
            raise ValueError(f"{where}.offload_optimizer={self.offload_optimizer} needs {section}.zero_stage >= 1 "
                             "(ZeRO-0 keeps no partitioned optimizer state to offload)")
        if self.offload_param != "none" and zero_stage != 3:
            raise ValueError(f"{where}.offload_param={self.offload_param} needs {section}.zero_stage: 3 (only "
                             f"ZeRO-3 partitions parameters), not {zero_stage}")
        uses_nvme = "nvme" in (self.offload_optimizer, self.offload_param)
        if uses_nvme and self.nvme_path is None:
            raise ValueError(f"{where}: nvme offload needs {where}.nvme_path (a folder on a local NVMe drive)")
        if self.nvme_path is not None and not uses_nvme:
            raise ValueError(f"{where}.nvme_path is set but nothing offloads to nvme; set offload_optimizer or "
                             "offload_param to nvme, or drop nvme_path")


class SFTConfig(_Section):
    """Cold-start SFT (SPEC §1: lr 2e-5 cosine, warmup 5%, bf16, 64 frames at 1 fps)."""

    max_steps: int = Field(1500, ge=1)
    # The seed of cold-start SFT alone (its data order, its initial RNG state) in place of
    # `run.seed`, which also seeds what SFT starts from (the miniature's pretraining, the replay
    # rows): several SFT seeds from one base without training the base again (#46 item 1).
    # None: `run.seed`. `sft.stage.seeded` applies it.
    seed: Seed | None = None
    learning_rate: float = Field(2e-5, gt=0)
    lr_schedule: Literal["cosine", "constant"] = "cosine"
    warmup_ratio: float = Field(0.05, ge=0, lt=1)
    weight_decay: float = Field(0.0, ge=0)
    grad_clip: float = Field(1.0, gt=0)
    micro_batch_size: int = Field(1, ge=1)
    grad_accum_steps: int = Field(1, ge=1)
    max_seq_len: int = Field(16384, ge=128)
    overlong: Literal["truncate", "skip"] = "skip"
    zero_stage: int = Field(3, ge=0, le=3)
    num_ranks: int = Field(1, ge=1, le=MAX_WORKERS)  # processes started on this machine (a hostfile's are its own)
    hostfile: str | None = None  # DeepSpeed hostfile for multi-node runs (num_ranks is then ignored)
    # Recompute activations in the backward pass: slower (its MFU cost: docs/log/config-notes.md)
    # but lets micro-batches of 2-8 long video
    # samples fit (batch 4 runs out of 80 GB without it). Off for the tiny model.
    gradient_checkpointing: bool = False
    # How the token loss is computed (sft/loss.py): "logits" = the model's own loss over
    # [tokens, 151,936] logits; "chunked" = only trained positions projected, 1024 rows at a
    # time (same values, no full logits); "liger" = Liger's fused linear cross-entropy (Triton,
    # CUDA only; not under ZeRO-3, whose partitioned head it cannot gather).
    loss_impl: Literal["logits", "chunked", "liger"] = "logits"
    # Liger's Triton RMSNorm and RoPE in the text model (CUDA only).
    liger_kernels: bool = False
    # Concatenate a micro-batch's samples into one row (per-sample 3-D positions, attention kept
    # inside each sample) instead of right-padding them; same loss, no padded positions.
    packing: bool = False
    # Worker processes that encode the next micro-batches while the GPU trains (sft/loader.py):
    # the same samples in the same order. 0 encodes in the training process (CPU runs, whose
    # two cores the workers would only take from the training).
    data_workers: int = Field(0, ge=0, le=MAX_WORKERS)
    # Compute the 3-D rope positions and the vision tower's position tables where the samples are
    # encoded (CPU, a data worker if any), not in the forward: on a GPU the forward's own loop over
    # images is ~3,400 small kernels and 256 host syncs per 64-frame sample (model/positions.py).
    # Same values either way; off only to measure it.
    host_positions: bool = True
    # Three switches of issue #47, off until a GPU measures each faster (bench/sft_gpu.py, its
    # `-pin`, `-bf16px` and `-compile` variants); every one trains the same losses (tests/unit/test_sft_switches.py).
    # Page-locked host batches (the data workers' pin thread, else in line) copied to the GPU without
    # blocking the host; nothing to pin on a CPU run, where it does nothing.
    pin_memory: bool = False
    # Pixel values cast to bfloat16 where the sample is encoded: half the bytes to copy, and the
    # same values a bf16 model's patch embedding casts them to (only allowed with a bf16 model).
    host_pixel_dtype: Literal["float32", "bfloat16"] = "float32"
    # torch.compile of each text decoder layer (one graph per layer shape, reused by all 28/36).
    compile_text_layers: bool = False
    checkpoint_every: int = Field(100, ge=1)
    # Step folders kept in the run's checkpoints/ (`dist.checkpoints.prune_checkpoints`); None keeps every one.
    # At 8B a ZeRO-3 checkpoint is ~105 GB (issue #44). Never part of a cache key (NEVER_HASHED).
    keep_last: int | None = Field(None, ge=1)
    # Episodes rolled out together in the grammar check after SFT (sft/grammar.py). None: all its
    # prompts at once (56 on the seven splits). What one `generate` holds on the GPU is bounded by
    # eval.hf_batch_tokens (a turn's 280 sub-agent prompts or 56 answer-turn contexts at 8B are far
    # more than an 80 GB card holds without it: `paravt plan`, issue #44).
    grammar_batch: int | None = Field(None, ge=1)
    deepspeed: DeepSpeedConfig = DeepSpeedConfig()

    @model_validator(mode="after")
    def _offload_fits_stage(self) -> SFTConfig:
        self.deepspeed.check_stage(self.zero_stage, "sft")
        if self.loss_impl == "liger" and self.zero_stage == 3:
            raise ValueError("sft.loss_impl=liger reads the output head's weight directly, which ZeRO-3 partitions; "
                             "use sft.loss_impl=chunked with sft.zero_stage=3, or a zero_stage of 0-2")
        return self


class RewardConfig(_Section):
    """Reward knobs (SPEC §4)."""

    scope: Literal["transcript", "generated"] = "generated"  # SPEC §4.5: the paper rows score generated tokens
    format_weight: float = 1.0
    answer_suffix: bool = True
    anchor_weight: float = Field(0.5, ge=0)
    unclosed_think_penalty: bool = True
    use_tool_reward: bool = True
    oe_mode: Literal["exact", "f1", "llm"] = "f1"


class SGLangServerConfig(_Section):
    """Where the `sglang` rollout engine's server runs (`paravt_core/agent/sglang_engine.py`).

    `url` set: every rank sends its rollouts to that running server and rank 0 pushes the
    new weights to it after each optimizer step. `url` unset: rank 0 launches one server
    (`python -m sglang.launch_server`, needs the GPU install profile) and stops it at the end.

    `placement` (issue 14 item 2):
    - `colocated`: the server shares the training GPUs; it is launched with
      `--enable-memory-saver`, and its weights and KV cache are released
      (`/release_memory_occupation`) after each rollout and resumed before the weight update,
      so the reference / proximal passes and the optimizer step have the GPU memory.
      For a machine whose every GPU trains.
    - `split`: the server has GPUs of its own (`gpus`, given as CUDA device indices when it
      is launched here) and the trainers the rest; nothing is released between phases.
      The 8B plan (`conf/pipeline/paravt_8b.yaml`) uses this: its 7 ranks (one prompt group
      each) train on GPUs 0-6 with ZeRO-3, which leaves GPU 7 to serve the bf16 8B policy
      (about 17 GB of weights, the rest KV cache) without sleep/wake round trips.
    """

    url: str | None = Field(None, pattern=r"^https?://")
    placement: Literal["colocated", "split"] = "colocated"
    gpus: tuple[int, ...] = ()
    tp_size: int = Field(1, ge=1)
    mem_fraction_static: float | None = Field(None, gt=0, lt=1)
    startup_timeout_s: float = Field(900.0, gt=0)
    request_timeout_s: float = Field(3600.0, gt=0)

    @model_validator(mode="after")
    def _placement_fits(self) -> SGLangServerConfig:
        if self.placement == "colocated" and self.gpus:
            raise ValueError("rl.rollout.sglang.gpus is for placement: split (a colocated server uses the "
                             "training GPUs)")
        if self.placement == "split" and self.url is None and not self.gpus:
            raise ValueError("rl.rollout.sglang.placement is split but neither sglang.url (a running server) nor "
                             "sglang.gpus (the CUDA devices to launch it on) is set")
        if self.gpus and len(self.gpus) % self.tp_size:
            raise ValueError(f"rl.rollout.sglang.gpus ({list(self.gpus)}) is not a multiple of tp_size "
                             f"({self.tp_size})")
        return self


class VLLMServerConfig(_Section):
    """Where the `vllm` rollout engine's server runs (`paravt_core/agent/vllm_engine.py`).

    `url` set: every rank sends its rollouts to that running server, which must have been
    started with the engine's flags (`vllm_engine.ROLLOUT_ARGS`, `ROLLOUT_ENV`); rank 0 loads
    the new weights into it after each step. `url` unset: rank 0 launches one from the
    serve venv (`python`, else as `paravt eval serve` finds it; `make install-serve`) and
    stops it at the end. On CPU this is vLLM's CPU build: float32, eager.

    `placement` (issue #44 item 2), as for SGLang but with no memory released between phases:
    - `colocated`: the server runs where rank 0 runs, seeing rank 0's devices (the CPU build;
      on GPUs it takes `gpu_memory_utilization` of rank 0's card beside that rank's trainer).
    - `split`: the server has GPUs of its own (`gpus`, CUDA device indices, given to it as
      CUDA_VISIBLE_DEVICES) and the trainers the rest. The DeepSpeed launcher gives ranks
      0..N-1 GPUs 0..N-1 (`--num_gpus N`), so the server's GPUs lie at N and above. The 8B
      plan (`conf/pipeline/paravt_8b.yaml`) trains 7 ranks on GPUs 0-6 and serves on GPU 7.
    `tp_size` GPUs serve one model (vLLM's tensor parallelism): a split server's `gpus` are
    exactly that many. `gpu_memory_utilization` is the share of each of its cards vLLM may
    take for weights, activations and KV cache (None: vLLM's own, 0.92: `plan.VLLM_FRACTION`).
    """

    url: str | None = Field(None, pattern=r"^https?://")
    python: str | None = None
    max_model_len: int | None = Field(None, ge=256)
    startup_timeout_s: float = Field(900.0, gt=0)
    request_timeout_s: float = Field(3600.0, gt=0)
    placement: Literal["colocated", "split"] = "colocated"
    gpus: tuple[Annotated[int, Field(ge=0)], ...] = ()
    tp_size: int = Field(1, ge=1)
    gpu_memory_utilization: float | None = Field(None, gt=0, lt=1)

    @model_validator(mode="after")
    def _placement_fits(self) -> VLLMServerConfig:
        if self.placement == "colocated" and self.gpus:
            raise ValueError("rl.rollout.vllm.gpus is for placement: split (a colocated server runs on rank 0's "
                             "devices)")
        if self.placement == "split" and self.url is None and not self.gpus:
            raise ValueError("rl.rollout.vllm.placement is split but neither vllm.url (a running server) nor "
                             "vllm.gpus (the CUDA devices to launch it on) is set")
        if len(set(self.gpus)) != len(self.gpus):
            raise ValueError(f"rl.rollout.vllm.gpus {list(self.gpus)} names a GPU twice")
        if self.gpus and len(self.gpus) != self.tp_size:
            raise ValueError(f"rl.rollout.vllm.gpus ({list(self.gpus)}) must be tp_size ({self.tp_size}) GPUs: one "
                             "vLLM server shards the model over exactly its GPUs")
        return self


# The rollout engines (`rollout_engines.py`): each record beside its server section, if it has
# one (`rl.rollout.<name>`, whose `url`, `placement` and `gpus` say where the server runs). Its
# callables are named by module path: they live in the layers above the config.
register_rollout_engine(RolloutEngineSpec(
    "hf", backend="paravt_core.rl.rollout_engine:hf_backend", plan="paravt_core.plan:hf_rollout_plan",
    copy_per_rank=True, overlaps=True))
register_rollout_engine(RolloutEngineSpec(
    "sglang", backend="paravt_core.rl.rollout_engine:sglang_backend", plan="paravt_core.plan:sglang_rollout_plan",
    check="paravt_core.rl.rollout_engine:check_sglang", preflight="paravt_core.preflight:sglang_checks",
    server=True, overlaps=True, releases_colocated=True))
register_rollout_engine(RolloutEngineSpec(
    "vllm", backend="paravt_core.rl.rollout_engine:vllm_backend", plan="paravt_core.plan:vllm_rollout_plan",
    check="paravt_core.rl.rollout_engine:check_vllm", preflight="paravt_core.preflight:vllm_checks", server=True,
    overlaps=True))


class RolloutConfig(_Section):
    """Agentic rollout protocol (SPEC §3)."""

    max_turns: int = Field(3, ge=0)
    max_parallel: int = Field(5, ge=1)
    tool_response_max_tokens: int = Field(512, ge=1)
    think_prefix: bool = True
    max_new_tokens: int = Field(2048, ge=1)
    subagent_max_new_tokens: int = Field(256, ge=1)
    engine: str = "hf"  # a registered rollout engine (`rollout_engines.ROLLOUT_ENGINES`)
    sglang: SGLangServerConfig = SGLangServerConfig()
    vllm: VLLMServerConfig = VLLMServerConfig()

    @field_validator("engine", mode="before")
    @classmethod
    def _registered_engine(cls, value: Any) -> Any:
        if not isinstance(value, str) or value not in ROLLOUT_ENGINES:
            # worded as pydantic words a Literal's refusal, which this field was before the records
            names = [repr(name) for name in ROLLOUT_ENGINES]
            expected = f"{', '.join(names[:-1])} or {names[-1]}" if len(names) > 1 else names[0]
            raise PydanticCustomError("literal_error", "Input should be {expected}", {"expected": expected})
        return value

    def server_section(self) -> ServerSection | None:
        """The configured engine's server settings (`rl.rollout.<engine>`); None for an engine without one."""
        return getattr(self, self.engine) if rollout_engine_spec(self.engine).server else None

    @model_validator(mode="after")
    def _server_only_for_its_engine(self) -> RolloutConfig:
        for name, spec in ROLLOUT_ENGINES.items():
            if spec.server and self.engine != name and getattr(self, name).url is not None:
                raise ValueError(f"rl.rollout.{name}.url is set but rl.rollout.engine is {self.engine}: set engine: "
                                 f"{name} to roll out on that server, or drop the url")
        return self


class GatingConfig(_Section):
    """nFrames gating (SPEC §5)."""

    enabled: bool = True
    choices: tuple[Annotated[int, Field(ge=1)], ...] = (4, 8, 16, 32, 64)
    # A second key for the draws of K besides run.seed (0: the seed alone, as before the knob):
    # the same seed with another draw key trains on other budgets and the same everything else,
    # which measures how much a row moves with the draw alone (#35).
    draw_key: int = Field(0, ge=0)

    @model_validator(mode="after")
    def _nonempty(self) -> GatingConfig:
        if self.enabled and not self.choices:
            raise ValueError("rl.gating.choices must list at least one frame count when gating is enabled")
        return self


class RLConfig(_Section):
    """PARA-GRPO (SPEC §5); the defaults are the full recipe."""

    row: str = "paragrpo"
    max_steps: int = Field(54, ge=1)
    prompts_per_step: int = Field(7, ge=1)
    group_size: int = Field(8, ge=2)
    temperature: float = Field(0.7, gt=0)
    # Which RL rows are trained on, by extra_info.question_type (SPEC §4.2); the default is all
    # of them, as the release does. A miniature world may train on what its evaluation asks.
    question_types: tuple[Literal["mcq", "tvg", "oe"], ...] = Field(("mcq", "tvg", "oe"), min_length=1)
    # The release's advantage pipeline (SPEC §5 steps 1-5), each step a switch; the
    # defaults are the paper's. `paravt_core/rl/grpo.py` documents each step.
    reward_shift: float = 0.2
    reward_scale: float = 10.0
    reward_clip: float | None = Field(20.0, gt=0)  # step 1; None: no clip
    clip_eps: float = Field(0.2, gt=0)
    # step 3: token_reward (release: -kl_coef * k1 per token after the group statistics);
    # sequence_reward (summed k3 subtracted from R before them), loss (k3 in the loss), none.
    kl_mode: Literal["token_reward", "sequence_reward", "loss", "none"] = "token_reward"
    kl_coef: float = Field(0.01, ge=0)
    # The reference's log-prob temperature. The release scores it at 1.0 while the policy's
    # log-probs are at the rollout temperature, so k1 is biased upward (an implicit length
    # penalty); every paper row keeps that. None: the rollout temperature (our fix, its own row).
    # The reference log-probs feed every kl_mode, so the k3 variants see the same temperatures.
    ref_temperature: float | None = Field(1.0, gt=0)
    kl_clamp: float | None = Field(10.0, gt=0)  # step 3: k1 clamped to [-kl_clamp, kl_clamp]; None: no clamp
    adv_eps: float = Field(1e-5, gt=0)  # the eps of steps 2 and 4 (the release's 1e-5)
    batch_norm_advantages: bool = True  # step 4
    # Step 4's mean and std over main-agent tokens only (sub-agent tokens are normalized with
    # them), so episodes with many calls do not set the main agent's statistics; off: all tokens.
    moments_main_agent_only: bool = True
    decoupled_ppo: bool = True  # step 5: ratio to recomputed log-probs, behaviour weight
    behaviour_weight_cap: float = Field(5.0, gt=1)
    learning_rate: float = Field(2e-6, gt=0)
    weight_decay: float = Field(0.01, ge=0)
    grad_clip: float = Field(1.0, gt=0)
    anchoring_mode: Literal["sequence", "token"] = "sequence"
    train_subagents: bool = True
    micro_batch_size: int = Field(4, ge=1)  # trajectories per forward/backward within a step
    # Positions per chunk of the selected-token log-prob computation (model/logprobs.py): the
    # [chunk, vocab] logits are the largest tensor of a log-prob pass, never [B, L, vocab].
    logprob_chunk: int = Field(1024, ge=1)
    # Run each group's shared prompt (system turn, frames, question; a sub-agent's crop) once per
    # micro-batch in the policy and reference passes, its suffixes attending to it
    # (`rl/shared_prefix.py`), and in the `hf` rollouts prefill it once (`agent/hf_build.py`): the
    # per-row path's log-probs, gradients and rollouts up to float rounding.
    shared_prefix: bool = False
    # Recompute the policy's activations in its backward pass: at the 2B shape on one 80 GB GPU
    # the second step's policy pass ran out of memory without it (docs/gpu_check.md). Same loss.
    gradient_checkpointing: bool = False
    zero_stage: int = Field(3, ge=0, le=3)
    num_ranks: int = Field(1, ge=1, le=MAX_WORKERS)
    hostfile: str | None = None
    checkpoint_every: int = Field(10, ge=1)
    # Before step 1 a rollout server's log-probs of a fixed probe must equal the trainer's within
    # this many nats per token (`rl/served_policy.py`); None: 1e-3 in float32 (measured), 0.1 in bf16.
    served_logprob_tolerance: float | None = Field(None, gt=0)
    keep_last: int | None = Field(None, ge=1)  # as sft.keep_last; replay needs the step before a replayed one
    # 1: one-step off-policy (`rl/overlap.py`, issue #65): step n's batch is generated while step n-1
    # trains, by the weights that step started from, and decoupled PPO corrects the one step of
    # staleness; a fixed function of the run's draws, never of timing. 0: the synchronous step.
    # Runs on `hf` (the engine in a process of the rank's own), `vllm` and `sglang` (split
    # placement: the server generates beside the ranks; each reply's weight label is checked
    # against the schedule).
    overlap: int = Field(0, ge=0, le=1)
    # Under `rl.overlap: 1` on the `hf` engine, a rank's torch/OpenMP threads (its OMP_NUM_THREADS:
    # run.fanout.threads_per_run over the ranks, else the host's cores over the ranks) are split
    # between the trainer and its engine process, which run at the same time (`rl/overlap.thread_share`).
    # None: the engine gets half (rounded down), the trainer the rest, each at least 1 (on 2 cores
    # and one rank: one each). Set either to fix it; the other takes what is left (at least 1).
    # On CPU the engine's count changes a rollout's float rounding: the draws log records it and
    # `paravt rl-replay` generates at it. Never in a cache key, as run.fanout's thread budget.
    overlap_trainer_threads: int | None = Field(None, ge=1, le=MAX_WORKERS)
    overlap_engine_threads: int | None = Field(None, ge=1, le=MAX_WORKERS)
    deepspeed: DeepSpeedConfig = DeepSpeedConfig()
    reward: RewardConfig = RewardConfig()
    rollout: RolloutConfig = RolloutConfig()
    gating: GatingConfig = GatingConfig()

    @model_validator(mode="after")
    def _prompts_split_over_ranks(self) -> RLConfig:
        # Each rank rolls out whole groups (GRPO normalizes within a prompt's group), so the
        # step's prompts must divide evenly over the ranks.
        if self.hostfile is None and self.prompts_per_step % self.num_ranks:
            raise ValueError(f"rl.prompts_per_step ({self.prompts_per_step}) must be a multiple of rl.num_ranks "
                             f"({self.num_ranks}): each rank rolls out whole prompt groups")
        return self

    @model_validator(mode="after")
    def _offload_fits_stage(self) -> RLConfig:
        self.deepspeed.check_stage(self.zero_stage, "rl")
        return self

    @model_validator(mode="after")
    def _thread_share_needs_overlap(self) -> RLConfig:
        for name in ("overlap_trainer_threads", "overlap_engine_threads"):
            if getattr(self, name) is not None and not self.overlap:
                raise ValueError(f"rl.{name} splits a rank's threads with its engine process under rl.overlap: 1, "
                                 f"and rl.overlap is 0: set rl.overlap: 1 or leave rl.{name} unset")
        return self

    @model_validator(mode="after")
    def _server_gpus_apart_from_trainers(self) -> RLConfig:
        # The DeepSpeed launcher (`--num_gpus N`, dist.launch.launch_workers) puts rank i on GPU i, so a
        # server launched on one of GPUs 0..N-1 would share a trainer's card unplanned.
        engine = self.rollout.engine
        server = self.rollout.server_section()
        if server is None or server.url is not None or server.placement != "split" or self.hostfile is not None:
            return self
        shared = sorted(set(server.gpus) & set(range(self.num_ranks)))
        if shared:
            raise ValueError(f"rl.rollout.{engine}.gpus {list(server.gpus)} include GPU(s) {shared}, which the "
                             f"trainers take (rl.num_ranks {self.num_ranks}: ranks on GPUs 0-{self.num_ranks - 1}); "
                             f"put the server on GPU {self.num_ranks} or above, or lower rl.num_ranks")
        return self


# The SPEC §7 benchmark splits, and the miniature's validation split (Video-MME rows on videos of
# its own; data.synth.validation), never in the default split list: `eval/splits.py` records both.
KNOWN_SPLITS = EVAL_SPLITS + VALIDATION_SPLITS


class EvalConfig(_Section):
    """Seven-split evaluation (SPEC §7, release defaults)."""

    splits: tuple[str, ...] = EVAL_SPLITS
    prompt_mode: Literal["direct", "reasoning", "agentic_general", "agentic_minimal"] = "agentic_general"
    grounding_prompt_mode: Literal["direct", "reasoning", "agentic_general", "agentic_minimal"] = "agentic_minimal"
    tool_mode: Literal["frames", "subagent"] = "frames"
    dispatch: Literal["parallel", "sequential"] = "parallel"
    nframes: int = Field(64, ge=1)
    max_new_tokens: int = Field(2048, ge=1)
    max_turns: int = Field(3, ge=0)
    max_parallel: int = Field(5, ge=1)
    engine: Literal["hf", "openai"] = "hf"
    # openai engine: an OpenAI-compatible server (SGLang / vLLM) serving the checkpoint. With
    # no endpoint (nor PARAVT_EVAL_ENDPOINT) the stage starts one per checkpoint and stops it
    # after its splits (`eval/served.py`). The
    # API key is never put in config: PARAVT_EVAL_API_KEY. Env vars PARAVT_EVAL_ENDPOINT /
    # PARAVT_EVAL_MODEL_NAME / PARAVT_EVAL_TIMEOUT_S fill fields left unset. request_timeout_s
    # is per HTTP request; a request with its retries ends by 2 x request_timeout_s plus the
    # backoff delays (62 s), and a second timeout ends it at once (eval/openai_engine.py).
    endpoint: str | None = Field(None, pattern=r"^https?://")
    served_model_name: str | None = None
    request_timeout_s: float | None = Field(None, gt=0)
    # Samples in flight per model replica: a server the stage starts on N `gpus` gets N times this.
    concurrency: int = Field(1, ge=1, le=MAX_WORKERS)
    max_samples_per_split: int | None = Field(None, ge=1)
    # Prefill tokens per `generate` of the `hf` engine where it plays episodes as the evaluation
    # does: the `hf` evaluation, the SFT grammar check and the miniature's probes
    # (`agent.hf_build.prefill_budget`; not RL's rollouts, whose draws depend on the cut). A turn's requests are cut, in
    # order, into sub-batches of at most this many left-padded prompt tokens (a longer prompt
    # goes alone); greedy outputs are the same tokens as one batch's. None: one batch, as before.
    # `paravt plan` shows what a budget holds.
    hf_batch_tokens: int | None = Field(None, ge=1)
    # `paravt eval serve` and the stage's own servers: the interpreter that runs the server (a
    # venv holding vLLM or SGLang; default: $PARAVT_SERVE_PYTHON, then .venv-serve/bin/python
    # from `make install-serve`).
    server_python: str | None = None
    # The stage's own servers (no endpoint): which one (auto: SGLang where installed, else vLLM),
    # the CUDA devices it serves on, one data-parallel replica each (empty: the server's own
    # choice, one replica; on a machine without CUDA, the CPU), and how long it may take to start.
    server: Literal["auto", "sglang", "vllm"] = "auto"
    gpus: tuple[Annotated[int, Field(ge=0)], ...] = ()
    server_startup_timeout_s: float = Field(900.0, gt=0)

    @model_validator(mode="after")
    def _known_splits(self) -> EvalConfig:
        # An empty list passed here and failed only after SFT had trained: the data stage prepares
        # eval.splits, and the SFT grammar check takes its held-out prompts from them (issue #48 item 3).
        if not self.splits:
            raise ValueError(f"eval.splits is empty; list at least one of {list(EVAL_SPLITS)} (the SFT grammar "
                             "check and the evaluation run on them)")
        unknown = sorted(set(self.splits) - set(KNOWN_SPLITS))
        if unknown:
            raise ValueError(f"eval.splits has unknown split(s) {unknown}; known: {list(KNOWN_SPLITS)}")
        if len(set(self.gpus)) != len(self.gpus):
            raise ValueError(f"eval.gpus lists a GPU twice ({list(self.gpus)}); list each CUDA device once")
        return self


class ProbeConfig(_Section):
    """The held-out sampled probe that the reproduction's κ and format verdicts compare (#46
    item 4, `miniature/heldout_probe.py`): the first `questions` questions of `split`, each put
    to every model (the SFT model, before RL, and each RL run, after) `samples` times at ONE
    overview budget K (`frames`; None: the largest `rl.gating.choices`, where the paper's
    collapse shows), sampled at `temperature` with the sampler seeded by `seed`. The same
    questions, K, seed and temperature for every model, so rows compare question by question."""

    enabled: bool = True
    split: Literal["videomme", "videomme_val"] = "videomme"
    questions: int = Field(32, ge=1)
    samples: int = Field(4, ge=1)
    frames: int | None = Field(None, ge=1)
    temperature: float = Field(0.7, gt=0)
    seed: Seed = 0


class ReproduceConfig(_Section):
    """The miniature reproduction (`paravt reproduce`, #15): which RL rows of SPEC §6
    (`conf/rl/<row>.yaml`), each trained from the one SFT model once per seed (`run.seed`),
    and the held-out probe every model gets (`probe`)."""

    rows: tuple[Annotated[str, Field(pattern=r"^[A-Za-z0-9_]+$")], ...] = ("vanilla_grpo", "paragrpo")
    seeds: tuple[Seed, ...] = (0, 1, 2)
    probe: ProbeConfig = ProbeConfig()
    # Whether each RL run is also evaluated on the validation split (with tools), beside the SFT
    # model, which always is where the world draws one. Off: a run that chooses nothing skips it.
    rl_validation: bool = True
    # Variants of every row, one switch at a time (the replay of #62: `make replay-falls`): a name ->
    # `rl.<key>=<value>` overrides laid over the row file. Each row x variant x seed is one run,
    # labelled `<row>.<variant>` and trained under that `rl.row`, so each has a run folder and cache
    # key of its own and a variant with no overrides trains the row again as it is. Empty: each
    # row as its file says. Stages before RL read no `rl` knob a variant may set, so they stay cached.
    variants: dict[Annotated[str, Field(pattern=r"^[A-Za-z0-9_]+$")], tuple[str, ...]] = {}
    # The report's folder under run.output_dir: a profile of variants writes its own beside the default's.
    report_dir: str = Field("report", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    # SFT builds (#62 item 4): empty, the one SFT model `run.seed` gives (labels and cache keys as
    # before). Otherwise one SFT model per seed here (`sft.seed`, from the one base and pretraining),
    # each measured, and every row x variant x seed trained from each: the report's verdicts take
    # the build as a level. The budget sweep measures the first build only.
    sft_seeds: tuple[Seed, ...] = ()
    # The SFT model's budget sweep (on the first build, `flows/reproduce.py`). Off: a later part of a
    # profile run in parts (docs/miniature.md, "In parts"), whose merge takes the sweep of the part
    # with the lowest first build; the first part sweeps.
    budget_sweep: bool = True

    @model_validator(mode="after")
    def _distinct(self) -> ReproduceConfig:
        if not self.rows or len(set(self.rows)) != len(self.rows):
            raise ValueError(f"reproduce.rows must name distinct RL rows, got {list(self.rows)}")
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"reproduce.seeds must be distinct, got {list(self.seeds)}")
        if len(set(self.sft_seeds)) != len(self.sft_seeds):
            raise ValueError(f"reproduce.sft_seeds must be distinct, got {list(self.sft_seeds)}")
        for name, sets in self.variants.items():
            for item in sets:
                key, sep, _ = item.partition("=")
                if not sep or not key.startswith("rl.") or key == "rl.row":
                    raise ValueError(f"reproduce.variants.{name}: {item!r} is not an rl.<key>=<value> override "
                                     "(a variant sets RL knobs only; rl.row is its own label)")
        return self


class MLflowConfig(_Section):
    tracking_uri: str | None = None  # None: sqlite database inside run.output_dir
    experiment: str = "paravt"
    # false: training stages open no MLflow run (their per-step metrics stay in the run folder's
    # jsonl); for a machine without mlflow, e.g. the GPU image of ../shared/GPU.md.
    enabled: bool = True


class PipelineConfig(_Section):
    run: RunConfig = RunConfig()
    model: ModelConfig = ModelConfig()
    video: VideoConfig = VideoConfig()
    data: DataConfig = DataConfig()
    sft: SFTConfig = SFTConfig()
    rl: RLConfig = RLConfig()
    eval: EvalConfig = EvalConfig()
    mlflow: MLflowConfig = MLflowConfig()
    reproduce: ReproduceConfig = ReproduceConfig()

    @model_validator(mode="after")
    def _validation_split_is_drawn(self) -> PipelineConfig:
        asked = sorted(set(self.eval.splits) & set(VALIDATION_SPLITS))
        if asked and not (self.data.source == "synth" and self.data.synth.validation):
            raise ValueError(f"eval.splits asks for {asked}, which only a generated world with data.synth.validation: "
                             "true draws; set it (data.source: synth) or drop the split")
        return self

    @model_validator(mode="after")
    def _host_pixels_match_the_model(self) -> PipelineConfig:
        # Exact only where the model casts them to bf16 itself (sft/encode.py, model_batch).
        if self.sft.host_pixel_dtype == "bfloat16" and self.model.dtype != "bfloat16":
            raise ValueError("sft.host_pixel_dtype: bfloat16 would round the pixel values a float32 model reads; "
                             "set model.dtype: bfloat16 or sft.host_pixel_dtype: float32")
        return self

    @model_validator(mode="after")
    def _shared_prefix_has_a_mask(self) -> PipelineConfig:
        # The packed rows attend under an explicit mask (rl/shared_prefix.py); flash attention takes none.
        if self.rl.shared_prefix and self.model.attn_implementation not in SHARED_PREFIX_ATTENTION:
            raise ValueError(f"rl.shared_prefix packs a group's trajectories under an explicit attention mask, which "
                             f"model.attn_implementation={self.model.attn_implementation} does not take: set "
                             f"model.attn_implementation to one of {SHARED_PREFIX_ATTENTION} or "
                             "rl.shared_prefix: false")
        return self

    @model_validator(mode="after")
    def _overlap_runs_here(self) -> PipelineConfig:
        # The schedule needs an engine that generates beside the trainer (its record's `overlaps`) and
        # the loss that corrects a stale batch (SPEC §5 step 5, `rl/overlap.py`).
        rl = self.rl
        if not rl.overlap:
            return self
        if not rollout_engine_spec(rl.rollout.engine).overlaps:
            able = [name for name, spec in ROLLOUT_ENGINES.items() if spec.overlaps]
            raise ValueError(f"rl.overlap: 1 does not run on rl.rollout.engine={rl.rollout.engine} yet: set "
                             f"rl.rollout.engine to one of {able} or rl.overlap: 0")
        if not rl.decoupled_ppo:
            raise ValueError("rl.overlap: 1 trains on batches generated one step behind the trainer, which the "
                             "decoupled PPO loss corrects: set rl.decoupled_ppo: true or rl.overlap: 0")
        engine = rl.rollout.engine
        if (rollout_engine_spec(engine).releases_colocated
                and getattr(rl.rollout, engine).placement == "colocated"):
            raise ValueError(f"rl.overlap: 1 generates while the ranks train, and a colocated {engine} server gives "
                             f"its GPU memory to the training passes between rollouts: set rl.rollout.{engine}."
                             "placement: split (the server on GPUs of its own) or rl.overlap: 0")
        return self

    @model_validator(mode="after")
    def _text_only_rows_fit_zero3(self) -> PipelineConfig:
        # Measured: the reading phase at 2 CPU ranks under ZeRO-3 stalled before its first step
        # (a text-only micro-batch skips the vision tower whose weights the other ranks gather).
        # The reading phase runs on model.pretrain.num_ranks (`pretrain.training_config`), the SFT
        # that replays its rows on sft.num_ranks; both take sft.zero_stage.
        pre = self.model.pretrain
        if not pre.enabled or self.sft.zero_stage != 3:
            return self
        for rows, ranks, knob in ((pre.reading_rows, pre.num_ranks, "model.pretrain.num_ranks"),
                                  (pre.sft_replay_rows, self.sft.num_ranks, "sft.num_ranks")):
            if rows and ranks > 1:
                raise ValueError(f"model.pretrain.reading_rows / sft_replay_rows train on text-only rows, which hang "
                                 f"{knob}={ranks} under sft.zero_stage=3 (a text-only micro-batch skips the vision "
                                 f"tower the other ranks gather): set {knob}: 1 or sft.zero_stage 0 or 2")
        return self

    @model_validator(mode="after")
    def _transcripts_open_as_the_teacher(self) -> PipelineConfig:
        # The reading phase's agent transcripts (`miniature.pretrain.transcript_row`) are written
        # with the shared crop plans; mixing them with own_token SFT rows would teach both openings.
        if self.model.pretrain.reading_transcripts and self.data.synth.crop_opening != "shared":
            raise ValueError(f"data.synth.crop_opening: {self.data.synth.crop_opening} is not written into the "
                             "reading phase's agent transcripts (model.pretrain.reading_transcripts): set "
                             "reading_transcripts: 0 or crop_opening: shared")
        budgets = self.data.synth.teacher_budgets
        if budgets and max(budgets) > self.video.sft_max_frames:
            raise ValueError(f"data.synth.teacher_budgets {list(budgets)} go past video.sft_max_frames "
                             f"({self.video.sft_max_frames}): SFT would show fewer frames than the teacher read")
        rows = self.model.pretrain.overview_rows
        overview = budgets or self.video.sft_frame_choices or (self.video.sft_max_frames,)
        if rows > len(set(overview)):
            raise ValueError(f"model.pretrain.overview_rows {rows}: a pretraining video's overview rows take distinct "
                             f"budgets, and there are {len(set(overview))} ({sorted(set(overview))}, from "
                             "data.synth.teacher_budgets, else video.sft_frame_choices): lower it")
        if budgets and self.model.pretrain.reading_transcripts:
            raise ValueError("data.synth.teacher_budgets is not written into the reading phase's agent transcripts "
                             "(model.pretrain.reading_transcripts): set reading_transcripts: 0")
        return self

    def section_hash(self, *names: str) -> str:
        """Stable hash of some sections (all when none given): a cache key for stages. Which knobs
        it hashes, which only when set and which never: `paravt_core.cache_identity`."""
        return cache_identity.section_hash(self, *names)

    def mlflow_uri(self) -> str:
        if self.mlflow.tracking_uri:
            return self.mlflow.tracking_uri
        return f"sqlite:///{(self.run.output_dir / 'mlflow.db').resolve()}"


class ConfigError(ValueError):
    """A config file that does not load; the message names the file and the bad keys."""


# The shipped configs are under 6 KB; a file this large is not a config, and parsing 50 MB of
# YAML took a minute and 1.8 GB before pydantic refused it (issue #48 item 9).
MAX_CONFIG_BYTES = 1 << 20


def _set_dotted(tree: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    node = tree
    for key in parents:
        node = node.setdefault(key, {})
        if not isinstance(node, dict):
            raise ConfigError(f"override {dotted!r}: {key!r} is not a section")
    node[leaf] = value


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """`["sft.max_steps=10", "run.name=x"]` -> nested dict; values parsed as YAML scalars."""
    tree: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"override {item!r} is not of the form section.key=value")
        try:
            value = yaml.safe_load(raw)
        except yaml.YAMLError as err:
            raise ConfigError(f"override {item!r}: the value is not valid YAML ({_yaml_problem(err)}); "
                              "quote it (--set 'k=\"text\"') or fix the brackets") from None
        _set_dotted(tree, key.strip(), value)
    return tree


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _yaml_problem(err: yaml.YAMLError) -> str:
    """The parser's complaint on one line, with the line/column where it has one."""
    mark = getattr(err, "problem_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    return where + (getattr(err, "problem", None) or str(err).splitlines()[0])


class _StrictLoader(yaml.SafeLoader):
    """YAML's safe loader, except that a key given twice in one mapping is an error.

    Plain YAML keeps the last value: a second `sft:` section appended to a config would
    silently replace the whole first one, resetting every knob it does not repeat.
    """

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, yaml.Node] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                first = seen[key].start_mark.line + 1
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (first given on line {first}); merge the two into one",
                    key_node.start_mark)
            seen[key] = key_node
        return super().construct_mapping(node, deep=deep)


# The project root: the shipped configs (`conf/`) are named relative to it.
PROJECT_ROOT = Path(__file__).resolve().parents[1]


def config_file(path: str | Path) -> Path:
    """`path` as given when it exists (or is absolute); else, for a relative path, the same path
    under the project root when it exists there, so the shipped `conf/...` names (the commands'
    defaults, the flows' parameters) work from any working directory."""
    path = Path(path)
    if path.is_absolute() or path.exists():
        return path
    in_project = PROJECT_ROOT / path
    return in_project if in_project.exists() else path


def read_yaml_mapping(path: Path, what: str) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(f"{what} file {path} does not exist in {Path.cwd()} nor in the project {PROJECT_ROOT} "
                          "(see conf/ for the shipped ones)")
    try:
        with path.open("rb") as file:
            data = file.read(MAX_CONFIG_BYTES + 1)  # never more, however large the file is
    except OSError as err:
        raise ConfigError(f"{path}: cannot be read ({err.strerror})") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: {path.stat().st_size:,} bytes, too large for a {what} file (at most "
                          f"{MAX_CONFIG_BYTES:,} bytes; the shipped ones are a few KB); point at a {what} YAML")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(f"{path}: not UTF-8 text (byte {err.start} is {err.object[err.start]:#04x}); "
                          "save the file as UTF-8") from None
    try:
        raw = yaml.load(text, Loader=_StrictLoader) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML ({_yaml_problem(err)}); fix the file") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a mapping")
    return raw


def rl_row_path(config_path: str | Path, name: str) -> Path:
    """The RL row `name`: `rl/<name>.yaml` beside the pipeline config's folder
    (`conf/rl/paragrpo.yaml` for `conf/pipeline/reproduce.yaml`), as `reproduce.rows` names rows."""
    return config_file(config_path).resolve().parents[1] / "rl" / f"{name}.yaml"


def rl_row_file(config_path: str | Path, row: str | Path) -> Path:
    """An RL row as a command was given it: a YAML file, or a row's name (`paragrpo`: no folder,
    no suffix, and no such file; `rl_row_path`)."""
    given = Path(row)
    if given.name == str(row) and not given.suffix and not config_file(given).is_file():
        return rl_row_path(config_path, str(row))
    return given


def load_rl_row(path: str | Path) -> dict[str, Any]:
    """An RL ablation row (`conf/rl/*.yaml`): a partial `rl` section, validated on its own."""
    path = config_file(path)
    raw = read_yaml_mapping(path, "RL row")
    try:
        RLConfig.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(f"{path}: {_problems(err, 'rl.')}") from None
    return raw


def _problems(err: ValidationError, prefix: str = "") -> str:
    """Pydantic's errors on one line, each with its dotted key (without its "Value error, " lead)."""
    return "; ".join(f"{prefix}{'.'.join(str(p) for p in e['loc'])}: {e['msg'].removeprefix('Value error, ')}"
                     for e in err.errors())


def load_config(path: str | Path, overrides: list[str] | None = None,
                rl_row: str | Path | None = None) -> PipelineConfig:
    """Read a pipeline YAML, lay an RL row (a file or a row's name, `rl_row_file`) over its `rl`
    section, apply `key=value` overrides, validate."""
    path = config_file(path)
    raw = read_yaml_mapping(path, "config")
    if rl_row is not None:
        raw = _merge(raw, {"rl": load_rl_row(rl_row_file(path, rl_row))})
    raw = _merge(raw, parse_overrides(overrides or []))
    try:
        cfg = PipelineConfig.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(f"{path}: {_problems(err)}") from None
    problems = [f"{key} {folder}: {why}" for key, folder in _output_folders(cfg) if (why := folder_problem(folder))]
    if problems:
        raise ConfigError(f"{path}: " + "; ".join(problems) + "; choose a folder that can be created")
    return cfg


def _output_folders(cfg: PipelineConfig) -> list[tuple[str, Path]]:
    """The folders a run creates, by config key (everything else it writes lies under run.output_dir)."""
    folders = [("run.output_dir", cfg.run.output_dir)]
    if cfg.data.hub_cache_dir is not None:
        folders.append(("data.hub_cache_dir", cfg.data.hub_cache_dir))
    return folders
