"""Shared fixtures: the tiny Qwen3-VL, a short generated clip and a Prefect test harness.

Prefect settings are fixed here, before anything imports Prefect: a temporary PREFECT_HOME
and result storage per test session, so cached results never leak between runs.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

_SESSION_DIR = Path(tempfile.mkdtemp(prefix="paravt-tests-"))
os.environ["PREFECT_HOME"] = str(_SESSION_DIR / "prefect-home")
os.environ["PREFECT_RESULTS_LOCAL_STORAGE_PATH"] = str(_SESSION_DIR / "prefect-results")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "60")
os.environ.setdefault("PREFECT_LOGGING_TO_API_ENABLED", "false")
# No flow of the project saves a block, and registering Prefect's block types is a fifth of
# each test server's start-up CPU (3.4 of 17 s; docs/speed.md).
os.environ.setdefault("PREFECT_API_BLOCKS_REGISTER_ON_START", "false")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

# Under pytest-xdist (`make test` runs `-n auto`) each worker gets its share of the cores, so
# N workers with torch's default of one thread per core do not oversubscribe the machine;
# set before torch is imported (it reads OMP_NUM_THREADS once), and inherited by the
# processes tests start (DeepSpeed ranks, servers).
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    _threads = max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))
    os.environ["OMP_NUM_THREADS"] = str(_threads)

# `--cpu-report PATH`: CPU seconds per test, the measure of the suite's speed (tests/cpu_report.py).
from tests import cpu_report  # noqa: E402

pytest_addoption, pytest_configure = cpu_report.pytest_addoption, cpu_report.pytest_configure

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_BENCHMARKS = REPO_ROOT.parent / "shared" / "benchmarks"


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """With PARAVT_FAILURES_AT_ONCE=1 (scripts/gpu_check.py), a failure's traceback is written
    when it happens: a run stopped by a time limit still shows why its tests failed."""
    if report.failed and os.environ.get("PARAVT_FAILURES_AT_ONCE") == "1":
        import sys

        print(f"\n--- {report.nodeid} failed ({report.when}) ---\n{report.longreprtext[-6000:]}\n", file=sys.stderr,
              flush=True)


SLOW_TESTS = Path(__file__).with_name("slow_tests.txt")


def slowest_first(items: list[pytest.Item], measured: dict[str, float]) -> list[pytest.Item]:
    """`items` with the tests of `measured` (node id -> seconds) first, longest first, and the
    rest in collection order (modules stay together, so their fixtures are built once).

    Under `make test` (pytest-xdist, `--dist load` handing out two tests at a time) the long
    flow and training tests then start at once on different workers, and the short ones fill
    the gaps; in collection order they queued behind each other in one worker (issue #45)."""
    slow = sorted((item for item in items if item.nodeid in measured), key=lambda item: -measured[item.nodeid])
    return slow + [item for item in items if item.nodeid not in measured]


def measured_durations(path: Path = SLOW_TESTS) -> dict[str, float]:
    """`tests/slow_tests.txt`: `<seconds> <node id>` lines from a measured `make test`
    (`--durations`); a renamed test simply loses its place at the front."""
    measured = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            seconds, nodeid = line.split(maxsplit=1)
            measured[nodeid] = float(seconds)
    return measured


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    import torch

    if os.environ.get("PYTEST_XDIST_WORKER"):  # each worker collects; the order must be the same on all
        items[:] = slowest_first(items, measured_durations())
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU (gpu tier)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny random-weight Qwen3-VL of the embedded default, built once per session."""
    from paravt_core.model.tiny import TinyModelSpec, build_tiny_model

    return build_tiny_model(TinyModelSpec(seed=0), tmp_path_factory.mktemp("models") / "tiny")


@pytest.fixture(scope="session")
def tiny_processor(tiny_model_dir: Path):
    from paravt_core.model.loading import load_processor

    return load_processor(tiny_model_dir)


@pytest.fixture()
def tiny_model(tiny_model_dir: Path):
    """A fresh copy per test, so a test that trains it cannot disturb another."""
    from paravt_core.model.loading import load_model

    return load_model(tiny_model_dir)


@pytest.fixture(scope="session")
def two_frame_clip():
    """Two 64x96 frames (uint8 [T, H, W, 3]) with their Qwen3-VL video metadata."""
    import numpy as np
    from transformers.video_utils import VideoMetadata

    frames = np.random.default_rng(0).integers(0, 255, size=(2, 64, 96, 3), dtype=np.uint8)
    meta = VideoMetadata(total_num_frames=40, fps=2.0, frames_indices=[0, 20], duration=20.0, width=96, height=64)
    return frames, meta


def write_mcq_split(root: Path, questions: list[str]) -> Path:
    """A prepared LVBench-format split of one test video per multiple-choice question (the
    data stage's `split.json` layout); returns its split.json."""
    import json

    videos, folder = root / "videos", root / "lvbench"
    videos.mkdir(parents=True)
    folder.mkdir()
    rows = []
    for i, question in enumerate(questions):
        write_test_video(videos / f"v{i}.mp4", seconds=12.0)
        rows.append({"uid": f"u{i}", "key": f"v{i}", "type": "t", "answer": "A", "question_type": ["x"],
                     "time_reference": "00:01-00:02", "question": f"{question}\n(A) one\n(B) two\n(C) three\n(D) four"})
    (folder / "lvbench.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    split_json = folder / "split.json"
    split_json.write_text(json.dumps({"split": "lvbench", "rows": str(folder / "lvbench.jsonl"),
                                      "video_dir": str(videos), "subtitle_dir": None}))
    return split_json


def write_test_video(path: Path, seconds: float = 12.0, fps: float = 2.0, size: tuple[int, int] = (64, 96)) -> Path:
    """An mp4 whose frame i is a flat colour encoding i (red = 8 * i mod 256), decodable by PyAV/decord."""
    import av
    import numpy as np

    height, width = size
    n = int(round(seconds * fps))
    with av.open(str(path), "w") as container:
        stream = container.add_stream("mpeg4", rate=int(fps))
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        for i in range(n):
            img = np.zeros((height, width, 3), dtype=np.uint8)
            img[..., 0] = (8 * i) % 256
            img[..., 1] = 128
            img[height // 4 : height // 2, width // 4 : width // 2, 2] = 255
            for packet in stream.encode(av.VideoFrame.from_ndarray(img, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


@pytest.fixture()
def fake_checkpoint():
    """`make(folder, payload) -> ArtifactRef`: a model folder (config, a one-tensor safetensors
    holding payload's bytes, its weights manifest) whose hash follows payload, for registry and
    model-reference tests that never load weights; whole by `model.integrity`'s checks."""
    import numpy as np
    from safetensors.numpy import save_file

    from paravt_core.model.integrity import write_manifest
    from paravt_core.refs import ArtifactRef, content_hash

    def make(folder: Path, payload: str) -> ArtifactRef:
        folder.mkdir(parents=True)
        (folder / "config.json").write_text('{"model": "tiny"}')
        save_file({"payload": np.frombuffer(payload.encode(), dtype=np.uint8).copy()}, str(folder / "model.safetensors"))
        write_manifest(folder)
        return ArtifactRef(kind="model", path=folder, sha256=content_hash(folder))

    return make


@pytest.fixture(scope="session")
def short_video(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One generated 12 s, 2 fps, 64x96 clip shared by the tests."""
    return write_test_video(tmp_path_factory.mktemp("videos") / "clip.mp4")


@pytest.fixture(scope="session", autouse=True)
def rank_forkserver():
    """One fork server per test process (paravt_core/forkserver.py): the DeepSpeed ranks the
    tests start fork from it instead of importing torch, transformers and DeepSpeed each (about
    10 CPU s a rank). It imports in the background while the first tests run; a rank asked for
    before it listens waits for it. PARAVT_TEST_FORKSERVER=0 starts every rank as a subprocess."""
    if os.environ.get("PARAVT_TEST_FORKSERVER", "1") == "0":
        yield None
        return
    from paravt_core import forkserver

    # A Unix socket path has at most 107 bytes: under /tmp whatever TMPDIR a CI runner sets.
    folder = Path(tempfile.mkdtemp(prefix="paravt-fs-", dir="/tmp" if os.path.isdir("/tmp") else None))
    path = folder / f"ranks-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}.sock"
    # A rank's OMP_NUM_THREADS must be the server's to fork (torch read it at import): this
    # process's (one core per xdist worker), else 1, what each of two ranks on 2 cores gets.
    server = forkserver.start(path, env={**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")},
                              ready_timeout=None)
    os.environ[forkserver.SOCKET_ENV] = str(path)
    try:
        yield server
    finally:
        os.environ.pop(forkserver.SOCKET_ENV, None)
        server.stop()
        import shutil

        shutil.rmtree(folder, ignore_errors=True)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    import shutil

    shutil.rmtree(_SESSION_DIR, ignore_errors=True)


def read_task_runs(flow_run_id) -> list:
    """A flow run's task runs once the server has recorded a final state for each (task
    states reach the API through events, a moment after the flow returns)."""
    import time

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    runs: list = []
    settled = -1  # the count of the last poll whose runs were all final
    for _ in range(120):
        with get_client(sync_client=True) as client:
            runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
        final = bool(runs) and all(r.state is not None and r.state.is_final() for r in runs)
        # Final AND no new task run since the poll before: on a loaded machine the later
        # task runs' events can still be on their way when the first ones are final.
        if final and len(runs) == settled:
            return runs
        settled = len(runs) if final else -1
        time.sleep(0.5)
    raise AssertionError(f"task runs of {flow_run_id} never all reached a final state: {runs}")


@pytest.fixture(scope="session")
def task_runs():
    """flow run id -> {task name without its suffix: [task runs]}."""

    def grouped(flow_run_id) -> dict[str, list]:
        out: dict[str, list] = {}
        for run in read_task_runs(flow_run_id):
            out.setdefault(run.name.rsplit("-", 1)[0], []).append(run)
        return out

    return grouped


@pytest.fixture(scope="session")
def prefect_harness():
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=60):
        yield


class OracleModel:
    """A stand-in model for the teacher-forced probes: predicts every next token right, except
    tokens equal to `miss`."""

    def __init__(self, vocab: int, miss: int | None = None):
        self.vocab, self.miss = vocab, miss

    def eval(self):
        return self

    def __call__(self, input_ids, **_):
        import types

        import torch

        nxt = torch.roll(input_ids, -1, dims=1)
        if self.miss is not None:
            nxt = torch.where(nxt == self.miss, torch.zeros_like(nxt), nxt)
        return types.SimpleNamespace(logits=torch.nn.functional.one_hot(nxt, self.vocab).float())


@pytest.fixture()
def oracle_model() -> type[OracleModel]:
    return OracleModel


def default_signals() -> None:
    """preexec_fn for a test's child: SIGINT and SIGQUIT at their defaults, whatever this
    pytest inherited (a shell without job control starts background jobs with both ignored,
    and an ignored disposition survives fork and exec)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)


def background_signals() -> None:
    """preexec_fn for a child launched as a shell's background job without job control would
    be: SIGINT and SIGQUIT ignored (`nohup cmd &` in a script, many CI runners)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGQUIT, signal.SIG_IGN)


def start_eval_serve(args: list[str], env: dict[str, str] | None = None, background: bool = False):
    """`paravt eval serve ARGS` in a process of its own: (the process, its stdout lines up to the
    `evaluate:` line it prints once the server is healthy, or all of them if it exits first).

    The child gets default signal dispositions, or with `background` those of a background job
    started without job control (SIGINT and SIGQUIT ignored), whatever this pytest inherited."""
    import subprocess
    import sys

    process = subprocess.Popen([sys.executable, "-m", "paravt_core.cli", "eval", "serve", *args], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               preexec_fn=background_signals if background else default_signals)
    lines = []
    for line in process.stdout:
        lines.append(line)
        if line.startswith("evaluate:"):
            break
    return process, lines


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")  # a zombie (exited, not yet reaped) counts as gone
    return not (stat.exists() and stat.read_text().split(")")[-1].split()[0] == "Z")


def processes_gone(pids, timeout_s: float = 20.0) -> bool:
    """Whether every pid has exited (zombies count as gone) within `timeout_s`."""
    import time

    deadline = time.monotonic() + timeout_s
    while any(process_alive(pid) for pid in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def fake_vllm_package(root: Path, server_source: str) -> Path:
    """A stand-in `vllm` package under `root` whose `vllm.entrypoints.cli.main` (the `vllm`
    command's, which `paravt_core.agent.server_launch` runs as `vllm serve MODEL ...`) runs
    `server_source` when imported; returns `root` for PYTHONPATH."""
    module = root / "vllm" / "entrypoints" / "cli"
    module.mkdir(parents=True)
    for folder in (root / "vllm", root / "vllm" / "entrypoints", module):
        (folder / "__init__.py").write_text("")
    (module / "main.py").write_text(server_source)
    return root
