"""Debian's Chromium, headless, driven by its chromedriver (``.ci/run`` installs both): the
Studio's tests click through real pages served by the real web server."""

from __future__ import annotations

import re
import shutil
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from selenium import webdriver
from selenium.common.exceptions import TimeoutException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from tests.harness import tls

# Screenshots of the pages the tests saw (ignored by git): look at them when a test fails.
SCREENSHOTS = Path(__file__).resolve().parent.parent / "artifacts" / "studio"
PASSWORD = "pw"  # the password of the users the Studio tests make


@contextmanager
def chromium_driver() -> Iterator[WebDriver]:
    browser, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if browser is None or driver is None:
        raise AssertionError("the Studio tests need Debian's chromium and chromium-driver (.ci/run: ensure_chromium)")
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for argument in (
        "--headless=new",
        "--no-sandbox",  # CI runs as root, where Chromium's sandbox cannot start
        "--disable-dev-shm-usage",  # a container's /dev/shm is often too small for it
        "--no-proxy-server",  # loopback only
        "--disable-background-networking",  # this machine's network is closed: no calls home
        "--window-size=1280,900",
        # The test web servers serve HTTPS with the session's certificate (tests.harness.tls): the
        # browser accepts exactly its key, as a user who imported the CA would see the pages.
        f"--ignore-certificate-errors-spki-list={tls.spki_pin()}",
    ):
        options.add_argument(argument)
    # The console is readable (driver.get_log("browser")): Content-Security-Policy refusals show there.
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    chrome = webdriver.Chrome(options=options, service=Service(executable_path=driver))
    # Every document records the policy's refusals before any of its scripts runs (a script
    # the DevTools protocol adds is not subject to the page's policy): see csp_violations().
    chrome.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": _CSP_WATCH})
    try:
        yield chrome
    finally:
        chrome.quit()


_CSP_WATCH = """
window.__cspViolations = [];
document.addEventListener("securitypolicyviolation", (e) => window.__cspViolations.push(
  `${e.effectiveDirective} refused ${e.blockedURI || "(inline)"}`
  + ` at ${e.sourceFile || location.pathname}:${e.lineNumber}` + (e.sample ? ` (${e.sample})` : "")
));
"""


def csp_violations(driver: WebDriver) -> list[str]:
    """What the page's Content-Security-Policy refused since the page loaded (its
    ``securitypolicyviolation`` events), and the console's CSP messages since the last call."""
    seen = [str(v) for v in driver.execute_script("return window.__cspViolations || []") or []]
    entries = driver.get_log("browser")  # type: ignore[attr-defined]  # Chromium's driver has it; the base type not
    logged = [str(entry.get("message", "")) for entry in entries]
    return seen + [m for m in logged if "Content Security Policy" in m or "Content-Security-Policy" in m]


_CLICK = "const e = document.querySelector(arguments[0]); if (!e) return false; e.click(); return true;"


class Browser:
    """A person at the Studio: logs in through the form, clicks, waits for what the page shows."""

    def __init__(self, driver: WebDriver, base_url: str) -> None:
        self.driver = driver
        self.base_url = base_url

    def path(self) -> str:
        return urllib.parse.urlsplit(self.driver.current_url).path

    def open(self, path: str) -> None:
        self.driver.get(f"{self.base_url}{path}")

    def log_in(self, username: str, next_path: str) -> None:
        self.open(f"/login/?next={urllib.parse.quote(next_path)}")
        self.driver.find_element(By.ID, "id_username").send_keys(username)
        self.driver.find_element(By.ID, "id_password").send_keys(PASSWORD)
        self.driver.find_element(By.CSS_SELECTOR, "#login-form [type=submit]").click()
        self.wait(lambda: self.path() == next_path, f"to land on {next_path}")

    def wait(self, condition: Callable[[], Any], what: str, timeout: float = 20) -> Any:
        try:
            return WebDriverWait(self.driver, timeout, poll_frequency=0.05).until(lambda _: condition())
        except TimeoutException:
            raise AssertionError(f"timed out after {timeout}s waiting {what} on {self.driver.current_url}") from None

    # Read in one script, not element by element: the live pages swap fragments at any time,
    # and an element found before a swap is stale by the time it is read.

    def texts(self, css: str) -> list[str]:
        script = "return Array.from(document.querySelectorAll(arguments[0]), e => e.innerText)"
        return [str(text) for text in self.driver.execute_script(script, css) or []]

    def attributes(self, css: str, name: str) -> list[str]:
        script = "return Array.from(document.querySelectorAll(arguments[0]), e => e.getAttribute(arguments[1]))"
        return [str(value) for value in self.driver.execute_script(script, css, name) or []]

    def click(self, css: str) -> None:
        """Click it as a person would, found and clicked in one step (fragments may be swapped)."""
        self.wait(lambda: self.driver.execute_script(_CLICK, css), f"for {css} to click")

    def mark(self) -> None:
        """Mark the page: ``still_the_same_page()`` tells whether it was reloaded since."""
        self.driver.execute_script("window.__studioMark = 1")

    def still_the_same_page(self) -> bool:
        return bool(self.driver.execute_script("return window.__studioMark === 1"))

    def screenshot(self, name: str) -> Path:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        path = SCREENSHOTS / f"{re.sub(r'[^A-Za-z0-9_.-]+', '-', name)}.png"
        self.driver.save_screenshot(str(path))
        return path
