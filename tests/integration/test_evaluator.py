"""The SPEC §7 evaluator on the tiny Qwen3-VL and a small synthetic world.

Protocol tests (forced answer, frames tool text, sequential dispatch, batching) drive the
evaluator's hf runner with `ScriptedEngine`, a `RolloutEngine` test double answering each
main-agent turn from a script, so the expected texts are known exactly. The resume test
SIGKILLs a real evaluation in a subprocess after it appended K samples and checks that
the re-run finishes only the rest and ends equal to an uninterrupted run. The stage and
flow tests run the real tiny model on every split of the world.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
import torch

from paravt_core.agent.engine import Generation, GenerationRequest, SamplingParams
from paravt_core.config import EVAL_SPLITS, EvalConfig, PipelineConfig, RolloutConfig, VideoConfig, load_config
from paravt_core.eval import stage as eval_stage
from paravt_core.eval.evaluator import EvalSettings, HFSampleRunner, evaluate_split
from paravt_core.eval.prompting import AGENTIC_MINIMAL_SYSTEM, FORCED_GROUNDING, FORCED_MCQ, SEQUENTIAL_INSTRUCTION
from paravt_core.eval.samples import EvalSample
from paravt_core.refs import ArtifactRef, content_hash

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
VIDEO_CFG = VideoConfig(nframes=4, max_pixels=6144)
SUBAGENT_MARK = "concise, factual summary"
SUMMARY = "A red square moves to the right."
ANSWER_B = "The square is blue.\n</think>\n<answer>B</answer>"
WORLD = {"train_videos": 4, "eval_videos_per_split": 1, "eval_rows_per_split": 4, "max_duration_s": 40,
         "no_tool_share": 0.0}


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    """The tiny model gains nothing from a second thread on the shared 2-core machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class ScriptedEngine:
    """RolloutEngine double: main-agent turn k answers script[k], a sub-agent answers SUMMARY."""

    def __init__(self, processor, main_turns: Sequence[str]):
        self.tokenizer = processor.tokenizer
        self.turn_end = self.tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.main_turns = list(main_turns)
        self.calls: list[tuple[list[GenerationRequest], SamplingParams, bool]] = []

    def generate(self, requests: Sequence[GenerationRequest], params: SamplingParams) -> list[Generation]:
        prompts = [self.tokenizer.decode(request.prompt_ids) for request in requests]
        self.calls.append((list(requests), params, SUBAGENT_MARK in prompts[0]))
        return [self._answer(prompt, params) for prompt in prompts]

    def _answer(self, prompt: str, params: SamplingParams) -> Generation:
        if SUBAGENT_MARK in prompt:
            text = SUMMARY
        else:
            turn = prompt.count("<|im_start|>assistant") - 1
            text = self.main_turns[min(turn, len(self.main_turns) - 1)]
        ids = (self.tokenizer(text, add_special_tokens=False)["input_ids"] + [self.turn_end])[: params.max_new_tokens]
        return Generation(ids, [0.0] * len(ids), "stop" if ids[-1] == self.turn_end else "length")

    def update_weights(self, state_dict) -> None:
        raise NotImplementedError("a scripted engine has no weights")

    def main_calls(self) -> list[tuple[list[GenerationRequest], SamplingParams]]:
        return [(requests, params) for requests, params, sub in self.calls if not sub]

    def sub_call_sizes(self) -> list[int]:
        return [len(requests) for requests, _, sub in self.calls if sub]

    def prompt_text(self, request: GenerationRequest) -> str:
        return self.tokenizer.decode(request.prompt_ids)


def calls_turn(*windows: tuple[float, float]) -> str:
    blocks = [f'<tool_call>{{"name": "crop_video", "arguments": {{"video_path": "clip.mp4", "start_time": {s}, '
              f'"end_time": {e}}}}}</tool_call>' for s, e in windows]
    return "I need a closer look.\n</think>\n" + "\n".join(blocks)


