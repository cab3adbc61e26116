"""Cold-start SFT on DeepSpeed: label masking, 2-rank ZeRO-3 on CPU, kill-and-resume, export."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from paravt_core.config import load_config
from paravt_core.refs import ArtifactRef, content_hash
from paravt_core.sft.encode import IGNORE_INDEX, encode_conversation

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]

TOOL_TURN = (
    "<think>The overview does not show the event; I will look at two windows.</think>"
    '<tool_call>{"name": "crop_video", "arguments": {"video_path": "clip.mp4", "start_time": 2, "end_time": 6}}</tool_call>'
    '<tool_call>{"name": "crop_video", "arguments": {"video_path": "clip.mp4", "start_time": 6, "end_time": 10}}</tool_call>'
)
FINAL_TURN = "<think>The first window shows a red square.</think><answer>A</answer>"


def conversation(video: Path) -> list[dict]:
    return [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": [
            {"type": "video_url", "url": f"file://{video}"},
            {"type": "text", "text": "What colour was the square? A. red B. blue C. green D. white"},
        ]},
        {"role": "assistant", "content": TOOL_TURN},
        {"role": "tool", "content": "From 00:02.0 to 00:04.0 a red square appears in the centre."},
        {"role": "tool", "content": "Nothing notable happens in this window."},
        {"role": "assistant", "content": FINAL_TURN},
    ]


def _frames_of(cache_root: Path):
    from paravt_core.sft.dataset import FrameCache, FrameSampling

    return FrameCache(cache_root, FrameSampling(fps=1.0, max_frames=4, min_pixels=784, max_pixels=6144))


def test_labels_cover_only_assistant_tokens(tiny_processor, short_video: Path, tmp_path: Path):
    sample = encode_conversation(conversation(short_video), tiny_processor, _frames_of(tmp_path).load, None)
    tok = tiny_processor.tokenizer
    trained = sample.input_ids[sample.labels != IGNORE_INDEX]
    assert tok.decode(trained) == TOOL_TURN + "<|im_end|>" + FINAL_TURN + "<|im_end|>"
    # Everything else - system, user question, video tokens, tool responses - is masked.
    masked_text = tok.decode(sample.input_ids[sample.labels == IGNORE_INDEX])
    assert "<tool_response>" in masked_text and "What colour" in masked_text
    assert int((sample.mm_token_type_ids != 0).sum()) > 0
    # SPEC §1: the video's frames are timestamped image items (12 s at 1 fps, at most 4 frames)
    assert sample.pixel_values_videos is None and sample.image_grid_thw.shape[0] == 4
    assert masked_text.count(" seconds><|vision_start|>") == 4
    assert not bool(((sample.mm_token_type_ids != 0) & (sample.labels != IGNORE_INDEX)).any())


def test_frame_cache_hits_on_second_read(short_video: Path, tmp_path: Path):
    cache = _frames_of(tmp_path)
    frames1, meta1 = cache.load(short_video)
    frames2, meta2 = cache.load(short_video)
    assert (cache.misses, cache.hits) == (1, 1)
    assert (frames1 == frames2).all() and meta1.frames_indices == meta2.frames_indices
    assert frames1.shape[0] == 4 and frames1.shape[1] % 32 == 0 and frames1.shape[2] % 32 == 0


@pytest.fixture()
def sft_setup(tmp_path: Path, tiny_model_dir: Path, short_video: Path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = tmp_path / "sft"
    data.mkdir()
    rows = [{"messages": json.dumps(conversation(short_video)), "videos": [str(short_video)]}] * 6
    pq.write_table(pa.Table.from_pylist(rows), data / "toy.parquet")
    base = ArtifactRef(kind="base_model", path=tiny_model_dir, sha256=content_hash(tiny_model_dir))
    sft_data = ArtifactRef(kind="sft_data", path=data, sha256=content_hash(data))

    def config(*overrides: str):
        return load_config(REPO / "conf/pipeline/tiny.yaml", [
            f"run.output_dir={tmp_path / 'out'}", "sft.learning_rate=0.002", "sft.warmup_ratio=0.0",
            "video.sft_max_frames=4", "video.max_pixels=6144", *overrides,
        ])

    return config, base, sft_data


def _losses(run_dir: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (run_dir / "losses.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows}


def _rows_with_a_broken_video(tmp_path: Path, video: Path, bad_row: int) -> tuple[ArtifactRef, Path]:
    """Six SFT rows on `video`, row `bad_row`'s video a zero-byte file; (the data, that file)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    broken = tmp_path / "broken.mp4"
    broken.write_bytes(b"")
    data = tmp_path / "sft_with_broken"
    data.mkdir()
    rows = [{"messages": json.dumps(conversation(v)), "videos": [str(v)]}
            for v in (broken if i == bad_row else video for i in range(6))]
    pq.write_table(pa.Table.from_pylist(rows), data / "toy.parquet")
    return ArtifactRef(kind="sft_data", path=data, sha256=content_hash(data)), broken


