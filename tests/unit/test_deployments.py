"""Every deployment in prefect.yaml points at a flow that imports (a renamed flow fails here, not in `make serve`)."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOYMENTS = yaml.safe_load((REPO / "prefect.yaml").read_text())["deployments"]


@pytest.mark.parametrize("deployment", DEPLOYMENTS, ids=[d["name"] for d in DEPLOYMENTS])
def test_entrypoint_is_a_flow(deployment):
    from prefect import Flow

    path, _, name = deployment["entrypoint"].partition(":")
    module = importlib.import_module(Path(path).with_suffix("").as_posix().replace("/", "."))
    assert isinstance(getattr(module, name), Flow)


def test_reproduce_is_deployed():
    assert any(d["name"] == "reproduce" and d["entrypoint"] == "flows/reproduce.py:reproduce" for d in DEPLOYMENTS)
