"""The UI screenshots of docs/dashboard.md, retaken over a demo's runs folder (after `make demo`).

    .venv/bin/python scripts/screenshots.py [RUNS_DIR (runs/demo)] [OUT_DIR (docs/img)]     # or: make screenshots

Starts `dagster-webserver` on a free 127.0.0.1 port over $DAGSTER_HOME (default .dagster_home, the instance
`make demo` and `make ui` use) with the demo's own profile (RUNS_DIR/profile.yaml, as `make ui` loads it), and
`tensorboard` over RUNS_DIR/checkpoints, then takes headless screenshots with Debian's `chromium`
(`apt-get install chromium`; CHROMIUM names another binary): the asset graph upstream of the dashboard, the
dashboard's per-iteration rows, the reward gate's asset check, and the checkpoints' loss curves. Each PNG is
cropped and reduced to a palette (a few 10 KB). A runs folder whose dashboard was never materialized (a demo
older than the one that does it) gets it materialized first. Both servers are stopped at the end.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from PIL import Image, ImageChops

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
LATEST = """query ($partition: String!) { assetOrError(assetKey: {path: ["flywheel_summary"]}) {
  ... on Asset { assetMaterializations(partitions: [$partition], limit: 1) { runId } } } }"""
LOCATION = "{ workspaceOrError { ... on Workspace { locationEntries { name loadStatus } } } }"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def graphql(port: int, query: str, variables: dict | None = None) -> dict:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/graphql", method="POST",
                                 data=json.dumps({"query": query, "variables": variables or {}}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        return json.loads(resp.read())["data"]


def wait_for(what: str, ready, proc: subprocess.Popen, log: Path, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if ready():
                return
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            sys.exit(f"screenshots: {what} did not start; its log {log}:\n{log.read_text()[-3000:]}")
        time.sleep(2)


def shot(chromium: str, url: str, out: Path, size: tuple[int, int], profile_dir: Path,
         crop: tuple[float, float, float, float] = (0, 0, 1, 1)) -> None:
    """A headless screenshot of `url` at `size`, cropped to the fractions `crop` (left, top, right, bottom),
    trimmed of the blank margin below and right, and saved as a 256-colour PNG."""
    raw = out.with_suffix(".raw.png")
    subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars",
                    f"--user-data-dir={profile_dir}", f"--window-size={size[0]},{size[1]}",
                    "--virtual-time-budget=30000", f"--screenshot={raw}", url],
                   check=True, timeout=300, capture_output=True)
    img = Image.open(raw).convert("RGB")
    w, h = img.size
    img = img.crop((int(crop[0] * w), int(crop[1] * h), int(crop[2] * w), int(crop[3] * h)))
    box = ImageChops.difference(img, Image.new("RGB", img.size, img.getpixel((img.width - 1, img.height - 1))))
    if (bbox := box.getbbox()) is not None:  # the blank margin past the content goes
        img = img.crop((0, 0, min(bbox[2] + 16, img.width), min(bbox[3] + 16, img.height)))
    img.quantize(colors=256, method=Image.Quantize.MEDIANCUT).save(out, optimize=True)
    raw.unlink()
    print(f"{out} ({out.stat().st_size // 1024} KB)")


def main() -> int:
    runs = Path(sys.argv[1] if len(sys.argv) > 1 else "runs/demo").absolute()
    out = Path(sys.argv[2] if len(sys.argv) > 2 else "docs/img").absolute()
    chromium = os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if not chromium:
        sys.exit("screenshots: no chromium: apt-get install chromium (or set CHROMIUM to a Chromium binary)")
    profile = runs / "profile.yaml"
    if not profile.is_file():
        sys.exit(f"screenshots: no {profile}: `make demo` writes it beside the demo's store (flywheel.duckdb)")
    sys.path.insert(0, str(REPO))
    from flywheel.profile import load_profile

    benchmark = load_profile(profile).benchmarks[0]
    env = {**os.environ, "FLYWHEEL_PROFILE": str(profile),
           "DAGSTER_HOME": os.environ.get("DAGSTER_HOME", str(REPO / ".dagster_home")),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    Path(env["DAGSTER_HOME"]).mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="flywheel-shots-"))
    ui, tb = free_port(), free_port()
    procs = [subprocess.Popen([str(BIN / "dagster-webserver"), "-h", "127.0.0.1", "-p", str(ui), "-w", "workspace.yaml"],
                              cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=(tmp / "webserver.log").open("w"),
                              start_new_session=True),
             subprocess.Popen([str(BIN / "tensorboard"), "--logdir", str(runs / "checkpoints"), "--host", "127.0.0.1",
                               "--port", str(tb)], cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                              stderr=(tmp / "tensorboard.log").open("w"), start_new_session=True)]
    try:
        def loaded() -> bool:
            entries = graphql(ui, LOCATION)["workspaceOrError"]["locationEntries"]
            return bool(entries) and all(e["loadStatus"] == "LOADED" for e in entries)

        wait_for("dagster-webserver", loaded, procs[0], tmp / "webserver.log")
        graphql(ui, "mutation { setNuxSeen }")  # no "join the community" dialog over the first page
        if not graphql(ui, LATEST, {"partition": benchmark})["assetOrError"].get("assetMaterializations"):
            subprocess.run([str(BIN / "dagster"), "asset", "materialize", "-m", "flywheel.definitions",
                            "--select", "flywheel_summary", "--partition", benchmark], cwd=REPO, env=env, check=True,
                           capture_output=True)
        base = f"http://127.0.0.1:{ui}"
        chrome = tmp / "chrome"
        shot(chromium, f"{base}/assets/sft_checkpoint?view=lineage&lineageScope=neighbors&lineageDepth=6",
             out / "asset_graph.png", (1600, 800), chrome, crop=(0.14, 0, 1, 1))
        # The table is wide (15 columns): a wide window shows every column; the crop keeps the metadata panel.
        shot(chromium, f"{base}/assets/flywheel_summary?view=events&partition={benchmark}", out / "dashboard_rows.png",
             (3400, 1100), chrome, crop=(0.305, 0.165, 1, 1))
        shot(chromium, f"{base}/assets/gated_dataset?view=checks", out / "gate_check.png", (1600, 720), chrome,
             crop=(0.14, 0, 1, 1))
        wait_for("tensorboard", lambda: urllib.request.urlopen(f"http://127.0.0.1:{tb}/", timeout=10).status == 200,
                 procs[1], tmp / "tensorboard.log")
        shot(chromium, f"http://127.0.0.1:{tb}/#scalars&_smoothingWeight=0&tagFilter=train%2Floss%24",
             out / "loss_curves.png", (1400, 490), chrome)
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            p.wait(timeout=60)
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