def settings(**eval_fields) -> EvalSettings:
    fields = {"nframes": 4, "max_new_tokens": 200, **eval_fields}
    return EvalSettings(EvalConfig(**fields), VIDEO_CFG, RolloutConfig(subagent_max_new_tokens=32))


def mcq_sample(video: Path, sample_id: str = "q1") -> EvalSample:
    question = "Question: What colour is the square?\nOptions:\nA. red\nB. blue\nAnswer with the option letter only."
    return EvalSample(id=sample_id, split="videomme", video_path=video, question=question, answer="B", kind="mcq",
                      options=("red", "blue"))


def grounding_sample(video: Path) -> EvalSample:
    return EvalSample(id="g1", split="charades", video_path=video, question="When does the square turn?",
                      answer=(1.0, 3.0), kind="grounding", gt_start=1.0, gt_end=3.0)


def run_one(runner: HFSampleRunner, sample: EvalSample):
    ((done, outcome),) = list(runner.outcomes([sample]))
    assert done is sample
    return outcome


# --- protocol --------------------------------------------------------------------------------


def test_forced_answer_turn_comes_after_the_last_tool_round(tiny_processor, short_video):
    engine = ScriptedEngine(tiny_processor, [calls_turn((0, 2)), calls_turn((2, 4)), "<answer>B</answer>"])
    runner = HFSampleRunner(engine, tiny_processor, settings(max_turns=2, tool_mode="frames"))
    outcome = run_one(runner, mcq_sample(short_video))

    (_, _), (second, _), (final, _) = engine.main_calls()
    assert [params.max_new_tokens for _, params in engine.main_calls()] == [200, 200, 64]
    assert FORCED_MCQ.text not in engine.prompt_text(second[0])
    assert engine.prompt_text(second[0]).endswith("<|im_start|>assistant\n<think>\n")
    final_text = engine.prompt_text(final[0])
    assert final_text.count(FORCED_MCQ.text) == 1
    after_last_round = final_text.rsplit("</tool_response>", 1)[1]
    assert after_last_round == f"<|im_end|>\n<|im_start|>user\n{FORCED_MCQ.text}<|im_end|>\n<|im_start|>assistant\n"
    assert (outcome.final_text, outcome.tool_calls, outcome.turns, outcome.end_reason) == ("<answer>B</answer>", 2, 3,
                                                                                          "answer")


def test_grounding_forced_answer_asks_for_the_span_with_128_tokens(tiny_processor, short_video):
    answer = "The event happens in the 1.0 - 3.0 seconds."
    engine = ScriptedEngine(tiny_processor, [calls_turn((0, 4)), answer])
    runner = HFSampleRunner(engine, tiny_processor, settings(max_turns=1))
    outcome = run_one(runner, grounding_sample(short_video))
    (_, first_params), (final, final_params) = engine.main_calls()
    assert (first_params.max_new_tokens, final_params.max_new_tokens) == (200, 128)
    text = engine.prompt_text(final[0])
    assert FORCED_GROUNDING.text in text and "The event happens in the X.X - Y.Y seconds." in text
    assert AGENTIC_MINIMAL_SYSTEM in text and "multiple <tool_call> blocks" not in text  # Charades: agentic_minimal
    assert outcome.final_text == answer


def test_no_forced_turn_when_the_agent_answers_before_the_last_round(tiny_processor, short_video):
    engine = ScriptedEngine(tiny_processor, [calls_turn((0, 2)), ANSWER_B])
    outcome = run_one(HFSampleRunner(engine, tiny_processor, settings(max_turns=3)), mcq_sample(short_video))
    assert [params.max_new_tokens for _, params in engine.main_calls()] == [200, 200]
    assert all(FORCED_MCQ.text not in engine.prompt_text(requests[0]) for requests, _ in engine.main_calls())
    assert outcome.end_reason == "answer" and outcome.turns == 2


