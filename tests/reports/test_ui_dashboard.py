"""The dashboard as a person sees it: the real webserver on 127.0.0.1 serves flywheel_summary's table and chart.

Slow: materializes a tiny WebShop partition (tiny model: bootstrap, SFT k=0, evaluation, then the summary)
into a DAGSTER_HOME instance configured by the repository's dagster.yaml, starts `dagster-webserver`
on a free 127.0.0.1 port over the same instance, and reads the asset's metadata back through GraphQL
(what the asset page renders). With Debian's `chromium` installed it also screenshots the asset page.
"""

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import dagster as dg
import pytest

from flywheel.definitions import build_defs
from flywheel.orchestration.partitions import partition_key
from flywheel.policy.models import build_tiny_model
from tests.ui_support import MODEL_ENV, ROOT_ENV, ui_resources

REPO = Path(__file__).resolve().parents[2]
BENCH = "webshop"
QUERY = """
query Summary($partition: String!) {
  assetOrError(assetKey: {path: ["flywheel_summary"]}) {
    __typename
    ... on Asset {
      assetMaterializations(partitions: [$partition], limit: 1) {
        partition
        metadataEntries {
          label
          __typename
          ... on TableMetadataEntry { table { records schema { columns { name type } } } }
          ... on MarkdownMetadataEntry { mdStr }
          ... on PathMetadataEntry { path }
          ... on FloatMetadataEntry { floatValue }
        }
      }
    }
  }
}
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def graphql(port: int, query: str, variables: dict) -> dict:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/graphql", method="POST",
                                 data=json.dumps({"query": query, "variables": variables}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        body = json.loads(resp.read())
    assert "errors" not in body, body
    return body["data"]


def materialize(home: Path, root: Path, tiny: str) -> None:
    defs = build_defs(ui_resources(root, tiny))
    with dg.DagsterInstance.from_config(str(home)) as instance:
        assert defs.resolve_job_def("bootstrap_job").execute_in_process(partition_key=BENCH, instance=instance).success
        it0 = defs.resolve_job_def("iteration_job").execute_in_process(
            partition_key=str(partition_key(BENCH, 0)), instance=instance,
            asset_selection=[dg.AssetKey("sft_checkpoint"), dg.AssetKey("evaluation")])
        assert it0.success
        assert defs.resolve_job_def("summary_job").execute_in_process(partition_key=BENCH, instance=instance).success


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_webserver_serves_the_summary_table_and_chart(tmp_path, monkeypatch):
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(REPO / "dagster.yaml", home / "dagster.yaml")
    tiny = str(build_tiny_model(tmp_path / "tiny", vocab_size=512))
    root = tmp_path / "runs"
    materialize(home, root, tiny)

    port = free_port()
    env = {**os.environ, "DAGSTER_HOME": str(home), ROOT_ENV: str(root), MODEL_ENV: tiny}
    server = subprocess.Popen(
        [str(Path(sys.executable).parent / "dagster-webserver"), "-h", "127.0.0.1", "-p", str(port),
         "-m", "tests.ui_support", "-a", "defs"],
        cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=(tmp_path / "webserver.log").open("w"),
        start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while True:
            try:
                data = graphql(port, QUERY, {"partition": BENCH})
                if data["assetOrError"]["__typename"] == "Asset":
                    break
            except (OSError, AssertionError):
                pass
            assert server.poll() is None, (tmp_path / "webserver.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "webserver did not load the code location in time"
            time.sleep(2)
        [mat] = data["assetOrError"]["assetMaterializations"]
        entries = {e["label"]: e for e in mat["metadataEntries"]}
        table = entries["summary"]["table"]
        columns = [c["name"] for c in table["schema"]["columns"]]
        assert columns[:2] == ["k", "unseen_success_pct"] and "unseen_ci95_pct" in columns and "gated_total" in columns
        [row] = [json.loads(r) for r in table["records"]]
        assert row["k"] == 0 and row["unseen_successes_n"].endswith("/3") and row["unseen_ci95_pct"].startswith("[")
        assert entries["chart"]["mdStr"].startswith("![webshop: success by iteration](data:image/png;base64,")
        chart = Path(entries["chart_path"]["path"])
        assert chart.is_file() and chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert entries["latest_unseen_success_pct"]["floatValue"] == row["unseen_success_pct"]

        chromium = shutil.which("chromium") or shutil.which("chromium-browser")
        if chromium:  # the page itself, as a browser renders it
            # The first visit of an instance opens Dagster's "Join the community" dialog over the page;
            # mark it seen (the UI's own mutation) so the screenshot shows the asset.
            assert graphql(port, "mutation { setNuxSeen }", {})["setNuxSeen"] is True
            shot = tmp_path / "asset_page.png"
            subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                            "--disable-component-update", "--disable-sync", "--no-first-run",
                            f"--user-data-dir={tmp_path / 'chrome'}", f"--screenshot={shot}", "--window-size=1400,1000",
                            "--virtual-time-budget=20000",
                            f"http://127.0.0.1:{port}/assets/flywheel_summary?partition={BENCH}"],
                           check=True, timeout=180, capture_output=True)
            assert shot.stat().st_size > 10_000
            if os.environ.get("FLYWHEEL_UI_SCREENSHOT"):
                shutil.copy(shot, os.environ["FLYWHEEL_UI_SCREENSHOT"])
    finally:
        os.killpg(server.pid, 15)
        server.wait(timeout=60)
