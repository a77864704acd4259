"""The real service (gunicorn, SQLite in a temp dir) and its report pages in headless Chromium (Selenium).

Screenshots go to ``test-artifacts/`` at the repository root. Needs Debian's ``chromium`` and
``chromium-driver`` (``scripts/system-deps.sh``); skipped with a message when they are not installed.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO, example_scenario

pytestmark = pytest.mark.browser

ARTIFACTS = REPO / "test-artifacts"
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1400,1000",
)
STARTUP_TIMEOUT_S = 90
WINDOW_WIDTH_PX = 1400
MAX_SCREENSHOT_HEIGHT_PX = 9000


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _request(url: str, body: dict | None = None) -> tuple[int, dict]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def _wait_until_healthy(base_url: str, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(
                f"the service exited with {proc.returncode}:\n{log.read_text(errors='replace')[-4000:]}"
            )
        try:
            if _request(f"{base_url}/v1/health")[0] == 200:
                return
        except (urllib.error.URLError, ConnectionError, OSError, json.JSONDecodeError):
            pass
        time.sleep(0.5)
    pytest.fail(
        f"the service did not become healthy in {STARTUP_TIMEOUT_S} s:\n"
        + log.read_text(errors="replace")[-4000:]
    )


@pytest.fixture(scope="module")
def service(tmp_path_factory) -> Iterator[str]:
    """gunicorn serving ``advisor:create_app()`` on a free localhost port with a fresh SQLite database."""
    instance = tmp_path_factory.mktemp("browser-instance")
    port = _free_port()
    env = {
        **os.environ,
        "SPECADVISOR_INSTANCE": str(instance),
        "DATABASE_URL": f"sqlite:///{instance / 'advisor.db'}",
        "REDIS_URL": "",
    }
    log = instance / "service.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gunicorn",
                "--bind",
                f"127.0.0.1:{port}",
                "--workers",
                "1",
                "--timeout",
                "120",
                "advisor:create_app()",
            ],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    base_url = f"http://127.0.0.1:{port}"
    try:
        _wait_until_healthy(base_url, proc, log)
        yield base_url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver_path = shutil.which("chromedriver")
    if not chromium or not driver_path:
        pytest.skip(
            "Chromium and its driver are not installed: apt-get install -y chromium chromium-driver "
            "(or run scripts/system-deps.sh as root)"
        )
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(executable_path=driver_path))
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


def _screenshot(driver, name: str) -> Path:
    """A full-page screenshot in test-artifacts/ (the window grows to the page's height)."""
    ARTIFACTS.mkdir(exist_ok=True)
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(WINDOW_WIDTH_PX, min(int(height) + 120, MAX_SCREENSHOT_HEIGHT_PX))
    path = ARTIFACTS / f"{name}.png"
    assert driver.save_screenshot(str(path)), path
    assert path.stat().st_size > 10_000
    return path


def _assert_plots_render(driver, expected: int) -> None:
    from selenium.webdriver.common.by import By

    svgs = driver.find_elements(By.CSS_SELECTOR, "svg.plot")
    assert len(svgs) == expected
    for svg in svgs:
        assert svg.is_displayed()
        assert svg.size["width"] > 100 and svg.size["height"] > 50, svg.size
        assert svg.find_elements(By.CSS_SELECTOR, "path, text")  # drawn content, not an empty box


def _assert_no_console_errors(driver) -> None:
    errors = [entry for entry in driver.get_log("browser") if entry.get("level") == "SEVERE"]
    assert not errors, errors  # e.g. a blocked external resource or a failed load


def test_report_and_comparison_in_chromium(service, browser):
    from selenium.webdriver.common.by import By

    status, answer = _request(f"{service}/v1/recommendations", example_scenario())
    assert status == 201, answer
    status, other = _request(f"{service}/v1/recommendations", example_scenario(gpu="H200-SXM"))
    assert status == 201, other

    browser.set_window_size(WINDOW_WIDTH_PX, 1000)
    browser.get(f"{service}/v1/recommendations/{answer['id']}/report")
    assert browser.find_element(By.ID, "decision").text == answer["decision"].upper()
    assert browser.find_element(By.ID, "reasons").text.strip()
    _assert_plots_render(browser, 4)
    provenance = browser.find_element(By.ID, "provenance")
    assert provenance.is_displayed()
    rows = provenance.find_elements(By.CSS_SELECTOR, "tbody tr")
    assert len(rows) >= len(answer["provenance"])
    assert "speculative_config" in browser.find_element(By.ID, "vllm").text
    _assert_no_console_errors(browser)
    _screenshot(browser, "report")

    browser.set_window_size(WINDOW_WIDTH_PX, 1000)
    browser.get(f"{service}/v1/recommendations/compare/report?ids={answer['id']},{other['id']}")
    pills = [p.text for p in browser.find_elements(By.CSS_SELECTOR, "#comparison .pill")]
    assert pills == [answer["decision"].upper(), other["decision"].upper()]
    _assert_plots_render(browser, 2)
    assert "H200-SXM" in browser.find_element(By.ID, "comparison").text
    _assert_no_console_errors(browser)
    _screenshot(browser, "comparison")