def test_frames_tool_mode_shows_the_crop_then_its_frame_count_and_window(tiny_processor, short_video):
    engine = ScriptedEngine(tiny_processor, [calls_turn((2, 6), (7, 9)), ANSWER_B])
    run_one(HFSampleRunner(engine, tiny_processor, settings(tool_mode="frames")), mcq_sample(short_video))
    (_, _), (final, _) = engine.main_calls()
    text = engine.prompt_text(final[0])
    responses = re.findall(r"<tool_response>\n(.*?)\n</tool_response>", text, re.DOTALL)
    assert len(responses) == 2
    for response, expected in zip(responses, ["4 frames from 2.0s to 6.0s.", "2 frames from 7.0s to 9.0s."]):
        frames, after = response.rsplit("<|vision_end|>", 1)
        assert frames.startswith("<") and "<|image_pad|>" in frames  # timestamped frames come first
        assert after == expected
        assert frames.count("<|vision_start|>") == int(expected.split()[0])  # one image per frame (SPEC §1)
    overview = engine.prompt_text(final[0]).split("<|im_start|>assistant", 1)[0].count("<|vision_start|>")
    assert final[0].vision.image_grid_thw.shape[0] == overview + 4 + 2  # overview frames + the crops' frames
    assert engine.sub_call_sizes() == []  # no sub-agent in frames mode


@pytest.mark.parametrize(("dispatch", "tool_calls", "sub_calls"), [("sequential", 2, [1, 1]),
                                                                     ("parallel", 3, [2, 1])])
def test_sequential_dispatch_executes_one_call_per_turn(tiny_processor, short_video, tmp_path, dispatch,
                                                         tool_calls, sub_calls):
    engine = ScriptedEngine(tiny_processor, [calls_turn((0, 2), (2, 4)), calls_turn((4, 6)), ANSWER_B])
    runner = HFSampleRunner(engine, tiny_processor, settings(dispatch=dispatch, tool_mode="subagent", max_turns=3))
    run = evaluate_split("videomme", [mcq_sample(short_video)], runner, tmp_path, progress=False)
    (record,) = json.loads(run.results_json.read_text())["samples"]
    assert (record["tool_calls"], record["turns"], record["correct"]) == (tool_calls, 3, True)
    assert record["rejected_calls"] == (1 if dispatch == "sequential" else 0)
    assert engine.sub_call_sizes() == sub_calls
    second_prompt = engine.prompt_text(engine.main_calls()[1][0][0])
    responses = re.findall(r"<tool_response>\n(.*?)\n</tool_response>", second_prompt, re.DOTALL)
    assert responses[0] == SUMMARY
    if dispatch == "sequential":
        assert SEQUENTIAL_INSTRUCTION in second_prompt
        assert responses[1].startswith("Error: at most 1 crop_video calls run per turn")
    else:
        assert responses[1] == SUMMARY


@pytest.mark.parametrize(("concurrency", "batch_sizes"), [(1, [1, 1, 1]), (2, [2, 1]), (3, [3])])
def test_concurrent_samples_share_one_batched_generation(tiny_processor, short_video, concurrency, batch_sizes):
    engine = ScriptedEngine(tiny_processor, [ANSWER_B])
    runner = HFSampleRunner(engine, tiny_processor, settings(prompt_mode="direct", concurrency=concurrency))
    samples = [mcq_sample(short_video, f"q{i}") for i in range(3)]
    done = [sample.id for sample, _ in runner.outcomes(samples)]
    assert sorted(done) == ["q0", "q1", "q2"]
    assert [len(requests) for requests, _ in engine.main_calls()] == batch_sizes
    assert not engine.prompt_text(engine.main_calls()[0][0][0]).endswith("<think>\n")  # direct: no think prefix


# --- the tiny model on a synthetic world ----------------------------------------------------------


def world_config(output_dir: Path, **eval_fields) -> PipelineConfig:
    return PipelineConfig.model_validate({
        "run": {"output_dir": str(output_dir)},
        "data": {"synth": WORLD},
        "video": {"nframes": 4, "max_pixels": 6144},
        "eval": {"nframes": 4, "max_new_tokens": 16, **eval_fields},
    })


