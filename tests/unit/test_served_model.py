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

    def __init__(self, entries: list[dict] | None, post=None):
        """`post(path, body)`: the JSON answer to a POST (default: a chat completion)."""
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
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                stand_in.requests.append(("POST", self.path, self.headers.get("Authorization")))
                if post is not None:
                    self._answer(200, post(self.path, body))
                    return
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


# --- issue #61: identity by content, not by name; every request bounded -------------------


def test_a_name_carrying_the_sha_is_refused_when_its_root_is_another_models_folder(sft_and_base, tmp_path):
    """Issue #61 item 1: the name carries the SFT model's sha12, `root` the base model's folder."""
    (sft, sft_sha), (base, _) = sft_and_base
    name = served_model_name("paravt-8b", sft_sha)
    with ModelsStandIn([{"id": name, "root": str(base)}]) as server:
        with pytest.raises(ServedModelMismatch, match=re.escape(f"{base}/model.safetensors is 12 bytes, the "
                                                                 "checkpoint's 11")):
            check_served_model(server.api_root, name, sft, sft_sha)
    # a folder of the same size and other bytes is refused by sha256; other config by its bytes
    same_size = _checkpoint(tmp_path / "same-size", b"SFT weights")
    other_config = tmp_path / "other-config"
    shutil.copytree(sft, other_config)
    (other_config / "config.json").write_text('{"model_type": "qwen2_vl"}')
    for folder, why in ((same_size[0], "has other content (sha256)"), (other_config, "config.json differs")):
        with ModelsStandIn([{"id": name, "root": str(folder)}]) as server:
            with pytest.raises(ServedModelMismatch, match=re.escape(why)):
                check_served_model(server.api_root, name, sft, sft_sha)


def test_the_bounded_copy_the_pipeline_serves_is_the_checkpoint_by_its_linked_weights(sft_and_base, tmp_path):
    """The pixel-bounded copy (`served_folder`): other processor bytes, the checkpoint's own
    config and weights linked; taken without hashing anything."""
    from paravt_core.agent import served_model

    (sft, sft_sha), _ = sft_and_base
    copy = tmp_path / "served-model"
    copy.mkdir()
    for f in ("config.json", "model.safetensors"):
        (copy / f).symlink_to(sft / f)
    (copy / "preprocessor_config.json").write_text('{"size": {"shortest_edge": 784, "longest_edge": 50176}}')
    with ModelsStandIn([{"id": "any-name", "root": str(copy)}]) as server, pytest.MonkeyPatch.context() as patch:
        patch.setattr(served_model, "_hash_by", _never_hashed)
        assert check_served_model(server.api_root, "any-name", sft, sft_sha).root == str(copy)


def _never_hashed(*args, **kwargs):
    raise AssertionError("hashed")


@pytest.mark.parametrize("root", ["/usr", "/"])
def test_a_root_that_is_no_model_folder_is_refused_before_anything_is_hashed(sft_and_base, tmp_path, monkeypatch,
                                                                              root):
    """Issue #61 item 8: /usr was content-hashed (69 s for 5.3 GB) before the refusal; / the whole disk."""
    import time

    from paravt_core.agent import served_model

    (sft, sft_sha), _ = sft_and_base
    monkeypatch.setattr(served_model, "_hash_by", _never_hashed)  # the one way the check hashes a file
    # a folder that looks like a model but whose weights are far larger: refused by size
    big = tmp_path / "big"
    big.mkdir()
    (big / "config.json").write_text('{"model_type": "qwen3_vl"}')
    with open(big / "model.safetensors", "wb") as f:
        f.truncate(2**30)  # sparse
    with ModelsStandIn([{"id": "m", "root": root}, {"id": "big", "root": str(big)}]) as server:
        started = time.monotonic()
        with pytest.raises(ServedModelMismatch, match=re.escape(f"{root} is not a model folder (no config.json)")):
            check_served_model(server.api_root, "m", sft, sft_sha)
        with pytest.raises(ServedModelMismatch, match=re.escape(f"{big}/model.safetensors is {2**30} bytes")):
            check_served_model(server.api_root, "big", sft, sft_sha)
        assert time.monotonic() - started < 5


