"""The MLflow UI, looked at in a real browser: a smoke sweep writes a store, ``mlflow
server`` serves it on 127.0.0.1, and headless Chromium (Debian's package, installed by
env/browser.sh) checks what a person opening the sweep would see: the parent run with
its trials nested under it, the report and plots among the parent run's artifacts, and a
plot that actually renders. Twice: on the sweep's sqlite store, and on a team store
(sweeps/driver/ops/team_store.py: PostgreSQL, served artifacts, basic auth: the browser sends
the login as an Authorization header), written by the same command.

    .venv/bin/python -m pytest -q tests/test_mlflow_ui.py
    # and rewrite the README's screenshot, docs/mlflow-ui-parent-run.png:
    ACCELSWEEP_UPDATE_SCREENSHOT=1 .venv/bin/python -m pytest -q tests/test_mlflow_ui.py

Skipped, with the reason, only where Chromium cannot be had (no apt-get, not root).
"""

from __future__ import annotations

import base64
import io
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from accelsweep.sweeps.driver.reporting.report_artifacts import PLOTS_DIR, REPORT_FILES
from tests.browser import REPO, Chromium, find_chromium
from tests.conftest import ACCELSWEEP
from tests.mlflow_server import MlflowServer
from tests.team_store_fixture import store  # noqa: F401 - a team store, started only for its params

pytestmark = pytest.mark.slow

EXPERIMENT = "X"  # the shared main job's (tests/conftest.py)
# What a training sweep logs on its parent run (sweeps/driver/reporting/report_artifacts.py), relative
# to the run's artifact root; the browser must list each of them, and whatever else the
# store holds there. PLOT_TO_RENDER is opened and looked at.
TRAINING_PLOTS = ("tradeoff.png", "progress.png", "importance.png", "parallel.png", "curves.png", "utilisation.png")
PARENT_RUN_ARTIFACTS = (*REPORT_FILES, *(f"{PLOTS_DIR}/{name}" for name in TRAINING_PLOTS))
PLOT_TO_RENDER = f"{PLOTS_DIR}/progress.png"  # drawn from the trials alone: tradeoff.png needs a price
SCREENSHOT = REPO / "docs" / "mlflow-ui-parent-run.png"
UPDATE_SCREENSHOT = os.environ.get("ACCELSWEEP_UPDATE_SCREENSHOT") == "1"
# MLflow 3's UI opens an experiment on its GenAI pages (traces) unless told this is model
# training; a person clicks "Model training" once, the test says it in the URL.
MODEL_TRAINING = "workflowType=machine_learning"


@pytest.fixture(scope="module")
def chromium():
    """The browser first: where it cannot be had, skip before spending a sweep."""
    binary, reason = find_chromium()
    if binary is None:
        pytest.skip(f"no headless browser: {reason}")
    return binary


@dataclass(frozen=True)
class Served:
    """An MLflow server with a sweep's record: its base URL, the URI a client reads the
    record through, and the headers the browser must send (basic auth, on a team store)."""
    uri: str
    client_uri: str
    headers: dict


# The same checks against the two servers a person opens: `mlflow server` on the sweep's
# sqlite store, and a team store's (sweeps/driver/ops/team_store.py: PostgreSQL, served
# artifacts, basic auth), written by the same command with --tracking-uri http://...
@pytest.fixture(scope="module", params=["sqlite", "team-store"])
def served(request, chromium, tmp_path_factory):
    if request.param == "sqlite":
        yield from _sqlite_server(request.getfixturevalue("main_job"), tmp_path_factory)
    else:
        yield _team_store_with_the_main_job(request, tmp_path_factory)


def _sqlite_server(main_job, tmp_path_factory):
    """The shared run of the main job (tests/conftest.py) served by ``mlflow server`` on a
    free port of 127.0.0.1. The browser is found first: where it cannot be had, no sweep
    is waited for."""
    store = main_job.folder / "m.db"
    server = MlflowServer(tmp_path_factory.mktemp("ui-server"), f"sqlite:///{store}")
    try:
        yield Served(server.start().uri, f"sqlite:///{store}", {})
    finally:
        server.stop()