@pytest.fixture(scope="module")
def eval_data(tmp_path_factory) -> ArtifactRef:
    pytest.importorskip("great_expectations", reason="the data stage's contracts need great_expectations")
    from paravt_core.data import stage as data_stage

    return data_stage.run(world_config(tmp_path_factory.mktemp("eval-world")), progress=False).eval


@pytest.fixture(scope="module")
def tiny_ref(tiny_model_dir) -> ArtifactRef:
    return ArtifactRef(kind="model", path=tiny_model_dir, sha256=content_hash(tiny_model_dir))


class CountingRunner:
    """Passes samples to a real runner and records which ones it was asked to run."""

    def __init__(self, runner):
        self.runner, self.asked = runner, []

    def outcomes(self, samples) -> Iterator:
        self.asked += [sample.id for sample in samples]
        return self.runner.outcomes(samples)


DRIVER = """
import os, signal, sys
from pathlib import Path
import torch
torch.set_num_threads(1)
from paravt_core.config import PipelineConfig
from paravt_core.eval import results, stage
from paravt_core.refs import ArtifactRef

cfg_json, model_json, data_json, kill_after = sys.argv[1:5]
appended = 0
real_append = results.ResultsLog.append

def append_then_die(self, record):
    global appended
    real_append(self, record)
    appended += 1
    if appended == int(kill_after):
        os.kill(os.getpid(), signal.SIGKILL)

results.ResultsLog.append = append_then_die
cfg = PipelineConfig.model_validate_json(Path(cfg_json).read_text())
model = ArtifactRef.model_validate_json(Path(model_json).read_text())
data = ArtifactRef.model_validate_json(Path(data_json).read_text())
stage.evaluate_prepared_split(cfg, model, data, "videomme", progress=False)
"""


def _killed_run(tmp_path: Path, cfg: PipelineConfig, model: ArtifactRef, data: ArtifactRef, kill_after: int) -> int:
    files = {"cfg": cfg.model_dump_json(), "model": model.model_dump_json(), "data": data.model_dump_json()}
    for name, text in files.items():
        (tmp_path / f"{name}.json").write_text(text)
    (tmp_path / "driver.py").write_text(DRIVER)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    args = [sys.executable, str(tmp_path / "driver.py"), *(str(tmp_path / f"{n}.json") for n in files), str(kill_after)]
    return subprocess.run(args, cwd=REPO, env=env, capture_output=True, timeout=300, check=False).returncode


def test_a_killed_evaluation_resumes_with_only_the_remaining_samples(tmp_path, eval_data, tiny_ref):
    reference_cfg = world_config(tmp_path / "uninterrupted", concurrency=2)
    reference = eval_stage.evaluate_prepared_split(reference_cfg, tiny_ref, eval_data, "videomme", progress=False)
    assert reference.evaluated == reference.summary["n"] == 4

    cfg = world_config(tmp_path / "killed", concurrency=2)
    assert _killed_run(tmp_path, cfg, tiny_ref, eval_data, kill_after=2) == -signal.SIGKILL
    log = eval_stage.results_dir(cfg, tiny_ref) / "videomme.jsonl"
    kept = [json.loads(line)["id"] for line in log.read_text().splitlines()]
    assert len(kept) == 2 and not (log.parent / "videomme.json").exists()
    with log.open("a") as f:
        f.write('{"id": "' + kept[0][:2])  # also a torn line, as a kill during a write leaves one

    counting = CountingRunner(eval_stage.open_runner(cfg, tiny_ref))
    resumed = eval_stage.evaluate_prepared_split(cfg, tiny_ref, eval_data, "videomme", runner=counting,
                                                 progress=False)
    all_ids = [sample["id"] for sample in json.loads(reference.results_json.read_text())["samples"]]
    assert counting.asked == [i for i in all_ids if i not in kept] and resumed.evaluated == 2
    assert json.loads(resumed.results_json.read_text()) == json.loads(reference.results_json.read_text())


