"""Which checkpoint a running server serves: checked before the first request (issue #48).

A chat-completions or rollout request names no weights, so a server started on another
checkpoint (the base model where the SFT one was meant, a previous run's) answers every
request with status 200 and the wrong model's text. `check_served_model` asks the server
what it serves (`GET /v1/models`, which vLLM and SGLang both answer with each model's `id`,
the served name, and `root`) and accepts only when one of them names the checkpoint:

- the served name (or root) carries the checkpoint's sha256[:12], as `served_model_name`
  makes it (`paravt eval serve` serves under that name);
- or the id or root is a local folder with the checkpoint's content (`refs.content_hash`):
  vLLM's root is the folder it loaded (its id too, unless `--served-model-name`), SGLang's
  root is its served name, which defaults to the folder. The checkpoint's own folder is
  taken as is, since its sha256 was computed from that folder; any other folder is hashed.

Otherwise it refuses with both names and how to serve the checkpoint. What it can not see:
weights loaded into the server after it started (a rollout server's `reload_weights`), so
RL rollouts also probe the served log-probabilities after pushing the policy
(`rl/served_policy.py`).

Used by the `openai` evaluator (`eval/stage.py`) and the rollout servers
(`rl/rollout_engine.py`); it takes an API root, a name and a checkpoint, so an evaluation
that starts its own server per checkpoint can call it too.
"""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from paravt_core.refs import content_hash


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


def served_models(api_root: str, *, api_key: str | None = None, timeout_s: float = 30.0) -> list[ServedModel]:
    """What the server at `api_root` (e.g. "http://127.0.0.1:30000/v1") says it serves.

    Raises:
        ServedModelMismatch: no answer, or one without a model list.
    """
    url = api_root.rstrip("/") + "/models"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout_s) as response:
            data = json.loads(response.read())
        entries = data["data"]
        return [ServedModel(str(entry["id"]), str(entry["root"]) if entry.get("root") else None) for entry in entries]
    except urllib.error.HTTPError as error:
        reason = f"HTTP {error.code}"
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError) as error:
        reason = str(getattr(error, "reason", error))
    except http.client.HTTPException as error:  # e.g. BadStatusLine: something that does not speak HTTP
        reason = f"no HTTP answer ({type(error).__name__}: {str(error)[:200]})"
    except (ValueError, KeyError, TypeError, AttributeError) as error:  # JSON (also not UTF-8), its shape
        reason = f"an answer without a model list ({type(error).__name__}: {str(error)[:200]})"
    raise ServerUnanswered(f"cannot tell which model the server at {api_root} serves: GET {url} gave {reason}; "
                              "serve the checkpoint with vLLM or SGLang (`paravt eval serve --model ...`)")


def _names_checkpoint(served: ServedModel, checkpoint: Path, sha256: str, hashes: dict[Path, str]) -> bool:
    names = [n for n in (served.id, served.root) if n]
    if any(sha256[:12] in name for name in names):
        return True
    for name in names:
        folder = Path(name).expanduser()
        if not folder.is_dir():
            continue
        folder = folder.resolve()
        if folder == checkpoint.resolve():
            return True
        if folder not in hashes:
            hashes[folder] = content_hash(folder)
        if hashes[folder] == sha256:
            return True
    return False


def check_served_model(api_root: str, name: str | None, checkpoint: str | Path, sha256: str, *,
                       api_key: str | None = None, timeout_s: float = 30.0) -> ServedModel:
    """The entry of `GET /v1/models` that serves `checkpoint` (module docstring).

    Args:
        api_root: the server's OpenAI API root, e.g. "http://127.0.0.1:30000/v1".
        name: the model name requests will send; None (token-id rollouts send none): any
            entry may match.
        checkpoint: the checkpoint folder meant; `sha256` its content hash.

    Raises:
        ServedModelMismatch: nothing served is the checkpoint; the message names what is
            served, what was meant, and how to serve it.
    """
    checkpoint = Path(checkpoint)
    listed = served_models(api_root, api_key=api_key, timeout_s=timeout_s)
    meant = f"{checkpoint} (sha256 {sha256[:12]})"
    shown = ", ".join(f"{m.id!r} (root {m.root!r})" for m in listed) or "nothing"
    candidates = [m for m in listed if name is None or m.id == name]
    if not candidates:
        raise ServedModelMismatch(f"the server at {api_root} serves {shown}, not the model name {name!r} the "
                                  f"requests would send for {meant}; set the served name it prints, or serve the "
                                  f"checkpoint with `paravt eval serve --model {checkpoint}`")
    hashes: dict[Path, str] = {}
    for served in candidates:
        if _names_checkpoint(served, checkpoint, sha256, hashes):
            return served
    raise ServedModelMismatch(
        f"the server at {api_root} serves {shown}, which is not {meant}: neither its served name nor its root "
        f"carries the sha256 {sha256[:12]} or is a folder with that content. Serve the checkpoint with "
        f"`paravt eval serve --model {checkpoint}` (it serves it as <registered name>-{sha256[:12]}), or start the "
        "server on the checkpoint's folder")