def test_comparing_weights_by_content_stops_at_its_deadline(sft_and_base, tmp_path):
    (sft, sft_sha), _ = sft_and_base
    copy = tmp_path / "copy"
    shutil.copytree(sft, copy)
    with ModelsStandIn([{"id": "m", "root": str(copy)}]) as server:
        assert check_served_model(server.api_root, "m", sft, sft_sha).root == str(copy)  # same content: taken
        with pytest.raises(ServedModelMismatch, match="could not be compared with the checkpoint's before the "
                                                      "deadline"):
            check_served_model(server.api_root, "m", sft, sft_sha, hash_deadline_s=-1)


class DripServer:
    """Answers every connection with `head` at once, then `body` one byte every `every_s`."""

    def __init__(self, head: bytes, body: bytes, every_s: float):
        import socket

        self.listener = socket.create_server(("127.0.0.1", 0))
        self.api_root = f"http://127.0.0.1:{self.listener.getsockname()[1]}/v1"
        self.head, self.body, self.every_s = head, body, every_s
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        import time

        while True:
            try:
                connection, _ = self.listener.accept()
            except OSError:
                return
            with connection:
                try:
                    connection.recv(65536)
                    connection.sendall(self.head)
                    for byte in self.body:
                        time.sleep(self.every_s)
                        connection.sendall(bytes([byte]))
                except OSError:
                    pass

    def close(self) -> None:
        self.listener.close()


@pytest.mark.parametrize("where", ["body", "headers"])
def test_a_model_list_dripping_a_byte_at_a_time_fails_at_the_deadline(sft_and_base, where):
    """Issue #61 item 7: the 3 s socket timeout bounded each read, not the answer."""
    import time

    (sft, sft_sha), _ = sft_and_base
    listing = json.dumps({"data": [{"id": "m", "root": None}]}).encode()
    if where == "body":
        server = DripServer(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(listing), listing, 0.2)
    else:
        server = DripServer(b"HTTP/1.1 200 OK\r\n", b"X-Slow: " + b"a" * 200 + b"\r\n\r\n" + listing, 0.2)
    try:
        started = time.monotonic()
        with pytest.raises(ServedModelMismatch,
                           match=r"cannot tell which model .* gave timed out: no whole answer within 1\.5 s"):
            check_served_model(server.api_root, "m", sft, sft_sha, timeout_s=1.5)
        assert time.monotonic() - started < 4  # the drip lasts 6 s (body) or 48 s (headers)
    finally:
        server.close()


def test_a_list_of_500000_models_gives_a_short_message(sft_and_base):
    """Round 4 partial: the refusal listed every entry (11 MB)."""
    (sft, sft_sha), _ = sft_and_base
    entries = [{"id": f"model-{i}", "root": f"/nowhere/{i}"} for i in range(500_000)]
    with ModelsStandIn(entries) as server:
        with pytest.raises(ServedModelMismatch) as refused:
            check_served_model(server.api_root, "absent", sft, sft_sha, timeout_s=60)
        with pytest.raises(ServedModelMismatch) as no_sha:
            check_served_model(server.api_root, None, sft, sft_sha, timeout_s=60)
    for message in (str(refused.value), str(no_sha.value)):
        assert len(message) < 3000, len(message)
        assert "'model-0' (root '/nowhere/0')" in message and "and 499995 more models" in message


# --- the evaluation: log-probabilities and rendering held to the checkpoint and the config --


def served_as(model_dir: Path, prompt_tokens: int):
    """A POST answer as a server on `model_dir` gives it: /v1/completions with the sampled
    tokens' log-probabilities under `model_dir`'s weights (vLLM's fields, token ids
    returned), chat completions with `prompt_tokens` as the rendered prompt's count."""
    from paravt_core.agent.policy_probe import PolicyProbe, trainer_logprobs
    from paravt_core.model.loading import load_model

    model = load_model(model_dir).eval()

    def answer(path: str, body: dict) -> dict:
        if path.endswith("/chat/completions"):
            return {"choices": [{"message": {"content": "B"}, "finish_reason": "length"}],
                    "usage": {"prompt_tokens": prompt_tokens}}
        sampled = [11, 12, 13, 14]
        logprobs = trainer_logprobs(model, PolicyProbe(list(body["prompt"]), sampled, []), body["temperature"], "cpu")
        return {"choices": [{"index": 0, "text": "", "token_ids": sampled, "finish_reason": "length",
                             "logprobs": {"tokens": [f"token_id:{t}" for t in sampled],
                                          "token_logprobs": logprobs.tolist()}}]}

    return answer


