"""Drive a real headless Chromium (Debian's /usr/bin/chromium) over the Chrome
DevTools protocol, through --remote-debugging-pipe (JSON messages ended by NUL on
file descriptors 3 and 4): no websocket library and no browser download.

``render_page(html_path, screenshot)`` opens the file, collects console messages,
uncaught exceptions and log entries, measures every ``svg.plot`` and every
``.missing`` box, and saves a full-page PNG screenshot.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
# The flags known to work on these machines (closed network, running as root).
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--remote-debugging-pipe",
]
WIDTH, HEIGHT = 1280, 900

_MEASURE = """(() => {
  const box = e => { const r = e.getBoundingClientRect();
    return {x: r.x + scrollX, y: r.y + scrollY, width: r.width, height: r.height}; };
  const plots = [...document.querySelectorAll('svg.plot')].map(s => ({
    label: s.getAttribute('aria-label'), ...box(s),
    marks: [...s.querySelectorAll('.mark')].map(m => {
      const r = m.getBoundingClientRect();
      return {path: m.getAttribute('data-path'), width: r.width, height: r.height};
    }),
    visible: getComputedStyle(s).visibility === 'visible'
      && getComputedStyle(s).display !== 'none'}));
  const missing = [...document.querySelectorAll('.missing')].map(
    m => ({text: m.textContent, ...box(m)}));
  return {plots, missing,
    wide: [...document.querySelectorAll('body *')].filter(
      e => e.getBoundingClientRect().right > innerWidth + 1).slice(0, 5).map(
      e => e.tagName + '.' + e.className + ': ' + e.textContent.slice(0, 60)),
    page: {width: document.documentElement.scrollWidth,
           height: document.documentElement.scrollHeight},
    title: document.title};
})()"""


@dataclass
class Rendered:
    title: str
    plots: list[dict]
    missing: list[dict]
    page: dict
    wide: list[str]
    errors: list[str] = field(default_factory=list)
    console: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)


class _Pipe:
    def __init__(self, proc: subprocess.Popen, write_fd: int, read_fd: int):
        self.proc, self.w, self.r = proc, write_fd, read_fd
        self.buf = b""
        self.next_id = 0
        self.events: list[dict] = []

    def send(self, method: str, params: dict | None = None, session: str = "") -> dict:
        self.next_id += 1
        msg: dict = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self.w, json.dumps(msg).encode() + b"\0")
        while True:
            reply = self._read()
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_event(self, method: str, timeout: float = 30.0) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for ev in self.events:
                if ev.get("method") == method:
                    return ev
            self.events.append(self._read())
        raise TimeoutError(f"no {method} within {timeout} s")

    def _read(self) -> dict:
        while b"\0" not in self.buf:
            chunk = os.read(self.r, 1 << 20)
            if not chunk:
                raise RuntimeError(
                    f"chromium closed the DevTools pipe (exit {self.proc.poll()})"
                )
            self.buf += chunk
        raw, _, self.buf = self.buf.partition(b"\0")
        return json.loads(raw)


def render_page(html_path: Path, screenshot: Path, timeout: float = 60.0) -> Rendered:
    if not Path(CHROMIUM).is_file():
        raise RuntimeError(
            f"{CHROMIUM} not found: install Debian's chromium (`make chromium`)"
        )
    profile = tempfile.mkdtemp(prefix="onboard-chromium-")
    # Chromium reads commands on fd 3 and writes replies on fd 4.
    # Pipe ends numbered above 4, so that the child's dup2 onto 3 and 4 cannot
    # overwrite one of them.
    to_chrome_r, to_chrome_w = (_high(fd) for fd in os.pipe())
    from_chrome_r, from_chrome_w = (_high(fd) for fd in os.pipe())

    def child_fds():
        os.dup2(to_chrome_r, 3)
        os.dup2(from_chrome_w, 4)

    proc = subprocess.Popen(
        [
            CHROMIUM,
            *FLAGS,
            f"--user-data-dir={profile}",
            f"--window-size={WIDTH},{HEIGHT}",
            "about:blank",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=child_fds,
        pass_fds=(3, 4),
    )
    os.close(to_chrome_r)
    os.close(from_chrome_w)
    pipe = _Pipe(proc, to_chrome_w, from_chrome_r)
    try:
        target = pipe.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = pipe.send(
            "Target.attachToTarget", {"targetId": target, "flatten": True}
        )["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            pipe.send(f"{domain}.enable", session=session)
        pipe.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": WIDTH, "height": HEIGHT, "deviceScaleFactor": 1, "mobile": False},
            session=session,
        )
        pipe.send("Page.navigate", {"url": html_path.resolve().as_uri()}, session)
        pipe.wait_event("Page.loadEventFired", timeout)
        measured = pipe.send(
            "Runtime.evaluate",
            {"expression": _MEASURE, "returnByValue": True},
            session,
        )["result"]["value"]
        shot = pipe.send(
            "Page.captureScreenshot",
            {"format": "png", "captureBeyondViewport": True},
            session,
        )
        screenshot.parent.mkdir(parents=True, exist_ok=True)
        screenshot.write_bytes(base64.b64decode(shot["data"]))
        out = Rendered(
            measured["title"],
            measured["plots"],
            measured["missing"],
            measured["page"],
            measured["wide"],
        )
        for ev in pipe.events:
            method, params = ev.get("method"), ev.get("params", {})
            if method == "Runtime.consoleAPICalled":
                text = " ".join(str(a.get("value", a)) for a in params.get("args", []))
                out.console.append(f"{params.get('type')}: {text}")
                if params.get("type") in ("error", "assert"):
                    out.errors.append(f"console.{params['type']}: {text}")
            elif method == "Runtime.exceptionThrown":
                out.errors.append(f"exception: {params['exceptionDetails']}")
            elif method == "Log.entryAdded":
                entry = params["entry"]
                out.console.append(f"{entry['level']}: {entry['text']}")
                if entry["level"] == "error":
                    out.errors.append(f"log: {entry['text']} ({entry.get('url')})")
            elif method == "Network.requestWillBeSent":
                out.requests.append(params["request"]["url"])
        return out
    finally:
        try:
            pipe.send("Browser.close")
        except (RuntimeError, OSError):
            pass
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        os.close(to_chrome_w)
        os.close(from_chrome_r)
        shutil.rmtree(profile, ignore_errors=True)


def _high(fd: int) -> int:
    high = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
    os.close(fd)
    return high