def test_two_rank_zero3_trains_and_exports(sft_setup, tiny_processor, short_video: Path, tmp_path: Path):
    from paravt_core.model.loading import load_model
    from paravt_core.sft import stage

    config, base, sft_data = sft_setup
    # keep_last=1: rank 0 prunes step 2 once both ranks wrote step 4; the export reads step 4's shards.
    cfg = config("sft.max_steps=4", "sft.num_ranks=2", "sft.zero_stage=3", "sft.checkpoint_every=2", "sft.keep_last=1")
    ref = stage.run(cfg, base, sft_data, log_line=lambda line: None)
    losses = _losses(stage.run_dir(cfg, base, sft_data))
    assert sorted(losses) == [1, 2, 3, 4]
    checkpoints = stage.run_dir(cfg, base, sft_data) / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir() if p.is_dir()) == ["step0000004"]
    assert len(list((checkpoints / "step0000004").glob("*optim_states.pt"))) == 2  # one shard per rank
    for rank in (0, 1):
        memory = {row["when"]: row for row in
                  json.loads((stage.run_dir(cfg, base, sft_data) / "memory" / f"rank{rank}.json").read_text())}
        built = memory["constructed"]
        # Built inside zero.Init: each rank allocated its half of every parameter (plus at most
        # one padding element per tensor), never the whole model.
        assert built["world"] == 2 and built["param_bytes_total"] > 1_000_000
        assert 0.49 * built["param_bytes_total"] <= built["param_bytes_local"] <= 0.51 * built["param_bytes_total"]
        assert set(memory) == {"constructed", "engine", "trained"} and built["peak_host_rss_bytes"] > 0
    assert all(torch.isfinite(torch.tensor(v)) for v in losses.values())
    assert losses[4] < losses[1], f"loss did not fall: {losses}"

    meta = json.loads((ref.path / "paravt_meta.json").read_text())
    assert meta["data_sha256"] == sft_data.sha256 and meta["base_model_sha256"] == base.sha256
    assert meta["resolved_config"]["sft"]["zero_stage"] == 3 and meta["git_revision"]
    bounds = {"shortest_edge": cfg.video.min_pixels, "longest_edge": cfg.video.max_pixels}
    assert json.loads((ref.path / "processor_config.json").read_text())["image_processor"]["size"] == bounds  # #44
    trained, original = load_model(ref.path), load_model(base.path)
    changed = [n for (n, p), (_, q) in zip(trained.named_parameters(), original.named_parameters()) if not torch.equal(p, q)]
    assert len(changed) > 0.9 * len(list(original.parameters()))
    from paravt_core.sft.encode import split_media, with_media

    rendered, media = split_media(conversation(short_video)[:2])
    rendered, images = with_media(rendered, media, _frames_of(tmp_path).load, None)
    prompt = tiny_processor.apply_chat_template(rendered, tokenize=False, add_generation_prompt=True)
    inputs = tiny_processor(text=[prompt], images=images, return_tensors="pt")
    out = trained.generate(**inputs, max_new_tokens=5, do_sample=False)
    assert out.shape[1] > inputs["input_ids"].shape[1]
    # Finished runs are not trained again.
    assert stage.run(cfg, base, sft_data, log_line=lambda line: None) == ref


