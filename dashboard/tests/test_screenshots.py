"""The README's screenshots, taken from a real server so they stay
current: the overview and a task's page, at 1280×800."""

from __future__ import annotations

import struct

from playwright.sync_api import expect

import support

server: support.Server
chromium: support.Chromium


def setUpModule() -> None:
    global server, chromium
    server, chromium = support.start()
    for n in range(1, 6):
        server.cli("submit", "greet", "--input", f'{{"name": "user {n}"}}', "--id", f"greet-{n}")
    server.cli("submit", "refund", "--input", '{"order": 17}', "--id", "order-17")
    server.cli("submit", "fail", "--id", "report-3")
    server.cli("submit", "nap", "--id", "nightly-sync")
    for n in range(1, 6):
        server.wait_task(f"greet-{n}", {"processed"})
    server.wait_task("order-17", {"compensated"})
    server.wait_task("report-3", {"error"})
    server.wait_task("nightly-sync", {"processing"})


def tearDownModule() -> None:
    support.stop(server, chromium)


def png_size(data: bytes) -> tuple[int, int]:
    """A PNG's width and height, from its IHDR chunk."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


class Screenshots(support.BrowserTest):
    def test_the_overview_screenshot_at_1280x800(self) -> None:
        page, _ = self.open("/ui")
        support.wait_live(page)
        by_state = support.region(page, "Tasks by state")
        expect(by_state.get_by_role("link", name="processed 5")).to_be_visible()
        expect(support.region(page, "Open alerts")).to_contain_text("report-3")
        page.wait_for_timeout(500)
        data = page.screenshot(path=str(support.IMAGES_DIR / "dashboard-overview.png"))
        self.assertEqual(png_size(data), (1280, 800))

    def test_the_task_screenshot_at_1280x800(self) -> None:
        page, _ = self.open("/ui/tasks/order-17")
        support.wait_live(page, or_ended=True)
        expect(page.locator('g.step-node[data-step="ship"]')).to_have_attribute("data-state", "failed")
        expect(page.locator('g.step-node[data-step="charge"]')).to_have_attribute("data-state", "compensated")
        page.wait_for_timeout(500)
        data = page.screenshot(path=str(support.IMAGES_DIR / "dashboard-task.png"))
        self.assertEqual(png_size(data), (1280, 800))
