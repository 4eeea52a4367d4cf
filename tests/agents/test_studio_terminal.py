"""The Studio's terminal page (``agents/agent/<record id>/terminal/``): xterm.js in a real headless
Chromium, on real daphne, with a real agent process and a real shell on the other end."""

from __future__ import annotations

import re
import urllib.parse
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from django.test import Client
from selenium.common.exceptions import TimeoutException
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from apps.agents import services
from apps.records.choices import Phase
from apps.records.models import Event, Record
from tests import factories
from tests.agents.conftest import wait_phase
from tests.conftest import wait_for
from tests.harness.agents import AgentProcess
from tests.harness.browser import csp_violations
from tests.harness.web import WebServer

pytestmark = [pytest.mark.system, pytest.mark.django_db(transaction=True)]

Agents = Callable[..., tuple[Record, AgentProcess]]
PASSWORD = "pw"  # the test users'


def terminal_path(record: Record) -> str:
    return f"/agents/agent/{record.pk}/terminal/"


def change_path(record: Record) -> str:
    return f"/agents/agent/{record.pk}/change/"


def staff_user(django_user_model: Any, username: str, *roles: str, is_staff: bool = True) -> Any:
    """A Studio user with ``roles`` bound in the default namespace."""
    user = django_user_model.objects.create_user(username=username, password=PASSWORD, is_staff=is_staff)
    for role in roles:
        factories.bind(user, role)
    return user


class TerminalPage:
    """The terminal page in the browser: its status line and xterm.js's rendered rows."""

    def __init__(self, driver: WebDriver, web: WebServer) -> None:
        self.driver = driver
        self.web = web

    def log_in(self, username: str, next_path: str) -> None:
        """Through the Studio's login form, as a person does."""
        self.driver.get(f"{self.web.url}/login/?next={urllib.parse.quote(next_path)}")
        self.driver.find_element(By.ID, "id_username").send_keys(username)
        self.driver.find_element(By.ID, "id_password").send_keys(PASSWORD)
        self.driver.find_element(By.CSS_SELECTOR, "#login-form [type=submit]").click()
        self.wait(lambda: urllib.parse.urlsplit(self.driver.current_url).path == next_path, f"to land on {next_path}")

    def wait(self, condition: Callable[[], Any], what: str, timeout: float = 20) -> Any:
        try:
            return WebDriverWait(self.driver, timeout, poll_frequency=0.05).until(lambda _: condition())
        except TimeoutException:
            raise AssertionError(
                f"timed out after {timeout}s waiting {what}; status {self.status()!r}, the terminal shows:\n"
                + "\n".join(self.rows())
            ) from None

    def status(self) -> tuple[str, str]:
        found = self.driver.find_elements(By.ID, "terminal-status")
        if not found:
            return "", ""
        return str(found[0].get_attribute("data-state")), found[0].text

    def wait_state(self, state: str, timeout: float = 20) -> str:
        self.wait(lambda: self.status()[0] == state, f"for the state {state!r}", timeout)
        return self.status()[1]

    def rows(self) -> list[str]:
        """The rows xterm.js rendered (its DOM renderer draws a space as a no-break space)."""
        texts = self.driver.execute_script(
            "return Array.from(document.querySelectorAll('.xterm-rows > div'), row => row.textContent)"
        )
        return [str(text).replace("\xa0", " ").rstrip() for text in texts or []]

    def wait_row(self, pattern: str, timeout: float = 20) -> re.Match[str]:
        """The last rendered row that is ``pattern`` (whole), once one is."""

        def found() -> re.Match[str] | None:
            matches = [m for m in (re.fullmatch(pattern, row) for row in self.rows()) if m]
            return matches[-1] if matches else None

        match: re.Match[str] = self.wait(found, f"for a row {pattern!r}", timeout)
        return match

    def type(self, text: str) -> None:
        """Keys into xterm.js's input element, as typed on a keyboard."""
        self.driver.find_element(By.CSS_SELECTOR, ".xterm-helper-textarea").send_keys(text)


def terminal_events(record: Record, reason: str) -> list[Event]:
    return list(Event.objects.filter(record=record, reason=reason).order_by("id"))