def test_a_finished_run_whose_export_lost_its_weights_exports_them_again(sft_setup):
    """Issue #33 item 2: the finished run's folder lost model.safetensors; the stage writes the
    same weights again from its final checkpoint instead of returning the broken folder."""
    from paravt_core.model.integrity import MANIFEST, verify_model_dir
    from paravt_core.sft import stage

    config, base, sft_data = sft_setup
    cfg = config("sft.max_steps=2", "sft.checkpoint_every=2", "run.name=mend")
    ref = stage.run(cfg, base, sft_data, log_line=lambda line: None)
    recorded = json.loads((ref.path / MANIFEST).read_text())
    (ref.path / "model.safetensors").unlink()
    lines: list[str] = []
    again = stage.run(cfg, base, sft_data, log_line=lines.append)
    assert any(line.startswith("warning: ") and "exporting it again" in line for line in lines)
    verify_model_dir(again.path)
    assert json.loads((again.path / MANIFEST).read_text()) == recorded  # the very same weights
    assert again.sha256 == ref.sha256
    assert sorted(_losses(stage.run_dir(cfg, base, sft_data))) == [1, 2]  # no step ran twice


def test_kill_then_resume_matches_uninterrupted(sft_setup, monkeypatch):
    from paravt_core.sft import stage

    config, base, sft_data = sft_setup
    straight = config("sft.max_steps=5", "sft.checkpoint_every=2", "run.name=straight")
    stage.run(straight, base, sft_data, log_line=lambda line: None)
    expected = _losses(stage.run_dir(straight, base, sft_data))

    killed = config("sft.max_steps=5", "sft.checkpoint_every=2", "run.name=killed")
    monkeypatch.setenv("PARAVT_TEST_KILL_AT_STEP", "3")
    with pytest.raises(RuntimeError, match="exited with code"):
        stage.run(killed, base, sft_data, log_line=lambda line: None)
    run_dir = stage.run_dir(killed, base, sft_data)
    assert not (run_dir / "model").exists()
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == "step0000002"
    monkeypatch.delenv("PARAVT_TEST_KILL_AT_STEP")
    logged = [json.loads(line)["step"] for line in (run_dir / "losses.jsonl").read_text().splitlines()]
    assert logged == [1, 2, 3]  # step 3 ran and was logged before the kill
    stage.run(killed, base, sft_data, log_line=lambda line: None)
    resumed = _losses(run_dir)
    assert sorted(resumed) == [1, 2, 3, 4, 5]
    # Issue #33 item 7: each step once, though step 3 ran twice (the checkpoint was step 2).
    logged = [json.loads(line)["step"] for line in (run_dir / "losses.jsonl").read_text().splitlines()]
    assert logged == [1, 2, 3, 4, 5]
    for step in expected:
        assert resumed[step] == pytest.approx(expected[step], rel=1e-6, abs=1e-7), step


