"""`eval.engine: openai` with no endpoint: the evaluation serves each checkpoint itself
(`paravt_core/eval/served.py`, issue #44 item 5). Lifecycle only, on a stand-in `vllm`
package whose server answers /health and /v1/models (not chat): started once per checkpoint
when a sample is left to run, serving that checkpoint, stopped after its splits and on any
error. The server tier runs it with a real vLLM (`tests/server/test_pipeline_own_servers.py`)."""

from __future__ import annotations

import json
import os
import sys
import textwrap
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from paravt_core.config import PipelineConfig
from paravt_core.eval import stage
from paravt_core.eval.results import EpisodeOutcome
from paravt_core.eval.samples import EvalSample
from paravt_core.refs import ArtifactRef, content_hash
from tests.conftest import fake_vllm_package, processes_gone

FAKE_SERVER = textwrap.dedent('''
    """A stand-in for `vllm serve` (imported as vLLM's CLI main): forks a worker (as vLLM's engine core), answers
    /health and /v1/models, and appends what it was started with to $FAKE_STARTS."""
    import argparse, http.server, json, os, subprocess, sys
    parser = argparse.ArgumentParser()
    parser.add_argument("subcommand", choices=["serve"])
    parser.add_argument("model")  # `vllm serve MODEL`
    for flag in ("--port", "--host", "--served-model-name", "--data-parallel-size"):
        parser.add_argument(flag)
    args, _ = parser.parse_known_args()
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    with open(os.environ["FAKE_STARTS"], "a") as f:
        f.write(json.dumps({"pids": [os.getpid(), worker.pid], "model": args.model, "argv": sys.argv[1:],
                            "cuda": os.environ.get("CUDA_VISIBLE_DEVICES")}) + "\\n")
    if os.environ.get("FAKE_EXIT"):
        print("fake server: no such model", flush=True)
        sys.exit(int(os.environ["FAKE_EXIT"]))
    served = os.environ.get("FAKE_SERVED_AS") or args.served_model_name
    class Api(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path == "/health":
                self.send_response(200); self.end_headers()
            elif self.path == "/v1/models":
                body = json.dumps({"data": [{"id": served, "root": args.model}]}).encode()
                self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
                self.wfile.write(body)
            else:
                self.send_response(404); self.end_headers()
        def log_message(self, *a):
            pass
    http.server.HTTPServer((args.host, int(args.port)), Api).serve_forever()
''')