def test_stage_evaluates_every_split_and_a_rerun_runs_nothing(tmp_path, eval_data, tiny_ref):
    cfg = world_config(tmp_path, concurrency=2, max_samples_per_split=2)
    report = eval_stage.run(cfg, tiny_ref, eval_data, "base", progress=False)
    assert set(report.summaries) == set(EVAL_SPLITS) and report.complete
    assert report.summaries["charades"]["primary"]["name"] == "mIoU"
    assert {"R@0.3", "R@0.5", "R@0.7"} <= set(report.summaries["charades"])
    assert all(summary["n"] == 2 for summary in report.summaries.values())
    for split in EVAL_SPLITS:
        assert (report.results_dir / f"{split}.json").is_file()
        assert len((report.results_dir / f"{split}.jsonl").read_text().splitlines()) == 2
    table = eval_stage.format_table({"base": report})
    assert table.splitlines()[2].startswith("| base | ") and "ParaVT-8B (paper)" in table

    counting = CountingRunner(eval_stage.open_runner(cfg, tiny_ref))
    again = eval_stage.evaluate_prepared_split(cfg, tiny_ref, eval_data, "lvbench", runner=counting, progress=False)
    assert counting.asked == [] and again.evaluated == 0 and again.summary == report.summaries["lvbench"]


def test_changed_split_data_sets_the_old_log_aside(tmp_path, eval_data, tiny_ref):
    cfg = world_config(tmp_path, max_samples_per_split=1)
    first = eval_stage.evaluate_prepared_split(cfg, tiny_ref, eval_data, "mlvu", progress=False)
    source = eval_data.path / "mlvu" / "source.json"
    original = source.read_text()
    try:
        source.write_text(original + " ")  # same rows, new folder hash
        counting = CountingRunner(eval_stage.open_runner(cfg, tiny_ref))
        second = eval_stage.evaluate_prepared_split(cfg, tiny_ref, eval_data, "mlvu", runner=counting,
                                                    progress=False)
    finally:
        source.write_text(original)
    assert second.evaluated == 1 and len(counting.asked) == 1
    stale = list(first.results_json.parent.glob("mlvu.jsonl.stale-*"))
    assert len(stale) == 1 and second.summary == first.summary


def test_missing_split_folder_names_the_split_and_the_fix(tmp_path, tiny_ref):
    empty = tmp_path / "eval"
    empty.mkdir()
    data = ArtifactRef(kind="eval_data", path=empty, sha256=content_hash(empty))
    with pytest.raises(eval_stage.EvalError, match="split lvbench: .*re-run the data stage"):
        eval_stage.evaluate_prepared_split(world_config(tmp_path), tiny_ref, data, "lvbench", progress=False)


def test_eval_run_command_prints_the_table(tmp_path, eval_data, tiny_model_dir, capsys):
    from paravt_core.cli import main

    world_dir = eval_data.path.parent.parent
    settings = ["video.nframes=4", "video.max_pixels=6144", "eval.nframes=4", "eval.max_new_tokens=8",
                "eval.max_samples_per_split=1", "eval.concurrency=2"]
    common = ["--config", str(REPO / "conf/pipeline/tiny.yaml"), "--model", str(tiny_model_dir)]
    sets = [arg for item in settings for arg in ("--set", item)]
    code = main(["eval", "run", *common, *sets, "--set", f"run.output_dir={world_dir}", "--split", "lvbench",
                 "--label", "tiny"])
    out = capsys.readouterr().out
    assert code == 0 and "| tiny | – | – | – | " in out and f"results: {world_dir / 'eval'}" in out

    code = main(["eval", "run", *common, "--set", f"run.output_dir={tmp_path / 'nothing'}"])
    assert code == 2 and "no prepared evaluation splits under" in capsys.readouterr().err


def _held_connections_server() -> socket.socket:
    """A listening socket whose connections the kernel accepts and nobody answers."""
    return socket.create_server(("127.0.0.1", 0), backlog=64)