def test_a_deleted_latest_resumes_the_newest_step_and_keeps_what_was_written(sft_setup, monkeypatch):
    """#61 item 4: with `checkpoints/latest` deleted, SFT restarted from step 0, truncating
    losses.jsonl and overwriting the saved tags. Now it resumes from the newest finished step
    with a warning: the rows and tags written before stay as they were."""
    from paravt_core.sft import stage

    config, base, sft_data = sft_setup
    cfg = config("sft.max_steps=6", "sft.checkpoint_every=2", "run.name=no-latest")
    monkeypatch.setenv("PARAVT_TEST_KILL_AT_STEP", "5")
    with pytest.raises(RuntimeError, match="exited with code"):
        stage.run(cfg, base, sft_data, log_line=lambda line: None)
    monkeypatch.delenv("PARAVT_TEST_KILL_AT_STEP")
    run_dir = stage.run_dir(cfg, base, sft_data)
    checkpoints = run_dir / "checkpoints"
    (checkpoints / "latest").unlink()
    before = (run_dir / "losses.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in before] == [1, 2, 3, 4, 5]
    saved = {p: p.stat().st_mtime_ns for p in checkpoints.glob("step*/*") if p.is_file()}
    lines: list[str] = []
    stage.run(cfg, base, sft_data, log_line=lines.append)
    assert any("warning: resuming from" in line and "step0000004" in line and "latest (missing)" in line
               for line in lines), [line for line in lines if "warning" in line or "resum" in line]
    after = (run_dir / "losses.jsonl").read_text().splitlines()
    assert after[:4] == before[:4]  # steps 1-4 (up to the checkpoint) kept, not run again
    assert [json.loads(line)["step"] for line in after] == [1, 2, 3, 4, 5, 6]
    assert {p: p.stat().st_mtime_ns for p in saved} == saved  # step 2's and step 4's files not rewritten


def test_pruned_checkpoints_resume_exactly_in_the_same_run_folder(sft_setup, monkeypatch):
    """Issue #44 item 9: with sft.keep_last only the newest checkpoints stay, a killed run
    resumes from them to the same losses as an uninterrupted run that kept every one, and
    keep_last is not part of the run's identity (the same folder is resumed)."""
    from paravt_core.sft import stage

    config, base, sft_data = sft_setup
    straight = config("sft.max_steps=5", "sft.checkpoint_every=1", "run.name=straight")
    stage.run(straight, base, sft_data, log_line=lambda line: None)
    expected = _losses(stage.run_dir(straight, base, sft_data))

    pruned = config("sft.max_steps=5", "sft.checkpoint_every=1", "run.name=pruned", "sft.keep_last=1")
    run_dir = stage.run_dir(pruned, base, sft_data)
    assert run_dir == stage.run_dir(config("sft.max_steps=5", "sft.checkpoint_every=1", "run.name=pruned"), base,
                                    sft_data)
    monkeypatch.setenv("PARAVT_TEST_KILL_AT_STEP", "4")
    with pytest.raises(RuntimeError, match="exited with code"):
        stage.run(pruned, base, sft_data, log_line=lambda line: None)
    checkpoints = run_dir / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir() if p.is_dir()) == ["step0000004"]
    monkeypatch.delenv("PARAVT_TEST_KILL_AT_STEP")
    stage.run(pruned, base, sft_data, log_line=lambda line: None)
    assert sorted(p.name for p in checkpoints.iterdir() if p.is_dir()) == ["step0000005"]
    resumed = _losses(run_dir)
    assert sorted(resumed) == [1, 2, 3, 4, 5]
    for step in expected:
        assert resumed[step] == pytest.approx(expected[step], rel=1e-6, abs=1e-7), step


@pytest.mark.gpu
@pytest.mark.parametrize("zero_stage", [0, 2, 3])
def test_bf16_sft_on_one_gpu_resumes_after_a_kill(sft_setup, monkeypatch, zero_stage: int):
    from paravt_core.sft import stage

    config, base, sft_data = sft_setup
    cfg = config("model.dtype=bfloat16", f"sft.zero_stage={zero_stage}", "sft.max_steps=6", "sft.checkpoint_every=2",
                 f"run.name=gpu-zero{zero_stage}", "mlflow.enabled=false")  # the GPU image has no mlflow
    monkeypatch.setenv("PARAVT_TEST_KILL_AT_STEP", "3")
    with pytest.raises(RuntimeError, match="exited with code"):
        stage.run(cfg, base, sft_data, log_line=lambda line: None)
    monkeypatch.delenv("PARAVT_TEST_KILL_AT_STEP")
    ref = stage.run(cfg, base, sft_data, log_line=lambda line: None)
    run_dir = stage.run_dir(cfg, base, sft_data)
    losses = _losses(run_dir)
    assert sorted(losses) == [1, 2, 3, 4, 5, 6] and all(torch.isfinite(torch.tensor(v)) for v in losses.values())
    assert json.loads((ref.path / "config.json").read_text())["dtype"] == "bfloat16"
    memory = json.loads((run_dir / "memory" / "rank0.json").read_text())
    assert all(row["device"].startswith("cuda") and row["peak_device_bytes"] > 0 for row in memory)
    # the export records the card its weights came from (provenance.host_numerics)
    numerics = json.loads((ref.path / "paravt_meta.json").read_text())["numerics"]
    assert numerics["accelerator"].startswith(torch.cuda.get_device_name(0) + f" (CUDA {torch.version.cuda}, ")


