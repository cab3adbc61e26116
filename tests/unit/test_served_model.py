"""The served-model check (`agent/served_model.py`, issue #48) against a stand-in answering
`GET /v1/models` as vLLM and SGLang do; the real vLLM is in tests/server/."""

from __future__ import annotations

import json
import re
import shutil
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from paravt_core.agent.served_model import ServedModelMismatch, check_served_model, served_model_name
from paravt_core.refs import content_hash

REPO = Path(__file__).resolve().parents[2]


class ModelsStandIn:
    """Answers GET /v1/models with `entries` ({"id", "root"} dicts); records paths and auth
    headers of every request, and answers any POST with a chat completion."""

    def __init__(self, entries: list[dict] | None):
        self.requests: list[tuple[str, str, str | None]] = []
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self, status: int, payload) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:  # the name http.server calls
                stand_in.requests.append(("GET", self.path, self.headers.get("Authorization")))
                if self.path != "/v1/models" or entries is None:
                    self._answer(404, {"error": f"no GET {self.path}"})
                    return
                self._answer(200, {"object": "list", "data": [{"object": "model", **e} for e in entries]})

            def do_POST(self) -> None:  # the name http.server calls
                self.rfile.read(int(self.headers["Content-Length"]))
                stand_in.requests.append(("POST", self.path, self.headers.get("Authorization")))
                self._answer(200, {"choices": [{"message": {"content": "B"}, "finish_reason": "stop"}],
                                   "usage": {"prompt_tokens": 1}})

            def log_message(self, *args) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.api_root = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def __enter__(self) -> ModelsStandIn:
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _checkpoint(folder: Path, weights: bytes) -> tuple[Path, str]:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text('{"model_type": "qwen3_vl"}')
    (folder / "model.safetensors").write_bytes(weights)
    return folder, content_hash(folder)


@pytest.fixture
def sft_and_base(tmp_path):
    return _checkpoint(tmp_path / "sft", b"sft weights"), _checkpoint(tmp_path / "base", b"base weights")


def test_a_served_name_carrying_the_sha_or_a_root_with_its_content_is_the_checkpoint(sft_and_base, tmp_path):
    (sft, sft_sha), (base, base_sha) = sft_and_base
    copy = tmp_path / "elsewhere" / "sft-copy"
    shutil.copytree(sft, copy)
    name = served_model_name("paravt-8b", sft_sha)
    assert name == f"paravt-8b-{sft_sha[:12]}"
    entries = [
        {"id": name, "root": "/models/on/another/host"},  # `paravt eval serve`: the name carries the sha
        {"id": "my-name", "root": str(copy)},  # vLLM's root: a copy elsewhere, same content
        {"id": str(sft), "root": str(sft)},  # vLLM or SGLang without --served-model-name: the folder itself
    ]
    with ModelsStandIn(entries) as server:
        for entry in entries:
            served = check_served_model(server.api_root, entry["id"], sft, sft_sha, api_key="secret")
            assert served.id == entry["id"]
        assert check_served_model(server.api_root, None, sft, sft_sha).id == name  # rollouts name no model
    assert {auth for _, _, auth in server.requests[:3]} == {"Bearer secret"}


def test_the_base_model_served_for_the_sft_one_is_refused_naming_both(sft_and_base):
    (sft, sft_sha), (base, base_sha) = sft_and_base
    base_name = served_model_name("paravt-8b", base_sha)
    with ModelsStandIn([{"id": base_name, "root": str(base)}]) as server:
        with pytest.raises(ServedModelMismatch) as refused:
            check_served_model(server.api_root, base_name, sft, sft_sha)
        message = str(refused.value)
        assert f"serves '{base_name}' (root '{base}'), which is not {sft} (sha256 {sft_sha[:12]})" in message
        assert f"paravt eval serve --model {sft}" in message
        with pytest.raises(ServedModelMismatch, match=r"not the model name 'paravt-8b-sft' the requests would send"):
            check_served_model(server.api_root, "paravt-8b-sft", sft, sft_sha)
        # SGLang answers root = its served name: an arbitrary name says nothing about the weights.
    with ModelsStandIn([{"id": "paravt-8b", "root": "paravt-8b"}]) as server:
        with pytest.raises(ServedModelMismatch, match="neither its served name nor its root carries the sha256"):
            check_served_model(server.api_root, "paravt-8b", sft, sft_sha)


def test_a_server_that_cannot_say_what_it_serves_is_refused(sft_and_base):
    (sft, sft_sha), _ = sft_and_base
    with ModelsStandIn(None) as server:
        with pytest.raises(ServedModelMismatch, match=r"cannot tell which model .* GET .*/v1/models gave HTTP 404"):
            check_served_model(server.api_root, None, sft, sft_sha)
        api_root = server.api_root
    with pytest.raises(ServedModelMismatch, match="cannot tell which model"):  # nothing listens any more
        check_served_model(api_root, None, sft, sft_sha, timeout_s=2)


def test_the_openai_evaluator_refuses_another_model_before_its_first_request(sft_and_base, tmp_path):
    from paravt_core.config import load_config
    from paravt_core.eval.evaluator import EvalError
    from paravt_core.eval.stage import open_runner
    from paravt_core.refs import ArtifactRef

    (sft, sft_sha), (base, base_sha) = sft_and_base
    base_name = served_model_name("paravt", base_sha)
    with ModelsStandIn([{"id": base_name, "root": str(base)}]) as server:
        cfg = load_config(REPO / "conf/pipeline/tiny.yaml", [
            f"run.output_dir={tmp_path / 'out'}", "eval.engine=openai", f"eval.endpoint={server.api_root}",
            f"eval.served_model_name={base_name}"])
        model = ArtifactRef(kind="model", path=sft, sha256=sft_sha)
        expected = (f"eval.engine=openai: the server at {re.escape(server.api_root)} serves '{base_name}' .*which is "
                    f"not {re.escape(f'{sft} (sha256 {sft_sha[:12]})')}")
        with pytest.raises(EvalError, match=expected):
            open_runner(cfg, model)
    assert [method for method, _, _ in server.requests] == ["GET"]  # no chat request reached it


def test_rl_rollouts_on_a_server_serving_another_checkpoint_stop_before_any_request(sft_and_base, tmp_path):
    from paravt_core.config import load_config
    from paravt_core.rl.rollout_engine import build_rollout_engine

    (sft, sft_sha), (base, base_sha) = sft_and_base
    with ModelsStandIn([{"id": str(base), "root": str(base)}]) as server:  # `vllm serve <base folder>`
        url = server.api_root.removesuffix("/v1")
        for engine in ("vllm", "sglang"):
            cfg = load_config(REPO / "conf/pipeline/tiny.yaml", [f"rl.rollout.engine={engine}",
                                                                 f"rl.rollout.{engine}.url={url}"])
            with pytest.raises(ServedModelMismatch, match=re.escape(
                    f"rl.rollout: the server at {url}/v1 serves '{base}' (root '{base}'), which is not {sft} "
                    f"(sha256 {sft_sha[:12]})")):
                build_rollout_engine(cfg, sft, None, "cpu", 0, 1, tmp_path / "weights", sft_sha)
    assert [path for _, path, _ in server.requests] == ["/v1/models", "/v1/models"]  # no /health, no generate
