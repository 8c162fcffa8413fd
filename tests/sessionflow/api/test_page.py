"""The live page in a real browser: Debian's headless Chromium, driven by Playwright.

Nothing is downloaded: Playwright drives ``/usr/bin/chromium`` (``apt-get install chromium``;
``make test`` installs it when missing). Without it this test fails, saying what to run.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from playwright.async_api import Browser, Page, async_playwright, expect
from temporalio.testing import WorkflowEnvironment

from sessionflow.api.config import ApiSettings
from sessionflow.api.serve import listen, running_api
from store import Store
from tests.sessionflow.api.conftest import Api
from tests.workflows.harness import call, harness
from tests.workflows.test_hosts import host_worker, restarting
from tests.workflows.test_subagents import Tree, task

CHROMIUM = "/usr/bin/chromium"
FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
UI = "http://127.0.0.1:8233"
# A ceiling for each wait on the page, not a measurement: the machines this runs on are shared.
expect.set_options(timeout=30_000)


@pytest.fixture(scope="module")
async def browser() -> AsyncIterator[Browser]:
    if not shutil.which(CHROMIUM):
        pytest.fail(
            f"{CHROMIUM} is missing: run `apt-get update && apt-get install -y chromium` "
            f"(as root), or `make test`, which installs it"
        )
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=FLAGS
        )
        yield launched
        await launched.close()


def _script(api: Api) -> list[list[dict[str, Any]]]:
    tools = api.h.gate_file("tools")
    return [
        [
            {"reasoning": "Thinking it over.", "chunks": 2},
            {"text": "Streaming before the gate.", "chunks": 5, "delay_ms": 20},
            {"wait_for_file": api.h.gate_file("text")},
            *[call(f"call_{i}", "gate", text=f"output {i}", gate=tools) for i in range(5)],
        ],
        [
            {"text": "All five tools are done.", "chunks": 3},
            {"wait_for_file": api.h.gate_file("never")},
        ],
    ]


@pytest.mark.parametrize("target", ["sqlite"], indirect=True)
async def test_the_live_page(api: Api, browser: Browser) -> None:
    sid = await api.session(*_script(api))
    async with running_api(api.h.client, ApiSettings(port=0, temporal_ui=UI)) as url:
        page = await browser.new_page()
        try:
            await _walk_through(api, page, url, sid)
        finally:
            await page.close()


async def _walk_through(api: Api, page: Page, url: str, sid: str) -> None:
    streams: list[str] = []
    page.on("request", lambda r: streams.append(r.url) if "/events" in r.url else None)
    await page.goto(f"{url}/")
    await expect(page.locator(f'#sessions a[href="/view/{sid}"]')).to_be_visible()
    await page.goto(f"{url}/view/{sid}")
    link = page.locator("#temporal")
    assert await link.get_attribute("href") == f"{UI}/namespaces/default/workflows/session-{sid}"
    await expect(page.locator('#session[data-synced="true"]')).to_have_count(1)

    await page.fill("#prompt textarea", "Look around")
    await page.click("#send")
    text = page.locator(".assistant .text").first
    await expect(text).to_have_text("Streaming before the gate.")  # the turn waits at its gate
    assert "session.step.ended" not in await api.h.types(sid)
    await expect(page.locator("details.reasoning")).not_to_have_attribute("open", "")

    await page.reload()  # mid-turn: the page resumes after the last seq it had shown
    await expect(page.locator('#session[data-synced="true"]')).to_have_count(1)
    shown = int(await page.locator("#session").get_attribute("data-seq") or -1)
    assert streams[0].endswith("after=-1") and streams[-1].endswith(f"after={shown}")
    assert shown > 0
    api.h.open_gate("text")
    running = page.locator('.tool[data-state="running"]')
    await expect(running).to_have_count(5)  # all five at once: their gate is still closed
    await expect(running.first.locator(".duration")).to_have_text(lambda_seconds())
    api.h.open_gate("tools")
    await expect(page.locator('.tool[data-state="completed"]')).to_have_count(5)
    for i in range(5):
        card = page.locator(f'.tool[data-call="call_{i}"]')
        await expect(card.locator(".output")).to_have_text(f"output {i}")
        await expect(card.locator(".duration")).to_have_text(lambda_seconds())

    await expect(page.locator(".assistant .text").nth(1)).to_have_text("All five tools are done.")
    await expect(page.locator("#state")).to_have_text("busy")
    await page.click("#interrupt")
    await expect(page.locator(".marker.interrupted")).to_have_count(1)
    await expect(page.locator("#state")).to_have_text("idle")

    transcript = await page.locator("#transcript").inner_text()
    for once in ("Look around", "Streaming before the gate.", "All five tools are done."):
        assert transcript.count(once) == 1, transcript
    await expect(page.locator(".user .badge")).to_have_text("delivered")
    assert (await api.h.types(sid))[-1] == "session.execution.interrupted"


def lambda_seconds() -> Any:
    import re

    return re.compile(r"^\d+\.\d+ s$")


@pytest.mark.parametrize("target", ["sqlite"], indirect=True)
async def test_the_page_answers_what_a_session_waits_for(api: Api, browser: Browser) -> None:
    sid = await api.session(
        [call("b1", "bash", command="touch approved.txt")],
        [call("q1", "question", question="Which branch?", options=["main", "dev"])],
        [call("b2", "bash", command="touch denied.txt")],
        [{"text": "never"}],
    )
    async with running_api(api.h.client, ApiSettings(port=0, temporal_ui=UI)) as url:
        page = await browser.new_page()
        try:
            await page.goto(f"{url}/view/{sid}")
            await expect(page.locator('#session[data-synced="true"]')).to_have_count(1)
            await page.fill("#prompt textarea", "Go\n  on, please")
            await page.click("#send")
            first = page.locator('.tool[data-call="b1"] .ask')
            await expect(first.locator(".summary")).to_have_text(
                "bash wants to run: touch approved.txt"
            )
            # Issue 32: the prompt kept its newlines; the call waits, it does not "run 30 s".
            prompt = await page.locator(".user").first.inner_text()
            assert prompt.startswith("Go\n  on, please"), prompt
            waiting = page.locator('.tool[data-call="b1"]')
            await expect(waiting).to_have_attribute("data-state", "waiting")
            await expect(waiting.locator(".status")).to_have_text("waiting for approval")
            await expect(waiting.locator(".duration")).to_have_text("")
            assert not (api.h.workspace / "approved.txt").exists()
            await first.locator("button.approve.once").click()
            await expect(first.locator(".replied")).to_have_text("approved")
            await expect(page.locator('.tool[data-call="b1"]')).to_have_attribute(
                "data-state", "completed"
            )
            assert (api.h.workspace / "approved.txt").exists()

            question = page.locator('.tool[data-call="q1"] .ask')
            await expect(question.locator(".question")).to_have_text("Which branch?")
            await expect(page.locator('.tool[data-call="q1"] .status')).to_have_text(
                "waiting for an answer"
            )
            await question.locator('button.option[data-answer="dev"]').click()
            await expect(question.locator(".replied")).to_have_text("answered “dev”")

            await page.reload()  # restored or streamed anew, a waiting ask still answers
            last = page.locator('.tool[data-call="b2"] .ask')
            await expect(last.locator(".summary")).to_have_text(
                "bash wants to run: touch denied.txt"
            )
            await last.locator("button.deny").click()
            await expect(last.locator(".replied")).to_have_text("denied")
            await expect(page.locator(".marker.interrupted")).to_have_count(1)
        finally:
            await page.close()
    assert not (api.h.workspace / "denied.txt").exists()
    replied = [e for e in await api.h.events(sid) if e.type == "session.permission.replied"]
    assert [(e.data["decision"], e.data["answer"]) for e in replied] == [
        ("once", None),
        ("once", "dev"),
        ("reject", None),
    ]


@pytest.mark.parametrize("target", ["sqlite"], indirect=True)
async def test_the_page_resumes_after_a_dropped_connection(api: Api, browser: Browser) -> None:
    """The server goes away mid-turn, answers 503 for a while, and comes back on the same
    port: the page says it is reconnecting, then resumes after its last seq, no text twice."""
    gate = api.h.gate_file("drop")
    sid = await api.session(
        [
            {"text": "Before the drop.", "chunks": 4},
            {"wait_for_file": gate},
            {"text": " After it.", "chunks": 3},
        ]
    )
    settings = ApiSettings(port=0, temporal_ui=UI)
    sock = listen(settings)
    again = settings.model_copy(update={"port": sock.getsockname()[1]})
    page = await browser.new_page()
    try:
        async with running_api(api.h.client, settings, sock=sock) as url:
            await page.goto(f"{url}/view/{sid}")
            await expect(page.locator('#session[data-synced="true"]')).to_have_count(1)
            await page.fill("#prompt textarea", "Go")
            await page.click("#send")
            text = page.locator(".assistant .text").first
            await expect(text).to_have_text("Before the drop.")
        await expect(page.locator("#state")).to_have_text("reconnecting")
        api.h.open_gate("drop")  # the turn goes on while the page is away
        await api.h.client.wait_idle(sid)
        # A retry answered with an error makes the browser give up on the stream for good;
        # the page starts a new one.
        async with refusing(again.port) as refused:
            await refused.wait()
        async with running_api(api.h.client, again, sock=listen(again)):
            parts = page.locator(".assistant .text")
            await expect(parts).to_have_text(["Before the drop.", "After it."])
            await expect(page.locator("#state")).to_have_text("idle")
            await expect(page.locator(".marker.succeeded")).to_have_count(1)
    finally:
        await page.close()


@asynccontextmanager
async def refusing(port: int) -> AsyncIterator[asyncio.Event]:
    """What a proxy says while its upstream is down: 503 to every request on ``port``."""
    refused = asyncio.Event()

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n")
        writer.write(b"Connection: close\r\n\r\n")
        await writer.drain()
        writer.close()
        refused.set()

    server = await asyncio.start_server(answer, "127.0.0.1", port, reuse_address=True)
    try:
        yield refused
    finally:
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize("target", ["sqlite"], indirect=True)
async def test_a_task_call_links_to_its_child_session(
    temporal_env: WorkflowEnvironment, store: Store, tmp_path: Path, browser: Browser
) -> None:
    async with harness(temporal_env.client, store, tmp_path, start_worker=False) as h:
        tree = Tree(h)
        streamed = {"text": "Child streaming.", "chunks": 2}
        gate = {"wait_for_file": h.gate_file("child")}
        tree.subagent("helper", [streamed, gate, {"text": " And the helper's answer."}])
        sid = await h.session([task("t1", "helper")], [{"text": "parent done"}])
        async with tree.worker(), running_api(h.client, ApiSettings(port=0)) as url:
            page = await browser.new_page()
            try:
                await page.goto(f"{url}/view/{sid}")
                await expect(page.locator('#session[data-synced="true"]')).to_have_count(1)
                await h.client.prompt(sid, "Delegate")
                link = page.locator('.tool[data-call="t1"] a.child')
                await expect(link).to_have_count(1)
                (child,) = await h.client.children(sid)
                await expect(link).to_have_attribute("href", f"/view/{child.id}")
                await expect(link).to_have_text(f"helper session {child.id}")
                await link.click()
                await expect(page).to_have_url(f"{url}/view/{child.id}")
                await expect(page.locator(".text").first).to_contain_text("Child streaming.")
                h.open_gate("child")
                await page.goto(f"{url}/view/{sid}")
                done = page.locator('.tool[data-call="t1"]')
                await expect(done).to_have_attribute("data-state", "completed")
                await expect(done.locator(".output")).to_contain_text("And the helper's answer.")
                await expect(done.locator("a.child")).to_have_count(1)
            finally:
                await page.close()


@pytest.mark.parametrize("target", ["sqlite"], indirect=True)
async def test_the_page_shows_the_latest_todo_list(api: Api, browser: Browser) -> None:
    first = [{"content": "Plan", "status": "in_progress"}, {"content": "Build"}]
    then = [
        {"content": "Plan", "status": "completed"},
        {"content": "Build", "status": "in_progress"},
    ]
    sid = await api.session(
        [call("w1", "todowrite", todos=first)],
        [call("w2", "todowrite", todos=then)],
        [{"text": "done"}],
    )
    async with running_api(api.h.client, ApiSettings(port=0)) as url:
        page = await browser.new_page()
        try:
            await page.goto(f"{url}/view/{sid}")
            await expect(page.locator('#session[data-synced="true"]')).to_have_count(1)
            await api.h.client.prompt(sid, "Plan and build")
            await expect(page.locator(".marker.succeeded")).to_have_count(1)
            items = page.locator("ul.todos li")
            await expect(page.locator("ul.todos")).to_have_count(1)  # the latest only
            await expect(items).to_have_text(["Plan", "Build"])
            assert [await i.get_attribute("data-status") for i in await items.all()] == [
                "completed",
                "in_progress",
            ]
        finally:
            await page.close()


async def test_the_page_shows_the_spend_and_the_budget_that_stopped_it(
    api: Api, browser: Browser
) -> None:
    usage = {"finish": {"reason": "tool-calls", "usage": {"input": 1500}}}
    model = api.h.script(
        [call("e1", text="x"), usage],
        [{"text": "never asked"}],
        price={"input": 1000.0, "output": 1000.0},
    )
    sid = await api.h.client.create_session(
        workspace=str(api.h.workspace), model=model, budget={"usd": 1}
    )
    async with running_api(api.h.client, ApiSettings(port=0)) as url:
        page = await browser.new_page()
        try:
            await page.goto(f"{url}/view/{sid}")
            await expect(page.locator('#session[data-synced="true"]')).to_have_count(1)
            await expect(page.locator("#spend")).to_have_text("$0.0000 · budget $1")
            await api.h.client.prompt(sid, "Spend")
            await expect(page.locator(".marker.interrupted")).to_have_text("interrupted (budget)")
            spend = page.locator("#spend")
            await expect(spend).to_have_text("$1.5000 · budget reached: $1.5000 of $1")
            assert await spend.get_attribute("data-reached") == "usd"
        finally:
            await page.close()


@pytest.mark.parametrize("target", ["sqlite"], indirect=True)
async def test_the_page_says_a_call_waits_for_its_host(api: Api, browser: Browser) -> None:
    h = api.h
    async with host_worker(h, "b"):
        sid = await h.session([call("c1", text="ran")], [{"text": "done"}], host="b")
    await restarting(h, "b")
    async with running_api(h.client, ApiSettings(port=0)) as url:
        page = await browser.new_page()
        try:
            await page.goto(f"{url}/view/{sid}")
            await expect(page.locator('#session[data-synced="true"]')).to_have_count(1)
            await h.client.prompt(sid, "go")
            await expect(page.locator("#state")).to_have_text("busy · waiting for host b")
            async with host_worker(h, "b"):
                await expect(page.locator('.tool[data-call="c1"]')).to_have_attribute(
                    "data-state", "completed"
                )
                await expect(page.locator("#state")).to_have_text("idle")
        finally:
            await page.close()


async def test_the_page_reverts_to_a_message_and_hides_what_came_after(
    api: Api, browser: Browser
) -> None:
    sid = await api.session(
        [call("w1", "write", path="page.txt", content="from the session\n")],
        [{"text": "Written."}],
    )
    written = api.h.workspace / "page.txt"
    async with running_api(api.h.client, ApiSettings(port=0)) as url:
        page = await browser.new_page()
        try:
            await page.goto(f"{url}/view/{sid}")
            await expect(page.locator('#session[data-synced="true"]')).to_have_count(1)
            await api.h.client.prompt(sid, "Write the page file")
            await expect(page.locator(".marker.succeeded")).to_have_count(1)
            assert written.exists()
            await expect(page.locator(".assistant:visible")).to_have_count(2)
            await page.locator(".user button.revert").click()
            await expect(page.locator(".marker.revert")).to_have_text(
                f"reverted to {(await api.h.client.messages(sid))[0].id}: page.txt"
            )
            await expect(page.locator(".assistant:visible")).to_have_count(0)
            await expect(page.locator(".user:visible")).to_have_count(1)
            assert not written.exists()
            await page.locator(".user button.revert").click()  # nothing after it any more
            await expect(page.locator("#notice")).to_contain_text("nothing comes after")

            await api.h.client.unrevert(sid)
            last = (await api.h.client.messages(sid))[-1].id
            plan = await api.h.client.fork(sid, last, workspace=str(api.h.root / "forked"))
            assert plan.applied and plan.fork_session_id, plan
            await expect(page.locator("a.fork")).to_have_text(f"session {plan.fork_session_id}")
            await page.locator("a.fork").click()  # the fork's page draws its copied history
            await expect(page.locator(".user")).to_contain_text("Write the page file")
            await expect(page.locator(".tool .status")).to_have_text(["completed"])
            await expect(page.locator(".assistant .text")).to_have_text(["Written."])
        finally:
            await page.close()