@pytest.mark.gpu
def test_one_sft_step_of_the_2b_shape(sft_setup, tmp_path: Path):
    """The project's SFT job on a Qwen3-VL-2B-shaped model (random weights) on one GPU."""
    from paravt_core.model.shapes import build_shaped_model
    from paravt_core.sft import stage

    config, base, sft_data = sft_setup
    model_dir = build_shaped_model("2b", base.path, tmp_path / "2b")
    shaped = ArtifactRef(kind="base_model", path=model_dir, sha256=content_hash(model_dir))
    cfg = config("model.dtype=bfloat16", "sft.zero_stage=2", "sft.max_steps=1", "sft.gradient_checkpointing=true",
                 "sft.learning_rate=2e-5", "run.name=gpu-2b", "mlflow.enabled=false")
    stage.run(cfg, shaped, sft_data, log_line=print)
    run_dir = stage.run_dir(cfg, shaped, sft_data)
    assert torch.isfinite(torch.tensor(_losses(run_dir)[1]))
    row = json.loads((run_dir / "memory" / "rank0.json").read_text())[-1]
    assert row["param_bytes_total"] > 4e9  # 2.13 B bf16 parameters


def test_an_undecodable_video_is_skipped_counted_and_named(sft_setup, tmp_path: Path, short_video: Path):
    """One zero-byte video among the rows: SFT trains on the others and says which row it skipped."""
    from paravt_core.sft import stage

    config, base, _ = sft_setup
    sft_data, broken = _rows_with_a_broken_video(tmp_path, short_video, bad_row=2)
    cfg = config("sft.max_steps=6", "sft.checkpoint_every=6")
    lines: list[str] = []
    ref = stage.run(cfg, base, sft_data, log_line=lines.append)
    assert sorted(_losses(stage.run_dir(cfg, base, sft_data))) == [1, 2, 3, 4, 5, 6]
    meta = json.loads((ref.path / "paravt_meta.json").read_text())
    assert list(meta["media_skipped"]) == ["toy.parquet:2"]
    assert meta["media_skipped"]["toy.parquet:2"].startswith(f"cannot read video {broken}: ")
    assert any(line.startswith("warning: SFT skipped toy.parquet:2: cannot read video") and str(broken) in line
               for line in lines)


