"""What a flow run in this process has produced so far, and whether its Prefect API still answers.

`paravt run` and `paravt reproduce` run their flow in-process against Prefect's ephemeral API
server (a subprocess). Measured with Prefect 3.8.8: when that server dies mid-run, the tasks
go on (their state changes are events, sent from a background thread), but the flow's final
state cannot be written, so the flow call raises after retrying (2 + 4 + 8 + 16 + 32 s per
request with the default five retries, several requests) and its return value, the run's
summary, is lost; then the process spends 7 s per undelivered event at exit (9.5 min for a
tiny pipeline). The flows record their results here as they go, so the CLI can still print
them (flows/cli.py), and `api_gone` tells a dead API from any other failure.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class RunProgress:
    stages: dict[str, str] = field(default_factory=dict)  # stage -> where its output lies, in order
    outputs: Any = None  # the flow's return value, set just before it returns

    def stage(self, name: str, where: Any) -> None:
        self.stages[name] = str(where)

    def finish(self, outputs: Any) -> Any:
        self.outputs = outputs
        return outputs

    def reset(self) -> None:
        self.stages.clear()
        self.outputs = None


PROGRESS = RunProgress()  # the flow run of this process (each flow resets it as it starts)


def api_gone(timeout_s: float = 3.0) -> bool:
    """True when the Prefect API this process used is known to be gone: its ephemeral server
    process has exited (`SubprocessASGIServer`, Prefect 3's own; tests/integration/
    test_cli_dead_api.py fails if that changes), or the API does not answer /health within
    `timeout_s`. False when no ephemeral server was ever started: the failure is then about
    starting one, and its own message says more."""
    import httpx
    from prefect.settings import PREFECT_API_URL

    url = PREFECT_API_URL.value()
    if not url:
        from prefect.server.api.server import SubprocessASGIServer

        server = SubprocessASGIServer._instances.get(None)
        if server is None or server.server_process is None:
            return False
        if server.server_process.poll() is not None:
            return True
        url = server.api_url
    try:
        return httpx.get(f"{url.rstrip('/')}/health", timeout=timeout_s).status_code != 200
    except httpx.HTTPError:
        return True
