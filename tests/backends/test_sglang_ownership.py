"""A run talks only to servers it owns (issue 23, items 1 and 2), against the session's REAL SGLang
server (``sglang_url``, conftest.py): no extra server is started here.

* its port given as ``rollout.sglang.port`` to a run that launches its own: refused, naming the
  port, before anything is started or written (before: the run trained against that server and
  pushed three weight updates into it, exit 0);
* a launched process that does not answer on its port while the real server does (what happens
  when a launched SGLang fails to bind): the identity check (the per-launch token in
  ``/server_info``) refuses it and stops the process. The launched process is a stand-in that
  never binds -- the one part a real SGLang cannot be made to do on demand;
* training with ``url`` pointing at it (not launched) is refused unless
  ``rollout.sglang.update_connected=true``; its weight version is unchanged throughout;
* every real server the tests launch (``start_real_server``) passes the same identity check.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from urllib.parse import urlparse

import httpx
import pytest

from srpo_graph.backends.sglang_server import SGLangServer, launch_ports
from srpo_graph.errors import BackendError, ConfigError

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.sglang


def _version(url: str) -> str | None:
    return httpx.get(f"{url}/model_info", timeout=30).json().get("weight_version")


def _config(run_dir: Path, *extra: str):
    from srpo_graph.train.config.loading import load_config

    return load_config(None, ["steps=2", f"run_dir={json.dumps(str(run_dir))}", "rollout.backend=sglang",
                              "rollout.tasks_per_step=2", "rollout.samples=2", "eval.every=0",
                              "logging.tensorboard=false", "logging.progress=false", "logging.plots=false", *extra])


def test_the_port_of_another_server_is_refused_naming_it(sglang_url, tmp_path):
    from srpo_graph.train.trainer import train

    port = urlparse(sglang_url).port
    before = _version(sglang_url)
    with pytest.raises(ConfigError, match=f"port {port} on 127.0.0.1 is already in use"):
        launch_ports(port, 1)
    cfg = _config(tmp_path / "run", "rollout.sglang.launch=cpu", f"rollout.sglang.port={port}")
    with pytest.raises(ConfigError, match=f"port {port} on 127.0.0.1 is already in use"):
        train(ROOT / "workflows" / "coord_seq.wf", cfg)
    assert _version(sglang_url) == before
    assert not (tmp_path / "run" / "weights").exists()
    assert len(set(launch_ports(None, 3))) == 3  # unset: free ports, each different


def test_a_launched_server_that_is_not_the_one_answering_is_refused(sglang_url, tmp_path):
    port = urlparse(sglang_url).port
    stand_in = SGLangServer([sys.executable, "-c", "import time; time.sleep(120)"], port,
                            log_path=tmp_path / "mine.log")  # "launched", never binds: the real server answers
    stand_in.start()
    with pytest.raises(BackendError, match=f"not the one this run launched .*another process holds port {port}"):
        stand_in.wait_healthy(60)
    assert stand_in.proc is not None and stand_in.proc.poll() is not None  # stopped
    assert stand_in.token.startswith("srpo-graph-") and stand_in.token not in httpx.get(
        f"{sglang_url}/server_info", timeout=30).text


def test_the_session_server_passes_the_identity_check(sglang_url):
    """The fixture's server was launched through ``start_server`` -> ``wait_healthy``: its token is there."""
    import os

    if os.environ.get("SRPO_GRAPH_SGLANG_URL"):
        pytest.skip("SRPO_GRAPH_SGLANG_URL names a server this session did not launch")
    assert "srpo-graph-" in httpx.get(f"{sglang_url}/server_info", timeout=30).text


def test_training_never_writes_into_a_connected_server_unless_told(sglang_url, tmp_path):
    from srpo_graph.train.trainer import train

    before = _version(sglang_url)
    cfg = _config(tmp_path / "run", f"rollout.sglang.url={json.dumps(sglang_url)}")
    with pytest.raises(ConfigError, match="rollout.sglang.update_connected=true"):
        train(ROOT / "workflows" / "coord_seq.wf", cfg)
    assert _version(sglang_url) == before