@pytest.mark.parametrize("server", ["silent", "garbage"])
def test_eval_run_against_a_broken_server_exits_1_naming_it_without_a_traceback(tmp_path, eval_data, tiny_model_dir,
                                                                               capsys, server):
    import threading

    from paravt_core.cli import main

    listener = _held_connections_server()
    if server == "garbage":
        def answer_garbage() -> None:
            while True:
                try:
                    conn, _ = listener.accept()
                except OSError:
                    return
                with conn:
                    conn.recv(1 << 16)
                    conn.sendall(b"SSH-2.0-OpenSSH_9.6\r\n")

        threading.Thread(target=answer_garbage, daemon=True).start()
    endpoint = f"http://127.0.0.1:{listener.getsockname()[1]}/v1"
    world_dir = eval_data.path.parent.parent
    sets = [f"run.output_dir={world_dir}", "eval.engine=openai", f"eval.endpoint={endpoint}",
            "eval.request_timeout_s=0.5", "eval.max_samples_per_split=1", "video.nframes=4", "eval.nframes=4"]
    try:
        code = main(["eval", "run", "--config", str(REPO / "conf/pipeline/tiny.yaml"), "--model", str(tiny_model_dir),
                     *[arg for item in sets for arg in ("--set", item)], "--split", "lvbench"])
    finally:
        listener.close()
    err = capsys.readouterr().err
    # The first request is the served-model check's (issue #48); its failure is the server's
    # fault like a failed chat request's (exit 1), not a wrong model (exit 2). The client's own
    # retries and deadline are tests/unit/test_eval_openai.py's.
    assert code == 1 and f"{endpoint}/models" in err and "Traceback" not in err, err
    assert ("timed out" if server == "silent" else "SSH-2.0-OpenSSH_9.6") in err