@pytest.mark.parametrize("packing", [False, True])
def test_data_workers_train_the_same_samples_and_report_the_same_skips(sft_setup, tmp_path: Path, short_video: Path,
                                                                       packing: bool):
    """sft.data_workers=2 (samples encoded ahead in forked workers) gives the losses of encoding in
    the trainer, and the export still names the undecodable row and counts every frame-cache read."""
    from paravt_core.sft import stage

    config, base, _ = sft_setup
    sft_data, _ = _rows_with_a_broken_video(tmp_path, short_video, bad_row=1)
    shape = ["sft.max_steps=4", "sft.checkpoint_every=4", "sft.micro_batch_size=2", "sft.grad_accum_steps=2",
             f"sft.packing={str(packing).lower()}", "sft.loss_impl=chunked"]
    metas, losses = [], []
    for workers in (0, 2):
        cfg = config(*shape, f"sft.data_workers={workers}", f"run.name=w{workers}")
        ref = stage.run(cfg, base, sft_data, log_line=lambda line: None)
        losses.append(_losses(stage.run_dir(cfg, base, sft_data)))
        metas.append(json.loads((ref.path / "paravt_meta.json").read_text()))
    assert sorted(losses[1]) == [1, 2, 3, 4]
    for step in losses[0]:
        assert losses[1][step] == pytest.approx(losses[0][step], rel=1e-6, abs=1e-7), step
    assert list(metas[1]["media_skipped"]) == list(metas[0]["media_skipped"]) == ["toy.parquet:1"]
    # Every frame read is counted; each worker process tries the undecodable video once before it
    # sets the row aside, so two workers may count one read more than the trainer alone.
    reads = [m["frame_cache"]["hits"] + m["frame_cache"]["misses"] for m in metas]
    assert reads[0] > 0 and 0 <= reads[1] - reads[0] <= 1


def test_subagent_row_trains_on_the_prompt_the_rollout_gives_a_subagent(tiny_processor, short_video: Path,
                                                                          tmp_path: Path):
    """#15: a sub-agent SFT row (a video item with video_start / video_end, then the summary
    request) encodes to exactly the token ids and pixels of the rollout's sub-agent prompt for
    that window (SPEC §3), and only the summary and its <|im_end|> are trained."""
    from contextlib import ExitStack

    from paravt_core.agent.context import ChatRenderer
    from paravt_core.agent.dispatch import CropJob, CropRunner
    from paravt_core.agent.prompts import question_prompt, subagent_instruction
    from paravt_core.agent.rollout import prepare_prompt
    from paravt_core.config import VideoConfig
    from paravt_core.sft.dataset import FrameCache, FrameSampling

    video_cfg = VideoConfig(nframes=4, max_pixels=6144, crop_max_frames=3)
    sampling = FrameSampling(fps=1.0, max_frames=4, min_pixels=video_cfg.min_pixels, max_pixels=video_cfg.max_pixels,
                             crop_fps=video_cfg.crop_fps, crop_min_frames=video_cfg.crop_min_frames,
                             crop_max_frames=video_cfg.crop_max_frames)
    summary = "From 00:02.0 to 00:04.0 a red square appears in the centre."
    row = [
        {"role": "user", "content": [
            {"type": "video_url", "video_url": {"url": f"file://{short_video}"}, "video_start": 2.0, "video_end": 7.0},
            {"type": "text", "text": subagent_instruction(2.0, 7.0)},
        ]},
        {"role": "assistant", "content": [{"type": "text", "text": summary}]},
    ]
    sample = encode_conversation(row, tiny_processor, FrameCache(tmp_path, sampling).load, None,
                                 pixel_bounds=(video_cfg.min_pixels, video_cfg.max_pixels))

    renderer = ChatRenderer(tiny_processor, think_prefix=True, pixel_bounds=(video_cfg.min_pixels, video_cfg.max_pixels))
    with ExitStack() as stack:
        prepared = prepare_prompt(0, question_prompt("q", short_video, "What colour?"), renderer, video_cfg, stack)
        request = CropRunner(renderer, video_cfg).subagent_request(CropJob(prepared.source, (2.0, 7.0), None))
    prompt_len = len(request.prompt_ids)
    assert sample.input_ids[:prompt_len].tolist() == list(request.prompt_ids)
    torch.testing.assert_close(sample.pixel_values, request.vision.pixel_values)
    assert sample.image_grid_thw.shape[0] == 3  # crop_max_frames, not the SFT overview's 4
    trained = sample.input_ids[sample.labels != IGNORE_INDEX]
    assert tiny_processor.tokenizer.decode(trained) == summary + "<|im_end|>"
    assert int((sample.labels[:prompt_len] != IGNORE_INDEX).sum()) == 0


