"""Which checkpoint a running server serves: checked before the first request (issues #48, #61).

A chat-completions or rollout request names no weights, so a server started on another
checkpoint (the base model where the SFT one was meant, a previous run's) answers every
request with status 200 and the wrong model's text. `check_served_model` asks the server
what it serves (`GET /v1/models`, which vLLM and SGLang both answer with each model's `id`,
the served name, and `root`) and accepts an entry by what it is, not what it is called:

- when its root (or id) is a folder on this machine (vLLM's root is the folder it loaded),
  that folder decides, whatever the name says (issue #61 item 1: a name carrying the SFT
  model's sha12 with the base model's folder as root was taken). It is the checkpoint when
  it is the checkpoint's folder, or a model folder (config.json and weights) with the same
  config.json and the same weight files: linked to the checkpoint's (the pixel-bounded copy
  `served_folder` makes), or of equal size and sha256 (the checkpoint's manifest, else its
  files hashed). Its other files (processor config, chat template) may differ: the
  rendering check holds those to the configuration. A folder that is not a model folder
  (`/usr`, `/`) or whose weights differ in size is refused before anything is hashed, and
  hashing stops at a deadline (issue #61 item 8);
- otherwise (SGLang's root is its served name; a server on another machine) the served name
  must carry the checkpoint's sha256[:12], as `served_model_name` makes it; the evaluation
  then also holds the served log-probabilities of a fixed prompt to the local model's
  (`agent.policy_probe`), so a wrong model fails however it is named.

Every request of the check ends by its deadline, however slowly the server answers (issue
#61 item 7: a model list dripping one byte a second); a long model list is shown by its
first entries only.

Otherwise it refuses with both names and how to serve the checkpoint. What it can not see:
weights loaded into the server after it started (a rollout server's `reload_weights`), so
RL rollouts also probe the served log-probabilities after pushing the policy
(`rl/served_policy.py`).

Used by the `openai` evaluator (`eval/stage.py`) and the rollout servers
(`rl/rollout_engine.py`); it takes an API root, a name and a checkpoint, so an evaluation
that starts its own server per checkpoint can call it too.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import socket
import threading
import time
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from paravt_core.config import VideoConfig
from paravt_core.model.integrity import MANIFEST, ModelFolderError, weight_files
from paravt_core.model.loading import PROCESSOR_FILES, pixel_bounded_folder

MAX_REPLY_BYTES = 64 * 2**20  # a model list of 64 MB is no server's; stop reading there
SHOWN_ENTRIES = 5  # a refusal shows this many of the listed models, then how many more
HASH_DEADLINE_S = 900.0  # comparing a copy of the 8B model (16 GB) at ~80 MB/s takes ~200 s


class ServedModelMismatch(RuntimeError):
    """The server serves another model than the checkpoint meant, or cannot say which."""


class ServerUnanswered(ServedModelMismatch):
    """The server gave no model list: no answer in time, refused, not HTTP, not JSON. The
    server's fault, not the request's (the evaluation exits 1 for it, 2 for a mismatch)."""


@dataclass(frozen=True)
class ServedModel:
    """One entry of `GET /v1/models`: the served name and the model it was loaded from."""

    id: str
    root: str | None = None


def served_model_name(registered_name: str, sha256: str) -> str:
    """The name `paravt eval serve` serves a checkpoint under: it carries the sha256[:12]."""
    return f"{registered_name}-{sha256[:12]}"


def served_folder(checkpoint: str | Path, video: VideoConfig, work_dir: str | Path) -> Path:
    """The folder a server launched by the pipeline serves for `checkpoint`: the checkpoint
    itself when its processor config has `video`'s pixel bounds (every export writes them),
    else `<work_dir>/served-model`, the same weights linked with the bounds written into its
    processor config (`model.loading.pixel_bounded_folder`). A downloaded base model's
    processor (Qwen3-VL: at least 65,536 pixels a frame) would upscale the frames SPEC §3
    caps at 50,176 pixels, so the server would see other pixels and more image tokens than
    the trainer and the protocol (issue #60 finding 2). Used by the RL rollout servers and
    the evaluation's own server, base model included. A folder with no processor config is
    served as it is: there is nothing to rewrite, and the rendering check refuses a server
    that cannot render frames as the configuration says."""
    if not any((Path(checkpoint) / name).is_file() for name in PROCESSOR_FILES):
        return Path(checkpoint)
    return pixel_bounded_folder(checkpoint, video, Path(work_dir) / "served-model")


def request_json(url: str, *, payload: Mapping[str, Any] | None = None, api_key: str | None = None,
                 deadline_s: float = 30.0) -> Any:
    """The JSON body of a 200 answer to GET `url` (POST with `payload`), all of it (connect,
    headers, body) within `deadline_s`: a server that answers a byte at a time fails at the
    deadline, not when it stops (the socket timeout alone bounds each read, not the answer).

    Raises:
        ServerUnanswered: no whole answer in time, not HTTP, not 200, not JSON, or over
            `MAX_REPLY_BYTES`; the message says which.
    """
    parts = urllib.parse.urlsplit(url)
    connection_type = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    connection = connection_type(parts.hostname or "127.0.0.1", parts.port, timeout=deadline_s)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    body = None
    if payload is not None:
        body, headers["Content-Type"] = json.dumps(payload).encode(), "application/json"
    target = parts.path + (f"?{parts.query}" if parts.query else "")
    outcome: dict[str, Any] = {}

    def ask() -> None:
        try:
            connection.request("POST" if body is not None else "GET", target, body=body, headers=headers)
            response = connection.getresponse()
            outcome["answer"] = (response.status, response.read(MAX_REPLY_BYTES + 1))
        except BaseException as error:  # handed to the caller's thread below
            outcome["error"] = error

    asking = threading.Thread(target=ask, name="paravt-served-model-check", daemon=True)
    asking.start()
    asking.join(deadline_s)
    if asking.is_alive():
        _hang_up(connection)
        raise ServerUnanswered(f"timed out: no whole answer within {deadline_s:g} s")
    connection.close()
    if "error" in outcome:
        error = outcome["error"]
        if isinstance(error, http.client.HTTPException):  # e.g. BadStatusLine: something that does not speak HTTP
            raise ServerUnanswered(f"no HTTP answer ({type(error).__name__}: {str(error)[:200]})")
        if isinstance(error, OSError):
            raise ServerUnanswered(str(getattr(error, "reason", None) or error))
        raise error
    status, raw = outcome["answer"]
    if status != 200:
        raise ServerUnanswered(f"HTTP {status}")
    if len(raw) > MAX_REPLY_BYTES:
        raise ServerUnanswered(f"an answer over {MAX_REPLY_BYTES // 2**20} MB")
    try:
        return json.loads(raw)
    except ValueError as error:  # not JSON, or not UTF-8
        raise ServerUnanswered(f"an answer that is not JSON ({type(error).__name__}: {str(error)[:200]})") from None


def _hang_up(connection: http.client.HTTPConnection) -> None:
    """End a request still in flight: its thread's blocked read returns once the socket is shut."""
    sock = connection.sock
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
    connection.close()


def served_models(api_root: str, *, api_key: str | None = None, timeout_s: float = 30.0) -> list[ServedModel]:
    """What the server at `api_root` (e.g. "http://127.0.0.1:30000/v1") says it serves; the
    whole answer within `timeout_s`.

    Raises:
        ServerUnanswered: no answer in time, or one without a model list.
    """
    url = api_root.rstrip("/") + "/models"
    try:
        data = request_json(url, api_key=api_key, deadline_s=timeout_s)
        try:
            return [ServedModel(str(entry["id"]), str(entry["root"]) if entry.get("root") else None)
                    for entry in data["data"]]
        except (KeyError, TypeError, AttributeError) as error:  # JSON of another shape
            raise ServerUnanswered(f"an answer without a model list ({type(error).__name__}: "
                                   f"{str(error)[:200]})") from None
    except ServerUnanswered as error:
        reason = str(error)
    raise ServerUnanswered(f"cannot tell which model the server at {api_root} serves: GET {url} gave {reason}; "
                           "serve the checkpoint with vLLM or SGLang (`paravt eval serve --model ...`)")


def _local_folder(name: str) -> Path | None:
    """`name` as a path on this machine when it is one (absolute, existing), else None: a
    served name, or a folder on the server's machine, says nothing checkable here."""
    path = Path(name).expanduser()
    return path if path.is_absolute() and path.exists() else None


def _hash_by(path: Path, deadline: float) -> str:
    """sha256 of `path`, or `TimeoutError` once `deadline` (time.monotonic) passes."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            if time.monotonic() > deadline:
                raise TimeoutError
            digest.update(chunk)
    return digest.hexdigest()


def _recorded_sha256(checkpoint: Path) -> dict[str, str]:
    """The checkpoint's weight file hashes from its manifest (`model.integrity`), where it has one."""
    try:
        return {name: entry["sha256"] for name, entry in
                json.loads((checkpoint / MANIFEST).read_text())["weights"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


def folder_difference(folder: Path, checkpoint: Path, deadline: float) -> str | None:
    """Why the model folder `folder` is not `checkpoint` by content (module docstring), or
    None when it is. Cheap refusals come first: not a model folder, other weight files or
    sizes; only then are weights hashed, and never past `deadline` (time.monotonic)."""
    if folder.resolve() == checkpoint.resolve():
        return None
    if not folder.is_dir() or not (folder / "config.json").is_file():
        return f"{folder} is not a model folder (no config.json)"
    try:
        theirs = {f.name: f for f in weight_files(folder)}
    except ModelFolderError:
        return f"{folder} is not a model folder (no model.safetensors or shard index)"
    ours = {f.name: f for f in weight_files(checkpoint)}
    if sorted(theirs) != sorted(ours):
        return f"{folder} holds other weight files ({', '.join(sorted(theirs))[:200]}) than {checkpoint}"
    try:
        if (folder / "config.json").read_bytes() != (checkpoint / "config.json").read_bytes():
            return f"{folder}/config.json differs from {checkpoint}/config.json"
        sizes = {name: (theirs[name].stat().st_size, ours[name].stat().st_size) for name in ours}
    except OSError as error:
        return f"{folder} cannot be read ({error})"
    for name, (their_size, our_size) in sizes.items():
        if their_size != our_size:
            return f"{folder}/{name} is {their_size} bytes, the checkpoint's {our_size}"
    recorded = _recorded_sha256(checkpoint)
    for name in sorted(ours):
        if theirs[name].resolve() == ours[name].resolve():
            continue  # a link to the checkpoint's own file (`served_folder`'s copy)
        try:
            if _hash_by(theirs[name], deadline) != (recorded.get(name) or _hash_by(ours[name], deadline)):
                return f"{folder}/{name} has other content (sha256) than the checkpoint's"
        except TimeoutError:
            return f"{folder}'s weights could not be compared with the checkpoint's before the deadline"
        except OSError as error:
            return f"{folder}/{name} cannot be read ({error})"
    return None


def _serves(served: ServedModel, checkpoint: Path, sha256: str, deadline: float) -> str | None:
    """Why `served` is not `checkpoint` (module docstring), or None when it is."""
    names = [n for n in (served.root, served.id) if n]
    folders = [folder for folder in map(_local_folder, names) if folder is not None]
    if folders:  # a folder on this machine: its content decides, whatever the names carry
        problems = [folder_difference(folder, checkpoint, deadline) for folder in folders]
        return None if None in problems else "; ".join(p for p in problems if p)
    if any(sha256[:12] in name for name in names):
        return None
    return f"neither its served name nor its root carries the sha256 {sha256[:12]} or is a folder with that content"


def _listing(listed: list[ServedModel]) -> str:
    """The listed models for a message: the first `SHOWN_ENTRIES`, then how many more."""
    if not listed:
        return "nothing"
    shown = ", ".join(f"{m.id[:200]!r} (root {m.root[:200] if m.root else None!r})" for m in listed[:SHOWN_ENTRIES])
    more = len(listed) - SHOWN_ENTRIES
    return shown + (f" and {more} more models" if more > 0 else "")


def check_served_model(api_root: str, name: str | None, checkpoint: str | Path, sha256: str, *,
                       api_key: str | None = None, timeout_s: float = 30.0,
                       hash_deadline_s: float = HASH_DEADLINE_S) -> ServedModel:
    """The entry of `GET /v1/models` that serves `checkpoint` (module docstring).

    Args:
        api_root: the server's OpenAI API root, e.g. "http://127.0.0.1:30000/v1".
        name: the model name requests will send; None (token-id rollouts send none): any
            entry may match.
        checkpoint: the checkpoint folder meant; `sha256` its content hash.
        timeout_s: the deadline of the model list's whole answer.
        hash_deadline_s: the deadline of comparing a served folder's weights by content.

    Raises:
        ServedModelMismatch: nothing served is the checkpoint; the message names what is
            served, what was meant, and how to serve it.
    """
    checkpoint = Path(checkpoint)
    listed = served_models(api_root, api_key=api_key, timeout_s=timeout_s)
    meant = f"{checkpoint} (sha256 {sha256[:12]})"
    candidates = [m for m in listed if name is None or m.id == name]
    if not candidates:
        raise ServedModelMismatch(f"the server at {api_root} serves {_listing(listed)}, not the model name {name!r} "
                                  f"the requests would send for {meant}; set the served name it prints, or serve the "
                                  f"checkpoint with `paravt eval serve --model {checkpoint}`")
    deadline = time.monotonic() + hash_deadline_s
    problems = []
    for served in candidates[:SHOWN_ENTRIES]:
        problem = _serves(served, checkpoint, sha256, deadline)
        if problem is None:
            return served
        problems.append(problem)
    raise ServedModelMismatch(
        f"the server at {api_root} serves {_listing(candidates)}, which is not {meant}: {'; '.join(problems)[:1000]}. "
        f"Serve the checkpoint with `paravt eval serve --model {checkpoint}` (it serves it as <registered "
        f"name>-{sha256[:12]}), or start the server on the checkpoint's folder")