def test_eval_run_refuses_a_server_serving_another_checkpoint(tmp_path, eval_data, tiny_model_dir, capsys):
    """Issue #48 item 1: the server serves the base model, the SFT model is asked for. Before,
    the run scored the base model's answers and cached them under the SFT model's key."""
    from safetensors.torch import load_file, save_file
    from sglang_stub import TinySGLangServer

    from paravt_core.cli import main
    from paravt_core.model.integrity import write_manifest

    base = tmp_path / "base"  # another checkpoint with the same tokenizer and processor
    shutil.copytree(tiny_model_dir, base)
    weights = load_file(base / "model.safetensors")
    save_file({name: value * 1.01 if value.is_floating_point() else value for name, value in weights.items()},
              str(base / "model.safetensors"), metadata={"format": "pt"})
    write_manifest(base)
    base_name = f"paravt-{content_hash(base)[:12]}"  # as `paravt eval serve --model base` names it
    sft_sha = content_hash(tiny_model_dir)
    world_dir = eval_data.path.parent.parent
    with TinySGLangServer(base, served_model_name=base_name) as server:
        sets = ["video.nframes=4", "video.max_pixels=6144", "eval.nframes=4", "eval.max_new_tokens=8",
                "eval.max_samples_per_split=1", f"run.output_dir={world_dir}", "eval.engine=openai",
                f"eval.endpoint={server.url}/v1", f"eval.served_model_name={base_name}"]
        code = main(["eval", "run", "--config", str(REPO / "conf/pipeline/tiny.yaml"), "--model",
                     str(tiny_model_dir), *[arg for item in sets for arg in ("--set", item)], "--split", "lvbench"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"serves '{base_name}' (root '{base_name}'), which is not {tiny_model_dir} (sha256 {sft_sha[:12]})" in err
    assert f"paravt eval serve --model {tiny_model_dir}" in err and "Traceback" not in err
    assert "/v1/chat/completions" not in server.calls  # refused before the first request
    cfg = load_config(REPO / "conf/pipeline/tiny.yaml", sets)
    sft = ArtifactRef(kind="model", path=tiny_model_dir, sha256=sft_sha)
    assert not (eval_stage.results_dir(cfg, sft) / "lvbench.jsonl").exists()  # nothing cached under its key


# --- the paravt-eval flow --------------------------------------------------------------------------


def _eval_states(task_runs, flow_run_id) -> list[tuple[str, str]]:
    return sorted((name, run.state.name) for name, group in task_runs(flow_run_id).items()
                  for run in group if name.startswith("eval-"))


def test_eval_flow_resolves_the_champion_caches_its_evaluation_and_logs_to_mlflow(prefect_harness, task_runs, tmp_path,
                                                                         tiny_ref):
    from mlflow.tracking import MlflowClient

    from flows.eval import EvalParams, eval_flow
    from paravt_core import registry

    overrides = [f"run.output_dir={tmp_path}", *(f"data.synth.{k}={v}" for k, v in WORLD.items()),
                 "video.nframes=4", "video.max_pixels=6144", "eval.nframes=4", "eval.max_new_tokens=16",
                 "eval.max_samples_per_split=1"]
    params = EvalParams(config_path=str(REPO / "conf/pipeline/tiny.yaml"), overrides=overrides, model="champion",
                        splits=["videomme", "charades"])
    cfg = params.load()
    version = registry.register_checkpoint(
        cfg.mlflow_uri(), cfg.mlflow.experiment, cfg.model.registered_name, tiny_ref, stage="rl", parent_version=None,
        data_sha256="d" * 8, config_hash="c" * 8, git_revision="test", alias="champion")

    first = eval_flow(params, return_state=True)
    assert first.is_completed()
    report = first.result()
    assert report.label == "champion" and set(report.summaries) == {"videomme", "charades"}
    assert report.model_sha256 == tiny_ref.sha256
    assert _eval_states(task_runs, first.state_details.flow_run_id) == [
        ("eval-checkpoint", "Completed"), ("eval-log", "Completed"), ("eval-model", "Completed")]

    second = eval_flow(params, return_state=True)
    assert second.result().summaries == report.summaries
    states = _eval_states(task_runs, second.state_details.flow_run_id)
    assert [state for name, state in states if name == "eval-checkpoint"] == ["Cached"]
    assert ("eval-log", "Cached") in states  # the same report is not logged twice

    client = MlflowClient(cfg.mlflow_uri())
    experiment = client.get_experiment_by_name(cfg.mlflow.experiment)
    runs = client.search_runs([experiment.experiment_id], "tags.stage = 'eval'")
    assert len(runs) == 1
    run = runs[0]
    assert run.data.tags["label"] == "champion" and run.data.tags["model_version"] == version.version
    assert run.data.metrics["videomme/accuracy"] == report.summaries["videomme"]["accuracy"]
    assert run.data.metrics["charades/mIoU"] == report.summaries["charades"]["mIoU"]
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"eval_table.md", "eval_report.json", "results"} <= artifacts
    table = Path(client.download_artifacts(run.info.run_id, "eval_table.md", str(tmp_path))).read_text()
    assert table.splitlines()[2].startswith("| champion | ")


@pytest.mark.gpu
def test_hf_evaluator_runs_a_generated_split_on_the_gpu_in_bf16(tmp_path, short_video, tiny_ref):
    """The `hf` evaluator in bf16 on CUDA, subagent tool mode, on samples of the generated clip
    (no data stage: the GPU image has no great_expectations for its contracts)."""
    engine, processor = eval_stage.hf_engine(PipelineConfig(model={"dtype": "bfloat16"}), tiny_ref)
    assert engine.model.device.type == "cuda" and engine.model.dtype == torch.bfloat16
    runner = HFSampleRunner(engine, processor, settings(tool_mode="subagent", concurrency=4, max_new_tokens=48))
    samples = [mcq_sample(short_video, f"q{i}") for i in range(6)]
    run = evaluate_split("videomme", samples, runner, tmp_path / "results", progress=False)
    records = json.loads(run.results_json.read_text())["samples"]
    assert run.summary["n"] == 6 and len(records) == 6
    assert all(r["end_reason"] != "video_error" for r in records)


@pytest.mark.gpu
def test_hf_evaluator_runs_one_split_on_the_gpu_in_bf16(tmp_path, eval_data, tiny_ref):
    cfg = PipelineConfig.model_validate({**world_config(tmp_path).model_dump(mode="json"),
                                         "model": {"dtype": "bfloat16"}})
    engine, _ = eval_stage.hf_engine(cfg, tiny_ref)
    assert engine.model.device.type == "cuda" and engine.model.dtype == torch.bfloat16
    result = eval_stage.evaluate_prepared_split(cfg, tiny_ref, eval_data, "videomme", progress=False)
    assert result.evaluated == result.summary["n"] == 4


def test_an_undecodable_video_is_a_scored_error_and_the_split_goes_on(tiny_processor, short_video, tmp_path):
    """A corrupt video among the samples: recorded with score 0 and named in the summary;
    the batch it shared is re-run so the other samples are scored normally."""
    broken = tmp_path / "broken.mp4"
    broken.write_bytes(short_video.read_bytes()[:200])
    engine = ScriptedEngine(tiny_processor, [ANSWER_B])
    runner = HFSampleRunner(engine, tiny_processor, settings(prompt_mode="direct", concurrency=3))
    samples = [mcq_sample(short_video, "q0"), mcq_sample(broken, "bad"), mcq_sample(short_video, "q2")]
    run = evaluate_split("videomme", samples, runner, tmp_path / "results", progress=False)
    records = {r["id"]: r for r in json.loads(run.results_json.read_text())["samples"]}
    assert [records[i]["score"] for i in ("q0", "bad", "q2")] == [1.0, 0.0, 1.0]
    assert records["bad"]["end_reason"] == "video_error" and records["bad"]["pred"] is None
    assert run.summary["n"] == 3 and run.summary["accuracy"] == pytest.approx(2 / 3)
    (error,) = run.summary["errors"]
    assert error["id"] == "bad" and f"cannot read video {broken}" in error["error"]
    assert run.summary["end_reasons"] == {"answer": 2, "video_error": 1}
    again = evaluate_split("videomme", samples, runner, tmp_path / "results", progress=False)  # resumes: nothing re-run
    assert again.evaluated == 0 and again.summary["errors"] == run.summary["errors"]


def test_openai_engine_evaluates_a_split_against_a_served_checkpoint(tmp_path, eval_data, tiny_ref):
    """Issue 14: `eval.engine: openai` end to end against a server (the CPU SGLang stub,
    tests/sglang_stub.py, rendering with the checkpoint's own template and processor)."""
    from sglang_stub import TinySGLangServer

    from paravt_core.agent.served_model import served_folder

    name = f"paravt-tiny-{tiny_ref.sha256[:12]}"  # as `paravt eval serve` names it: the served-model check reads it
    cfg = world_config(tmp_path, engine="openai", served_model_name=name, max_samples_per_split=2)
    # served as `paravt eval serve` serves it: with the configuration's pixel bounds (issue #60)
    with TinySGLangServer(served_folder(tiny_ref.path, cfg.video, tmp_path), served_model_name=name) as server:
        cfg = world_config(tmp_path, engine="openai", endpoint=f"{server.url}/v1", served_model_name=name,
                           max_samples_per_split=2)
        result = eval_stage.evaluate_prepared_split(cfg, tiny_ref, eval_data, "videomme", progress=False)
    assert result.evaluated == 2 and result.summary["n"] == 2
    assert len((result.results_json.parent / "videomme.jsonl").read_text().splitlines()) == 2
    chats = [call for call in server.calls if call == "/v1/chat/completions"]
    assert len(chats) >= 3  # the rendering probe, then at least one turn per sample
    assert server.calls.index("/v1/completions") < server.calls.index("/v1/chat/completions")  # log-prob probe first