@pytest.fixture()
def fake_vllm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The stand-in importable by this interpreter's children; returns the starts log."""
    root = fake_vllm_package(tmp_path / "fakepkgs", FAKE_SERVER)
    monkeypatch.setenv("PYTHONPATH", f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    monkeypatch.setenv("FAKE_STARTS", str(tmp_path / "starts.jsonl"))
    for name in ("PARAVT_EVAL_ENDPOINT", "PARAVT_EVAL_MODEL_NAME", "PARAVT_SERVE_PYTHON"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path / "starts.jsonl"


def starts(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def config(tmp_path: Path, **eval_fields) -> PipelineConfig:
    fields = {"engine": "openai", "server": "vllm", "server_python": sys.executable, "server_startup_timeout_s": 60,
              "splits": ["lvbench"],
              **eval_fields}
    return PipelineConfig.model_validate({"run": {"output_dir": str(tmp_path / "out")}, "eval": fields})


def eval_data(root: Path) -> ArtifactRef:
    """A prepared lvbench split of two rows (the data stage's layout)."""
    folder, videos = root / "eval" / "lvbench", root / "videos"
    folder.mkdir(parents=True)
    videos.mkdir()
    rows = []
    for uid in ("1", "2"):
        (videos / f"video{uid}.mp4").write_bytes(b"")  # present; the runners below never decode it
        rows.append({"key": f"video{uid}", "type": "cartoon", "uid": uid, "answer": "A",
                     "question": f"What year ({uid})?\n(A) 1636\n(B) 1366", "question_type": ["counting"],
                     "time_reference": "00:15-00:19"})
    (folder / "lvbench.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (folder / "split.json").write_text(json.dumps({"split": "lvbench", "rows": str(folder / "lvbench.jsonl"),
                                                   "video_dir": str(videos), "subtitle_dir": None}))
    return ArtifactRef(kind="eval_data", path=root / "eval", sha256=content_hash(root / "eval"))


class CheckedAnswersA:
    """What `open_runner` returns here: it first holds the server to the checkpoint with the
    real served-model check, then answers "A" to every sample."""

    def __init__(self, cfg: PipelineConfig, model: ArtifactRef, served) -> None:
        assert served is not None, "no server was started for the checkpoint"
        stage.check_serves_checkpoint(stage._openai_client(model, cfg.eval, served), model)
        self.served = served

    def outcomes(self, samples: Sequence[EvalSample]) -> Iterator[tuple[EvalSample, EpisodeOutcome]]:
        for sample in samples:
            yield sample, EpisodeOutcome("<answer>A</answer>", 1, 0, 0, 0, 0, "answer")


def test_each_checkpoint_gets_a_server_of_its_own_stopped_after_its_splits(fake_vllm, fake_checkpoint, tmp_path,
                                                                           monkeypatch):
    monkeypatch.setattr(stage, "open_runner", CheckedAnswersA)
    cfg, data = config(tmp_path), eval_data(tmp_path / "data")
    models = [fake_checkpoint(tmp_path / name, name) for name in ("base", "sft", "rl")]
    for number, model in enumerate(models, start=1):
        lines: list[str] = []
        report = stage.run(cfg, model, data, model.path.name, progress=False, notify=lines.append)
        assert report.summaries["lvbench"]["n"] == 2
        assert lines[0].startswith(f"eval: starting a model server (vllm) for {model.path}")  # a Prefect log line
        assert lines[-1] == f"eval: stopped the model server for {model.path}"
        started = starts(fake_vllm)
        assert len(started) == number and started[-1]["model"] == str(model.path)
        assert processes_gone(started[-1]["pids"]), f"the server for {model.path} outlived its evaluation"
        assert (stage.results_dir(cfg, model) / "server.log").is_file()
    assert len({tuple(s["pids"]) for s in starts(fake_vllm)}) == 3
    assert all(s["cuda"] is None and "--data-parallel-size" not in s["argv"] for s in starts(fake_vllm))

    again = stage.run(cfg, models[0], data, "base", progress=False)  # all finished: re-summarized, no server
    assert again.summaries["lvbench"]["n"] == 2 and len(starts(fake_vllm)) == 3


def test_the_server_is_stopped_when_the_evaluation_fails(fake_vllm, fake_checkpoint, tmp_path, monkeypatch):
    class Fails(CheckedAnswersA):
        def outcomes(self, samples):
            raise RuntimeError("the evaluation broke mid-split")
            yield

    monkeypatch.setattr(stage, "open_runner", Fails)
    model = fake_checkpoint(tmp_path / "ckpt", "w")
    with pytest.raises(RuntimeError, match="broke mid-split"):
        stage.run(config(tmp_path), model, eval_data(tmp_path / "data"), "base", progress=False)
    (started,) = starts(fake_vllm)
    assert processes_gone(started["pids"])


def test_a_server_serving_another_model_is_refused_and_stopped(fake_vllm, fake_checkpoint, tmp_path, monkeypatch):
    """The real `open_runner`: its served-model check runs before any sample."""
    monkeypatch.setenv("FAKE_SERVED_AS", "someone-elses-model")
    model = fake_checkpoint(tmp_path / "ckpt", "w")
    with pytest.raises(stage.EvalError, match=f"(?s)someone-elses-model.*{model.sha256[:12]}"):
        stage.run(config(tmp_path), model, eval_data(tmp_path / "data"), "base", progress=False)
    (started,) = starts(fake_vllm)
    assert processes_gone(started["pids"])
    log = stage.results_dir(config(tmp_path), model) / "lvbench.jsonl"
    assert not log.exists() or not log.read_text()  # nothing scored


def test_gpus_make_data_parallel_replicas_and_size_the_concurrency(fake_vllm, fake_checkpoint, tmp_path,
                                                                   monkeypatch):
    seen = []
    monkeypatch.setattr(stage, "open_runner", lambda cfg, model, served: seen.append(served) or
                        CheckedAnswersA(cfg, model, served))
    cfg = config(tmp_path, gpus=[2, 3], concurrency=3)
    stage.run(cfg, fake_checkpoint(tmp_path / "ckpt", "w"), eval_data(tmp_path / "data"), "base", progress=False)
    (started,) = starts(fake_vllm)
    assert started["cuda"] == "2,3" and started["argv"][started["argv"].index("--data-parallel-size") + 1] == "2"
    assert seen[0].replicas == 2 and stage.runner_settings(cfg, seen[0]).eval.concurrency == 6
    assert stage.runner_settings(cfg).eval.concurrency == 3


def test_no_server_is_started_for_a_given_endpoint_or_the_hf_engine(tmp_path, monkeypatch):
    monkeypatch.delenv("PARAVT_EVAL_ENDPOINT", raising=False)
    model = ArtifactRef(kind="model", path=tmp_path, sha256="a" * 64)
    assert stage.own_server(config(tmp_path), model) is not None
    assert stage.own_server(config(tmp_path, endpoint="http://127.0.0.1:30000/v1"), model) is None
    assert stage.own_server(config(tmp_path, engine="hf"), model) is None
    monkeypatch.setenv("PARAVT_EVAL_ENDPOINT", "http://127.0.0.1:30000/v1")
    assert stage.own_server(config(tmp_path), model) is None


def test_no_server_to_start_is_an_input_error_naming_what_to_install(fake_checkpoint, tmp_path):
    model = fake_checkpoint(tmp_path / "ckpt", "w")
    cfg = config(tmp_path, server_python=str(tmp_path / "no-such-venv" / "bin" / "python"))
    with pytest.raises(stage.EvalError, match="(?s)starts a server for .*make install-serve"):
        stage.run(cfg, model, eval_data(tmp_path / "data"), "base", progress=False)


@pytest.mark.parametrize("server_python, status", [("self", 1), ("missing", 2)], ids=["fails-to-start", "none"])
def test_paravt_eval_run_exit_status_when_its_server_cannot_serve(fake_vllm, fake_checkpoint, tmp_path, monkeypatch,
                                                                   capsys, server_python, status):
    """A server that exits during start-up is the server's failure (1); no interpreter with a
    server is the input's (2); either way one line on stderr, no traceback."""
    from paravt_core.cli import main

    monkeypatch.setenv("FAKE_EXIT", "3")
    out = tmp_path / "out"
    eval_data(out / "data")
    model = fake_checkpoint(tmp_path / "ckpt", "w")
    python = sys.executable if server_python == "self" else str(tmp_path / "no-such-venv" / "bin" / "python")
    sets = [f"run.output_dir={out}", "eval.engine=openai", "eval.server=vllm", f"eval.server_python={python}",
            "eval.server_startup_timeout_s=60", "eval.splits=[lvbench]"]
    assert main(["eval", "run", "--model", str(model.path), *(a for s in sets for a in ("--set", s))]) == status
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert ("did not start" in err and "no such model" in err) if status == 1 else "make install-serve" in err


def test_a_base_model_is_served_from_a_copy_with_the_configs_pixel_bounds(fake_vllm, tiny_model_dir, tmp_path):
    """Issue #60 finding 2: the base model as downloaded (the tiny kit keeps Qwen3-VL's
    processor bounds, 65,536 pixels at least) was served from its own folder, upscaling frames
    the protocol caps at `video.max_pixels`; RL served a bounded copy, the evaluation did not."""
    from paravt_core.eval.served import ServerOnDemand
    from paravt_core.model.loading import load_processor

    cfg = config(tmp_path)
    model = ArtifactRef(kind="model", path=tiny_model_dir, sha256=content_hash(tiny_model_dir))
    with ServerOnDemand(cfg, model, tmp_path / "results" / "server.log") as server:
        server.get()
    (started,) = starts(fake_vllm)
    served = Path(started["model"])
    assert served == tmp_path / "results" / "served-model", served
    size = load_processor(served).image_processor.size
    assert (size["shortest_edge"], size["longest_edge"]) == (cfg.video.min_pixels, cfg.video.max_pixels)
    assert (served / "model.safetensors").resolve() == (tiny_model_dir / "model.safetensors").resolve()
    assert load_processor(tiny_model_dir).image_processor.size["shortest_edge"] == 65536  # untouched