@pytest.mark.parametrize("window", [(5.0, 2.0), (-1.0, 3.0), ("a", 3.0)])
def test_a_bad_video_window_names_the_turn(tiny_processor, short_video: Path, tmp_path: Path, window):
    from paravt_core.sft.encode import ConversationError

    start, end = window
    row = [
        {"role": "user", "content": [
            {"type": "video_url", "video_url": {"url": f"file://{short_video}"}, "video_start": start, "video_end": end},
            {"type": "text", "text": "Summarize."},
        ]},
        {"role": "assistant", "content": [{"type": "text", "text": "Nothing."}]},
    ]
    with pytest.raises(ConversationError, match="message 0: video window"):
        encode_conversation(row, tiny_processor, _frames_of(tmp_path).load, None)


def test_perception_check_asks_the_subagent_of_every_window(tiny_model_dir: Path, short_video: Path):
    """#15: the check runs the rollout's sub-agent on each window and scores every summary."""
    from paravt_core.miniature.perception import WindowTruth, perception_report

    cfg = load_config("conf/pipeline/tiny.yaml", ["rl.rollout.subagent_max_new_tokens=8", "video.crop_max_frames=2"])
    truths = [WindowTruth(short_video, (0.0, 4.0), ("red",)), WindowTruth(short_video, (4.0, 8.0), ())]
    report = perception_report(tiny_model_dir, cfg, truths)
    assert report.windows == 2
    assert all(0.0 <= value <= 1.0 for value in report.as_metrics().values())


@pytest.mark.parametrize("damage", ["truncated", "empty", "not_npz"])
def test_a_damaged_frame_cache_entry_is_decoded_again(short_video: Path, tmp_path: Path, damage: str):
    """Issue #33 item 8: a truncated cache .npz raised BadZipFile past SFT's skip logic."""
    cache = _frames_of(tmp_path)
    frames, meta = cache.load(short_video)
    (entry,) = list(tmp_path.rglob("*.npz"))
    data = entry.read_bytes()
    entry.write_bytes({"truncated": data[: len(data) // 2], "empty": b"", "not_npz": b"PK\x03\x04junk"}[damage])
    again, meta_again = _frames_of(tmp_path).load(short_video)
    assert (again == frames).all() and meta_again.frames_indices == meta.frames_indices
    assert entry.read_bytes() == data  # rewritten whole


@pytest.mark.parametrize("grammar_batch", ["null", "1"])
def test_the_grammar_check_sets_aside_a_held_out_video_that_does_not_decode(tiny_model_dir: Path, short_video: Path,
                                                                           tmp_path: Path, grammar_batch: str):
    """Issue #33 item 1: one undecodable held-out video stopped `paravt run` in the sft-grammar task.
    In batches (`sft.grammar_batch`), the failing batch's video is set aside and the check runs again."""
    from paravt_core.eval.samples import EvalSample
    from paravt_core.sft.grammar import grammar_report, held_out_prompts

    broken = tmp_path / "broken.mp4"
    broken.write_bytes(short_video.read_bytes()[:300])
    question = "Question: What colour?\nOptions:\nA. red\nB. blue\nAnswer with the option letter only."
    samples = [EvalSample(id=f"q{i}", split="videomme", video_path=video, question=question, answer="A", kind="mcq",
                          options=("red", "blue")) for i, video in enumerate([short_video, broken, short_video])]
    prompts = held_out_prompts([{"messages": conversation(short_video)}], samples)
    cfg = load_config(REPO / "conf/pipeline/tiny.yaml", [
        f"run.output_dir={tmp_path / 'out'}", "video.nframes=2", "video.max_pixels=3072",
        "rl.rollout.max_new_tokens=8", "rl.rollout.max_turns=1", f"sft.grammar_batch={grammar_batch}"])
    undecodable: set[str] = set()
    report = grammar_report(tiny_model_dir, prompts, cfg, undecodable)
    assert report.episodes == 2 and undecodable == {str(broken)}
    ((sample_id, why),) = report.set_aside
    assert sample_id == "q1" and str(broken) in why
