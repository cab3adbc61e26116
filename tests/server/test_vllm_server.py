"""The `openai` evaluator and the rendering check against a real vLLM (the server tier).

The server is vLLM's CPU build from .venv-serve, started by `paravt_core.agent.server_launch.launch`
(the code `paravt eval serve` runs) on a tiny Qwen3-VL taught to call tools
(`tool_model.py`), so episodes reach their second and third turns.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from pathlib import Path

import pytest
from server_kit import eval_settings

pytestmark = pytest.mark.server


class TimedClient:
    """Wraps a chat client; records (start, end, is_subagent) of every request."""

    def __init__(self, client):
        self.client, self.url = client, client.url
        self.spans: list[tuple[float, float, bool]] = []
        self._lock = threading.Lock()

    def complete(self, messages, **kwargs):
        from tool_model import SUBAGENT_MARK, _texts

        start = time.perf_counter()
        reply = self.client.complete(messages, **kwargs)
        with self._lock:
            self.spans.append((start, time.perf_counter(), any(SUBAGENT_MARK in t for t in _texts(messages))))
        return reply


def test_the_rendering_check_holds_the_servers_token_ids_to_ours(vllm_server, tool_model_dir):
    from paravt_core.eval.openai_engine import check_server_rendering, rendering_probe
    from paravt_core.model.loading import load_processor

    processor = load_processor(tool_model_dir)
    client = vllm_server.client()
    for think_prefix in (True, False):
        assert check_server_rendering(client, processor, think_prefix) > 0
    sent, _, _ = rendering_probe(True)
    reply = client.complete(sent, max_tokens=1, continue_final_message=True, return_token_ids=True)
    assert reply.prompt_token_ids is not None and len(reply.prompt_token_ids) == reply.prompt_tokens  # ids compared


def test_a_wrong_pixel_bound_fails_the_check_with_the_diff(vllm_server, tool_model_dir, tmp_path):
    from paravt_core.eval.openai_engine import ServerRenderingMismatch, check_server_rendering
    from paravt_core.model.loading import load_processor

    wrong = tmp_path / "wrong-bound"
    shutil.copytree(tool_model_dir, wrong, ignore=shutil.ignore_patterns("*.safetensors"))
    config = json.loads((wrong / "processor_config.json").read_text())
    config["image_processor"]["size"]["longest_edge"] = 3000  # the probe's 64x96 frames now shrink
    (wrong / "processor_config.json").write_text(json.dumps(config))
    with pytest.raises(ServerRenderingMismatch, match=r"other token ids than ours: ours \d+ ids, the server's \d+ "
                                                      r"\(\+\d+\); first difference at position \d+; image pads: "
                                                      r"ours \d+, the server's \d+") as raised:
        check_server_rendering(vllm_server.client(), load_processor(wrong))
    assert "ours:     '" in str(raised.value) and "server's: '" in str(raised.value)


def test_the_served_export_renders_frames_with_the_trainers_pixel_bounds(vllm_server, tiny_processor):
    """#44: the tool model is exported as the SFT and RL stages export; vLLM serving its folder
    renders the probe into the ids the trainer renders (the base processor with SPEC §3's
    bounds), where the base folder's own bounds (Qwen3-VL's) would have upscaled its frames."""
    from paravt_core.eval.openai_engine import ServerRenderingMismatch, check_server_rendering

    video = eval_settings().video
    client = vllm_server.client()
    for think_prefix in (True, False):
        assert check_server_rendering(client, tiny_processor, think_prefix,
                                      pixel_bounds=(video.min_pixels, video.max_pixels)) > 0
    with pytest.raises(ServerRenderingMismatch, match=r"image pads: ours \d+, the server's \d+"):
        check_server_rendering(client, tiny_processor)  # what an export that kept the base's config serves


def test_the_openai_evaluator_plays_tool_rounds_on_two_splits(vllm_server, tool_model_dir, server_splits, tmp_path):
    from paravt_core.eval.evaluator import OpenAISampleRunner, evaluate_split
    from paravt_core.eval.results import ResultsLog
    from paravt_core.model.loading import load_processor

    processor = load_processor(tool_model_dir)
    client = TimedClient(vllm_server.client())
    runner = OpenAISampleRunner(client, processor, eval_settings(concurrency=1))
    for split, samples in server_splits.items():
        run = evaluate_split(split, samples, runner, tmp_path, progress=False)
        records = list(ResultsLog(tmp_path / f"{split}.jsonl").load().values())
        assert run.evaluated == len(samples) and len(records) == len(samples)
        # Turn one calls two crops, turn two one more, the forced turn answers (tool_model.SCRIPTS).
        assert {(r["turns"], r["tool_calls"], r["end_reason"]) for r in records} == {(3, 3, "answer")}, records
        assert run.summary["avg_tool_calls"] == 3.0
        assert run.summary["primary"]["value"] == pytest.approx(1.0), run.summary  # accuracy, mIoU
    # One sample at a time, so overlapping sub-agent requests are the calls of one round.
    subagent = sorted((start, end) for start, end, sub in client.spans if sub)
    assert len(subagent) == 3 * sum(len(samples) for samples in server_splits.values())
    overlapping = sum(1 for (_, end), (start, _) in zip(subagent, subagent[1:]) if start < end)
    assert overlapping >= len(server_splits["videomme"]), "the two crop calls of a round were not sent concurrently"


def test_a_server_killed_mid_split_resumes_without_losing_or_repeating_a_sample(vllm_server, tool_model_dir,
                                                                                  server_splits, tmp_path):
    from paravt_core.eval.evaluator import OpenAISampleRunner, evaluate_split
    from paravt_core.eval.openai_engine import ChatError
    from paravt_core.model.loading import load_processor

    processor = load_processor(tool_model_dir)
    samples = server_splits["videomme"]
    log = tmp_path / "videomme.jsonl"
    failure: list[BaseException] = []

    def evaluate() -> None:
        runner = OpenAISampleRunner(vllm_server.client(max_retries=2, backoff_s=0.2), processor, eval_settings())
        try:
            evaluate_split("videomme", samples, runner, tmp_path, progress=False)
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            failure.append(exc)

    worker = threading.Thread(target=evaluate)
    worker.start()
    deadline = time.monotonic() + 300
    while not (log.exists() and log.read_text().count("\n") >= 1):
        assert worker.is_alive() and time.monotonic() < deadline, f"no sample finished: {failure}"
        time.sleep(0.05)
    vllm_server.kill()
    worker.join(timeout=120)
    assert not worker.is_alive() and failure and isinstance(failure[0], ChatError), failure
    assert "gave up after 3 attempts" in str(failure[0])
    done_before = [json.loads(line)["id"] for line in log.read_text().splitlines()]
    assert 1 <= len(done_before) < len(samples)

    vllm_server.start()
    runner = OpenAISampleRunner(vllm_server.client(), processor, eval_settings())
    run = evaluate_split("videomme", samples, runner, tmp_path, progress=False)
    ids = [json.loads(line)["id"] for line in log.read_text().splitlines()]
    assert run.evaluated == len(samples) - len(done_before)
    assert sorted(ids) == sorted(sample.id for sample in samples) and ids[:len(done_before)] == done_before
    assert run.summary["accuracy"] == pytest.approx(1.0) and run.summary["avg_tool_calls"] == 3.0
    assert Path(run.results_json).is_file()


def test_paravt_eval_serve_runs_vllm_from_its_venv_and_stops_it_whole(serve_python, tiny_model_dir, tiny_processor,
                                                                     tmp_path):
    """The served model renders the configuration's pixel bounds (the tiny model's own processor,
    like a downloaded base model's, would upscale frames: issue #60 finding 2)."""
    import signal
    import subprocess

    from server_kit import free_port

    from tests.conftest import start_eval_serve

    from paravt_core.config import load_config
    from paravt_core.eval.openai_engine import OpenAIChatClient, check_server_rendering

    config = Path(__file__).resolve().parents[2] / "conf/pipeline/tiny.yaml"
    video = load_config(config).video
    port = free_port()
    paravt, lines = start_eval_serve(["--model", str(tiny_model_dir), "--port", str(port), "--server", "vllm",
                                      "--python", serve_python, "--startup-timeout-s", "600", "--config", str(config),
                                      "--set", f"run.output_dir={tmp_path}"])
    try:
        assert f"endpoint: http://127.0.0.1:{port}/v1\n" in lines, lines
        name = lines[-1].split("eval.served_model_name=")[1].strip()
        client = OpenAIChatClient(f"http://127.0.0.1:{port}/v1", name)
        assert check_server_rendering(client, tiny_processor, pixel_bounds=(video.min_pixels, video.max_pixels)) > 0
        group = [int(pid) for pid in subprocess.run(["pgrep", "-g", str(_server_pgid(paravt.pid))],
                                                    capture_output=True, text=True).stdout.split()]
        assert len(group) >= 2, group  # vLLM's API server and its engine core
        paravt.send_signal(signal.SIGINT)
        assert paravt.wait(timeout=120) == 0
        deadline = time.monotonic() + 60
        while any(os.path.exists(f"/proc/{pid}") and _state(pid) != "Z" for pid in group):
            assert time.monotonic() < deadline, f"server processes outlived `paravt eval serve`: {group}"
            time.sleep(0.5)
    finally:
        if paravt.poll() is None:
            paravt.kill()


def _server_pgid(parent: int) -> int:
    """The process group of `parent`'s child (the server leads a group of its own)."""
    import subprocess

    children = subprocess.run(["pgrep", "-P", str(parent)], capture_output=True, text=True).stdout.split()
    assert children, f"no server process under {parent}"
    return os.getpgid(int(children[0]))


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"