def test_a_shell_in_the_browser_from_the_agents_page_to_its_exit(
    agents: Agents, web: WebServer, chromium: WebDriver, django_user_model: Any
) -> None:
    record, _ = agents("studio-term")
    staff_user(django_user_model, "ops", "admin")
    wait_phase(record, Phase.READY)
    page = TerminalPage(chromium, web)
    page.log_in("ops", change_path(record))

    chromium.find_element(By.CSS_SELECTOR, "a.agent-terminal-link").click()  # the agent's page links its terminal
    page.wait(lambda: urllib.parse.urlsplit(chromium.current_url).path == terminal_path(record), "for the page")
    assert "studio-term" in chromium.find_element(By.ID, "content").text
    opened = page.wait_state("opened")
    [event] = terminal_events(record, "TerminalOpened")
    assert event.actor is not None
    assert event.actor.username == "ops"
    assert f"(pid {event.data['pid']})" in opened, opened

    page.type("echo $((6*7))" + Keys.ENTER)
    page.wait_row("42")  # the typed line shows $((6*7)); only the shell's answer is 42 alone

    page.type("exit 3" + Keys.ENTER)
    assert page.wait_state("exited").startswith("exited with code 3"), page.status()
    assert chromium.find_element(By.ID, "terminal-reconnect").is_displayed()
    [closed] = wait_for(lambda: terminal_events(record, "TerminalClosed"), timeout=10, what="TerminalClosed")
    assert (closed.data["exit_code"], closed.data["user"]) == (3, "ops")
    assert closed.data["session"] == event.data["session"]

    chromium.find_element(By.ID, "terminal-reconnect").click()  # a new terminal, a new shell
    page.wait_state("opened")
    assert not chromium.find_element(By.ID, "terminal-reconnect").is_displayed()
    assert len(terminal_events(record, "TerminalOpened")) == 2
    # All of it under the page's Content-Security-Policy: scripts from the server's files only,
    # inline styles allowed (xterm.js's renderer writes its own), nothing refused.
    policy = chromium.execute_script("return fetch(location.href).then(r => r.headers.get('Content-Security-Policy'))")
    assert "script-src 'self';" in policy
    assert "style-src 'self' 'unsafe-inline';" in policy
    assert csp_violations(chromium) == []


def test_resizing_the_window_resizes_the_terminal_on_the_machine(
    agents: Agents, web: WebServer, chromium: WebDriver, django_user_model: Any
) -> None:
    record, _ = agents("studio-resize")
    staff_user(django_user_model, "ops", "admin")
    wait_phase(record, Phase.READY)
    page = TerminalPage(chromium, web)
    page.log_in("ops", terminal_path(record))
    page.wait_state("opened")

    page.type("echo size=$(stty size)" + Keys.ENTER)
    before = page.wait_row(r"size=(\d+) (\d+)")
    rows, cols = int(before[1]), int(before[2])
    # A layout that settles while the socket connects resizes the screen: the machine is told
    # once the terminal opens, before anything typed.
    assert rows == len(page.rows()), "the terminal on the machine has the size the page shows"

    # Above the admin's minimum width (980px), so that the width changes too.
    chromium.set_window_size(1100, 650)
    page.wait(lambda: len(page.rows()) < rows, "for the page to draw fewer rows")
    page.type("echo resized=$(stty size)" + Keys.ENTER)
    after = page.wait_row(r"resized=(\d+) (\d+)")
    assert int(after[1]) == len(page.rows()) < rows
    assert int(after[2]) < cols


@pytest.mark.django_db  # no server here: the test client, in a transaction rolled back
def test_without_the_permission_the_page_is_refused_and_not_linked(
    client: Client, django_user_model: Any, stand: Record
) -> None:
    record = services.agent_record_declare(owner=stand, name="guarded", labels={})
    events_before = Event.objects.filter(record=record).count()

    # A developer sees agents and runs commands on them, but may not open terminals.
    client.force_login(staff_user(django_user_model, "viewer", "developer"))
    assert client.get(terminal_path(record)).status_code == 403
    change = client.get(change_path(record))
    assert change.status_code == 200
    assert terminal_path(record) not in change.content.decode()
    listing = client.get("/agents/agent/")
    assert listing.status_code == 200
    assert "/terminal/" not in listing.content.decode()
    client.force_login(staff_user(django_user_model, "reader", "viewer"))
    own = client.get(f"/records/record/{record.pk}/change/")
    assert own.status_code == 200
    assert "/terminal/" not in own.content.decode(), "the record's page links it only with the permission"

    # Neither staff nor bound to any role: the Studio's login page.
    client.force_login(staff_user(django_user_model, "outsider", is_staff=False))
    response = client.get(terminal_path(record))
    assert response.status_code == 302
    assert response["Location"].startswith("/login/")
    client.logout()
    assert client.get(terminal_path(record)).status_code == 302

    # With it: linked from the agent's page, the list and its record's page; the page renders
    # and starts nothing.
    client.force_login(staff_user(django_user_model, "ops", "admin"))
    assert terminal_path(record) in client.get(change_path(record)).content.decode()
    assert terminal_path(record) in client.get("/agents/agent/").content.decode()
    assert terminal_path(record) in client.get(f"/records/record/{record.pk}/change/").content.decode()
    assert "/terminal/" not in client.get(f"/records/record/{stand.pk}/change/").content.decode(), "agents only"
    page = client.get(terminal_path(record))
    assert page.status_code == 200
    html = page.content.decode()
    assert f'data-socket-path="/ws/agents/{record.pk}/pty/"' in html
    assert "<script>" not in html, "no inline script: a strict Content-Security-Policy can serve the page"
    assert Event.objects.filter(record=record).count() == events_before, "the page itself records nothing"
    assert client.get(f"/agents/agent/{uuid.uuid4()}/terminal/").status_code == 404