def _eval_config(api_root: str, name: str, tmp_path: Path):
    from paravt_core.config import load_config

    return load_config(REPO / "conf/pipeline/tiny.yaml", [
        f"run.output_dir={tmp_path / 'out'}", "eval.engine=openai", f"eval.endpoint={api_root}",
        f"eval.served_model_name={name}"])


def test_the_evaluation_refuses_a_server_whose_log_probs_are_another_models_however_named(tiny_model_dir,
                                                                                          tiny_processor, tmp_path):
    """Issue #61 item 1: a root that is not a folder here (another machine, SGLang's name) is
    taken on the name; the log-probability probe then tells the weights apart."""
    from paravt_core.eval.evaluator import EvalError
    from paravt_core.eval.openai_engine import rendered_probe
    from paravt_core.eval.stage import check_serves_weights, open_runner
    from paravt_core.model.tiny import TinyModelSpec, build_tiny_model
    from paravt_core.refs import ArtifactRef

    sha = content_hash(tiny_model_dir)
    model = ArtifactRef(kind="model", path=tiny_model_dir, sha256=sha)
    name = served_model_name("paravt", sha)
    entry = [{"id": name, "root": "/models/on/another/host"}]
    bounded = len(rendered_probe(tiny_processor, True, (784, 12288))[0])  # tiny.yaml's video bounds
    other = build_tiny_model(TinyModelSpec(seed=1), tmp_path / "other")  # same shapes, other weights
    with ModelsStandIn(entry, served_as(other, bounded)) as server:
        cfg = _eval_config(server.api_root, name, tmp_path)
        with pytest.raises(EvalError, match=rf"does not serve the weights of {re.escape(str(tiny_model_dir))}: its "
                                            r"log-probabilities of a fixed probe differ .* by [0-9.]+ nats per token"):
            open_runner(cfg, model)
    assert [path for _, path, _ in server.requests] == ["/v1/models", "/v1/completions"]  # no chat request
    with ModelsStandIn(entry, served_as(tiny_model_dir, bounded)) as server:
        cfg = _eval_config(server.api_root, name, tmp_path)
        from paravt_core.eval.stage import _openai_client

        assert check_serves_weights(_openai_client(model, cfg.eval), model, tiny_processor.tokenizer, cfg) < 1e-5
        assert open_runner(cfg, model) is not None
    assert [path for _, path, _ in server.requests][-1] == "/v1/chat/completions"  # the rendering check ran


def test_the_evaluation_holds_the_server_to_the_configs_pixel_bounds_not_its_processors(tiny_model_dir,
                                                                                       tiny_processor, tmp_path):
    """Issue #60 finding 2: a server on the base model's own folder renders frames with its
    processor's bounds (the tiny kit keeps Qwen3-VL's: at least 65,536 pixels), upscaling the
    probe's 6,144-pixel frames; held to that same processor, the check passed."""
    from paravt_core.agent.served_model import served_folder
    from paravt_core.eval.evaluator import EvalError
    from paravt_core.eval.openai_engine import rendered_probe
    from paravt_core.eval.stage import open_runner
    from paravt_core.model.loading import load_processor
    from paravt_core.refs import ArtifactRef

    sha = content_hash(tiny_model_dir)
    model = ArtifactRef(kind="model", path=tiny_model_dir, sha256=sha)
    name = served_model_name("paravt", sha)
    entry = [{"id": name, "root": "/models/on/another/host"}]
    as_downloaded = len(rendered_probe(tiny_processor, True)[0])  # the server's own processor config
    bounded_dir = served_folder(tiny_model_dir, _eval_config("http://x/v1", name, tmp_path).video, tmp_path / "w")
    as_bounded = len(rendered_probe(load_processor(bounded_dir), True)[0])
    assert bounded_dir != tiny_model_dir and as_downloaded > as_bounded  # the kit reproduces the upscale
    with ModelsStandIn(entry, served_as(tiny_model_dir, as_downloaded)) as server:
        with pytest.raises(EvalError, match=rf"renders the probe messages into {as_downloaded} prompt tokens, our "
                                            rf"rendering into {as_bounded}"):
            open_runner(_eval_config(server.api_root, name, tmp_path), model)
    with ModelsStandIn(entry, served_as(tiny_model_dir, as_bounded)) as server:
        assert open_runner(_eval_config(server.api_root, name, tmp_path), model) is not None