def _team_store_with_the_main_job(request, tmp_path_factory) -> Served:
    """The main job's command, run against a team store (its module-scoped ``store``,
    which logs this process in): the server's URL and its login as a header."""
    if not (shutil.which("initdb") or os.path.isdir("/usr/lib/postgresql")):
        pytest.skip("PostgreSQL's server programs are not installed here (apt install postgresql)")
    store = request.getfixturevalue("store")
    shared_ray = request.getfixturevalue("shared_ray")
    folder = tmp_path_factory.mktemp("team-store-sweep")
    env = {**os.environ, "PGPASSFILE": store.credentials}
    done = subprocess.run([ACCELSWEEP, "run", "neuron_vit", "--smoke", "--num-samples", "4",
                           "--tracking-uri", store.tracking_uri, "--study-storage", store.study_storage,
                           "--storage-path", str(folder / "ray"), "--price-per-hour", "0.357",
                           "--experiment", EXPERIMENT, *shared_ray.flags], cwd=folder, env=env, capture_output=True,
                          text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    login = base64.b64encode(":".join(store.mlflow_login()).encode()).decode()
    return Served(store.tracking_uri, store.tracking_uri, {"Authorization": f"Basic {login}"})


@dataclass
class SweepRuns:
    """What the store holds, read with the MLflow client: what the browser must show."""
    client: Any
    experiment_id: str
    parent: Any
    trials: list
    parent_artifacts: set[str]  # paths relative to the run's artifact root, plots/ opened


@pytest.fixture(scope="module")
def sweep_runs(served) -> SweepRuns:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(served.client_uri)
    experiment = client.get_experiment_by_name(EXPERIMENT)
    assert experiment is not None, f"the sweep made no experiment {EXPERIMENT!r}"
    runs = client.search_runs([experiment.experiment_id], max_results=1000)
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert len(parents) == 1, [r.info.run_name for r in parents]
    parent = parents[0]
    trials = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert len(trials) >= 2, f"the smoke sweep logged {len(trials)} trial run(s)"
    artifacts = {a.path for a in client.list_artifacts(parent.info.run_id)}
    artifacts |= {a.path for a in client.list_artifacts(parent.info.run_id, PLOTS_DIR)}
    return SweepRuns(client, experiment.experiment_id, parent, trials, artifacts)


@pytest.fixture(scope="module")
def mlflow_ui(served):
    """The server's base URL."""
    return served.uri


@pytest.fixture(scope="module")
def page(chromium, served, tmp_path_factory):
    with Chromium.start(tmp_path_factory.mktemp("ui-browser"), binary=chromium) as tab:
        if served.headers:  # every request of the page, its scripts' fetches included, logs in
            tab.call("Network.enable")
            tab.call("Network.setExtraHTTPHeaders", headers=served.headers)
        yield tab


def js(value) -> str:
    """A Python string as a JavaScript literal."""
    return json.dumps(value)


def open_page(page, url: str) -> None:
    page.navigate(url)
    page.wait_for("document.readyState === 'complete'", what=f"{url} to load")
    # The assistant panel opens by itself on a first visit and covers a third of the page.
    page.evaluate("document.querySelector('[data-component-id=\"mlflow.assistant.chat_panel.close\"]')"
                  "?.click(), true")


def run_link(run_id: str) -> str:
    return f"a[href$={js('/runs/' + run_id)}]"


@pytest.mark.slow
def test_the_experiment_page_lists_the_parent_run_with_its_trials_nested(page, mlflow_ui, sweep_runs):
    parent, trials = sweep_runs.parent, sweep_runs.trials
    open_page(page, f"{mlflow_ui}/#/experiments/{sweep_runs.experiment_id}/runs?{MODEL_TRAINING}")
    shown = page.wait_for(f"document.querySelector({js(run_link(parent.info.run_id))})?.textContent",
                          timeout_s=120, what=f"the parent run {parent.info.run_name}")
    assert shown == parent.info.run_name
    assert re.fullmatch(rf"neuron_vit-\d{{8}}-\d{{6}}", shown), shown

    trial_links = js([run_link(t.info.run_id) for t in trials])
    visible_trials = f"{trial_links}.filter(s => document.querySelector(s)).length"
    # Nested, not flat: the trials are hidden under the parent's row until it is expanded.
    assert page.evaluate(visible_trials) == 0, "trial runs are listed beside the parent, not under it"
    page.evaluate(f"document.querySelector({js(run_link(parent.info.run_id))})"
                  ".closest('.ag-cell-value').querySelector('button').click(), true")
    page.wait_for(f"{visible_trials} === {len(trials)}", what=f"all {len(trials)} trial runs under the parent")
    names = page.evaluate(f"{trial_links}.map(s => document.querySelector(s).textContent)")
    assert sorted(names) == sorted(t.info.run_name for t in trials)


def tree_node(name: str) -> str:
    return f"document.querySelector('[data-testid=artifact-tree-node][artifact-name={js(name)}]')"


@pytest.mark.slow
def test_the_parent_run_artifacts_show_the_report_and_a_plot_that_renders(page, mlflow_ui, sweep_runs, served,
                                                                          tmp_path):
    parent, stored = sweep_runs.parent, sweep_runs.parent_artifacts
    missing = sorted(set(PARENT_RUN_ARTIFACTS) - stored)
    assert not missing, f"the sweep logged no {missing} on its parent run (it has {sorted(stored)})"

    open_page(page, f"{mlflow_ui}/#/experiments/{sweep_runs.experiment_id}/runs/{parent.info.run_id}"
                    f"/artifacts?{MODEL_TRAINING}")
    top_level = sorted({path.split("/")[0] for path in stored})
    for name in top_level:
        page.wait_for(f"!!{tree_node(name)}", timeout_s=120, what=f"{name} in the parent run's artifacts")
    page.evaluate(f"{tree_node(PLOTS_DIR)}.click(), true")
    for path in sorted(p for p in stored if p.startswith(f"{PLOTS_DIR}/")):
        page.wait_for(f"!!{tree_node(Path(path).name)}", what=f"{path} in the opened plots folder")

    page.evaluate(f"{tree_node(Path(PLOT_TO_RENDER).name)}.click(), true")
    # The preview is an <img> of the artifact fetched from the server; the one laid out
    # on the page (the other is an empty lightbox).
    shown_img = ("[...document.images].find(i => i.complete && i.naturalWidth > 0"
                 " && i.getBoundingClientRect().width > 0)")
    page.wait_for(f"!!{shown_img}", what=f"{PLOT_TO_RENDER} rendered as an image")
    img = page.evaluate(f"(() => {{ const i = {shown_img}; const r = i.getBoundingClientRect(); return "
                        "{naturalWidth: i.naturalWidth, naturalHeight: i.naturalHeight, "
                        "x: r.x, y: r.y, width: r.width, height: r.height}; })()")

    from PIL import Image, ImageStat

    plot_file = Path(sweep_runs.client.download_artifacts(parent.info.run_id, PLOT_TO_RENDER, str(tmp_path)))
    with Image.open(plot_file) as original:
        assert (img["naturalWidth"], img["naturalHeight"]) == original.size, "the browser shows another image"

    shot = Image.open(io.BytesIO(page.screenshot(clip={k: img[k] for k in ("x", "y", "width", "height")})))
    gray = shot.convert("L")
    low, high = gray.getextrema()
    assert high - low > 64 and ImageStat.Stat(gray).stddev[0] > 5, (
        f"the plot's area of the page is blank: grey levels {low}..{high}, "
        f"stddev {ImageStat.Stat(gray).stddev[0]:.1f}")

    if UPDATE_SCREENSHOT and served.client_uri.startswith("sqlite"):  # the README's: a newcomer's store
        SCREENSHOT.parent.mkdir(exist_ok=True)
        SCREENSHOT.write_bytes(page.screenshot())


def test_a_browser_that_cannot_start_leaves_no_folder_behind(tmp_path, monkeypatch):
    """Chromium.start's scratch folder (its TMPDIR) and log are undone when the browser's
    binary is missing, as when it stops."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where mkdtemp makes the scratch folder
    with pytest.raises(FileNotFoundError):
        with Chromium.start(tmp_path / "work", binary=str(tmp_path / "no-chromium")):
            pass
    assert not list(tmp_path.glob("asw-chromium-*"))
