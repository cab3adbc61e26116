"""The `server` tier: a real vLLM, run from .venv-serve (`make install-serve`), serving a tiny
Qwen3-VL that calls tools (`tool_model.py`), started once per test session.

Without the serve venv these tests skip with the reason; under `make test-server`
(PARAVT_SERVER_TIER=1) they fail instead, so the tier cannot pass by skipping.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from server_kit import SERVED_NAME, eval_settings, free_port, grounding, mcq  # noqa: E402


@pytest.fixture(scope="session")
def serve_python() -> str:
    """The interpreter holding vLLM (`agent.server_launch`'s choice), or skip / fail."""
    from paravt_core.agent.server_launch import ServeError, pick_server, probe_python, server_python_path

    path = server_python_path()
    try:
        pick_server("vllm", probe_python(path))
    except ServeError as exc:
        reason = f"the server tier needs vLLM in its own venv (`make install-serve`): {exc}"
        if os.environ.get("PARAVT_SERVER_TIER") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    return path


@pytest.fixture(scope="session")
def server_splits(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list]:
    """Two splits on two generated clips: videomme (4 MCQ samples), charades (2 grounding)."""
    from tests.conftest import write_test_video

    folder = tmp_path_factory.mktemp("server-videos")
    first = write_test_video(folder / "clip.mp4")
    second = write_test_video(folder / "other.mp4", size=(64, 128))
    return {"videomme": [mcq(first, "v0"), mcq(second, "v1"), mcq(first, "v2"), mcq(second, "v3")],
            "charades": [grounding(first, "c0"), grounding(second, "c1")]}


@pytest.fixture(scope="session")
def tool_model_dir(serve_python, tiny_model_dir: Path, tiny_processor, server_splits,
                   tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model taught the scripted episodes of `server_splits` (`tool_model.py`), exported
    as the SFT and RL stages export a checkpoint (its processor carries the pixel bounds)."""
    import time

    from tool_model import examples, record_requests, teach

    from paravt_core.eval.evaluator import OpenAISampleRunner
    from paravt_core.model.loading import load_processor, pixel_bounded

    settings = eval_settings()
    requests = record_requests(lambda client: OpenAISampleRunner(client, tiny_processor, settings), server_splits)
    started = time.perf_counter()
    # rendered as the server renders them: with the export's processor, which carries the bounds
    found = examples(requests, pixel_bounded(load_processor(tiny_model_dir), settings.video))
    out = teach(tiny_model_dir, tmp_path_factory.mktemp("models") / "tool-tiny", found, settings.video)
    print(f"\ntool model: {len(requests)} requests, {len(found)} distinct, taught in "
          f"{time.perf_counter() - started:.0f} s", flush=True)
    return out


class LiveServer:
    """vLLM serving the tool model on a free loopback port; `kill()` crashes it, `start()` again."""

    def __init__(self, model_dir: Path, python: str, log_dir: Path):
        self.model_dir, self.python, self.log_dir = model_dir, python, log_dir
        self.port = free_port()
        self.process = None
        self.starts = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> LiveServer:
        from paravt_core.agent.server_launch import launch

        self.starts += 1
        _, self.process = launch(self.model_dir, SERVED_NAME, port=self.port, server="vllm", python=self.python,
                                 startup_timeout_s=600, log_path=self.log_dir / f"vllm-{self.starts}.log",
                                 progress=lambda line: print(line, flush=True))
        return self

    def client(self, **kwargs):
        from paravt_core.eval.openai_engine import OpenAIChatClient

        return OpenAIChatClient(self.base_url, SERVED_NAME, **{"timeout_s": 120.0, **kwargs})

    def kill(self) -> None:
        self.process.kill()

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()


@pytest.fixture(scope="session")
def vllm_server(tool_model_dir: Path, serve_python: str, tmp_path_factory: pytest.TempPathFactory):
    server = LiveServer(tool_model_dir, serve_python, tmp_path_factory.mktemp("server-logs")).start()
    try:
        yield server
    finally:
        server.stop()
