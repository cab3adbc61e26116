"""The Prefect settings tests/conftest.py fixes for every test session and the servers it starts."""

from __future__ import annotations


def test_test_servers_skip_registering_block_types():
    """No flow of the project saves a block; registering Prefect's block types was a fifth of each
    test server's start-up CPU (docs/speed.md, `make test`). The server process reads it from the
    environment it inherits."""
    import os

    from prefect.settings import PREFECT_API_BLOCKS_REGISTER_ON_START

    assert os.environ["PREFECT_API_BLOCKS_REGISTER_ON_START"] == "false"
    assert PREFECT_API_BLOCKS_REGISTER_ON_START.value() is False
