"""A real browser for the viewer's tests: Debian's chromium, driven by Selenium.

Nothing is downloaded: the browser and its driver come from the system (`apt install
chromium chromium-driver`), or from `$ARTSTORE_CHROMIUM` and `$ARTSTORE_CHROMEDRIVER`.
Screenshots go to `$ARTSTORE_SCREENSHOTS` when set (e.g. `docs/images` for docs/viewer.md),
else to a folder of the test session.
"""

from __future__ import annotations

import base64
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

HEADLESS_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1280,900",
    "--force-device-scale-factor=1",
    "--lang=en-US",
)


def _executable(variable: str, default: str) -> str:
    path = os.environ.get(variable) or shutil.which(default) or f"/usr/bin/{default}"
    if not Path(path).exists():
        pytest.fail(
            f"the viewer's tests need a real browser: install Debian's chromium and "
            f"chromium-driver, or point ${variable} at {default}"
        )
    return path


@contextmanager
def chromium() -> Iterator[Any]:
    """A headless Chromium with a fresh profile, closed (and its profile removed) after."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = _executable("ARTSTORE_CHROMIUM", "chromium")
    for flag in HEADLESS_FLAGS:
        options.add_argument(flag)
    profile = tempfile.mkdtemp(prefix="artstore-chromium-")
    options.add_argument(f"--user-data-dir={profile}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = Service(executable_path=_executable("ARTSTORE_CHROMEDRIVER", "chromedriver"))
    driver = webdriver.Chrome(service=service, options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def save_screenshot(driver: Any, folder: Path, name: str) -> Path:
    """The whole page (not only the window) as `folder/name.png`."""
    folder.mkdir(parents=True, exist_ok=True)
    shot = driver.execute_cdp_cmd(
        "Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True}
    )
    path = folder / f"{name}.png"
    path.write_bytes(base64.b64decode(shot["data"]))
    return path


def console_errors(driver: Any) -> list[str]:
    """What the page wrote to the console as errors since the last call (CSP refusals too)."""
    return [entry["message"] for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]
