"""Headless Chromium driven over the DevTools protocol, with the standard library only.

Used to check that a web App curate launched really shows a dataset (the FiftyOne App in the
tests) and to keep a screenshot of it (``docs/fiftyone-app.png``). :class:`HeadlessChromium`
starts ``chromium --headless=new --remote-debugging-port=P`` on 127.0.0.1 with a throw-away
profile; :meth:`HeadlessChromium.open` gives a :class:`Page` (a DevTools websocket: navigate,
evaluate JavaScript, wait for a condition, capture a PNG). No Selenium or Playwright, nothing
downloaded: the browser is Debian's ``chromium`` (see :func:`curate.review.provision.ensure_chromium`).
"""
from __future__ import annotations

import base64
import json
import logging
import os
import shutil
import socket
import struct
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from curate.review.database import _stop_process, free_port
from curate.review.provision import ServiceError, chromium_command, ensure_chromium

log = logging.getLogger(__name__)


class Page:
    """One browser tab over a DevTools websocket (RFC 6455 client frames, masked)."""

    def __init__(self, ws_url: str, timeout: float = 30.0) -> None:
        parsed = urlparse(ws_url)
        self._sock = socket.create_connection((parsed.hostname, parsed.port), timeout=timeout)
        key = base64.b64encode(os.urandom(16)).decode()
        request = (f"GET {parsed.path} HTTP/1.1\r\nHost: {parsed.hostname}:{parsed.port}\r\nUpgrade: websocket\r\n"
                   f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n")
        self._sock.sendall(request.encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self._sock.recv(4096)
            if not chunk:
                raise ServiceError("the browser closed the DevTools connection during the handshake")
            head += chunk
        status = head.split(b"\r\n", 1)[0]
        if b" 101 " not in status:
            raise ServiceError(f"DevTools websocket refused: {status.decode(errors='replace')}")
        self._buffer = head.split(b"\r\n\r\n", 1)[1]
        self._next_id = 0
        self.events: list[dict[str, Any]] = []

    # -- websocket frames
    def _recv_exact(self, n: int) -> bytes:
        while len(self._buffer) < n:
            chunk = self._sock.recv(max(65536, n - len(self._buffer)))
            if not chunk:
                raise ServiceError("the browser closed the DevTools connection")
            self._buffer += chunk
        data, self._buffer = self._buffer[:n], self._buffer[n:]
        return data

    def _recv_message(self) -> str:
        parts: list[bytes] = []
        while True:
            b0, b1 = self._recv_exact(2)
            opcode, length = b0 & 0x0F, b1 & 0x7F
            if length == 126:
                length = struct.unpack(">H", self._recv_exact(2))[0]
            elif length == 127:
                length = struct.unpack(">Q", self._recv_exact(8))[0]
            mask = self._recv_exact(4) if b1 & 0x80 else None
            payload = self._recv_exact(length)
            if mask:
                payload = bytes(c ^ mask[i % 4] for i, c in enumerate(payload))
            if opcode == 8:
                raise ServiceError("the browser closed the DevTools websocket")
            if opcode == 9:  # ping -> pong
                self._send_frame(payload, opcode=10)
                continue
            if opcode in (0, 1, 2):
                parts.append(payload)
                if b0 & 0x80:
                    return b"".join(parts).decode("utf-8")

    def _send_frame(self, payload: bytes, opcode: int = 1) -> None:
        header = bytes([0x80 | opcode])
        n = len(payload)
        if n < 126:
            header += bytes([0x80 | n])
        elif n < 1 << 16:
            header += bytes([0x80 | 126]) + struct.pack(">H", n)
        else:
            header += bytes([0x80 | 127]) + struct.pack(">Q", n)
        mask = os.urandom(4)
        masked = bytes(c ^ mask[i % 4] for i, c in enumerate(payload))
        self._sock.sendall(header + mask + masked)

    # -- DevTools protocol
    def call(self, method: str, params: dict[str, Any] | None = None, timeout: float = 60.0) -> dict[str, Any]:
        """Send a DevTools command and return its result (events met meanwhile go to ``events``)."""
        self._next_id += 1
        ident = self._next_id
        self._send_frame(json.dumps({"id": ident, "method": method, "params": params or {}}).encode())
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            message = json.loads(self._recv_message())
            if message.get("id") == ident:
                if "error" in message:
                    raise ServiceError(f"DevTools {method} failed: {message['error']}")
                return message.get("result", {})
            if "method" in message:
                self.events.append(message)
        raise ServiceError(f"DevTools {method} did not answer within {timeout:.0f} s")

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (promises awaited)."""
        result = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True})
        if "exceptionDetails" in result:
            raise ServiceError(f"JavaScript error: {result['exceptionDetails'].get('text')}: {expression[:80]}")
        return result.get("result", {}).get("value")

    def before_load(self, script: str) -> None:
        """Run ``script`` in every document this page loads, before the page's own scripts."""
        self.call("Page.addScriptToEvaluateOnNewDocument", {"source": script})

    def navigate(self, url: str) -> None:
        self.call("Page.enable")
        self.call("Page.navigate", {"url": url})

    def wait_for(self, expression: str, timeout: float = 60.0, interval: float = 0.5) -> Any:
        """Poll a JavaScript expression until it is truthy; its value (raises after ``timeout``)."""
        deadline = time.monotonic() + timeout
        value: Any = None
        while time.monotonic() < deadline:
            try:
                value = self.evaluate(expression)
            except ServiceError:
                value = None
            if value:
                return value
            time.sleep(interval)
        raise ServiceError(f"the page did not satisfy {expression!r} within {timeout:.0f} s (last value {value!r})")

    def click(self, selector: str) -> None:
        """A real mouse click (press and release) at the centre of the first element matching
        ``selector`` (React handlers see it like a user's click)."""
        box = self.evaluate(f"""(() => {{ const e = document.querySelector({json.dumps(selector)});
            if (!e) return null; e.scrollIntoView({{block: 'center'}}); const r = e.getBoundingClientRect();
            return [r.left + r.width / 2, r.top + r.height / 2]; }})()""")
        if not box:
            raise ServiceError(f"no element matches {selector!r}")
        for kind in ("mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", {"type": kind, "x": box[0], "y": box[1], "button": "left", "clickCount": 1})

    def screenshot(self, path: Path) -> Path:
        """Save a PNG of the viewport."""
        data = self.call("Page.captureScreenshot", {"format": "png"})["data"]
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        try:
            self._sock.close()
        except OSError:
            pass


class HeadlessChromium:
    """A headless Chromium on 127.0.0.1 with a temporary profile (a context manager)."""

    def __init__(self, *, size: tuple[int, int] = (1440, 900), install: bool = False, startup_timeout: float = 60.0) -> None:
        self.size = size
        self.chromium = ensure_chromium(install=install)
        self.port = free_port()
        self.profile = Path(tempfile.mkdtemp(prefix="curate-chromium-"))
        cmd = chromium_command(self.chromium, size=size) + [
            f"--remote-debugging-port={self.port}", "--remote-debugging-address=127.0.0.1",
            f"--user-data-dir={self.profile}", "about:blank"]
        log.info("starting headless %s (DevTools on 127.0.0.1:%d)", self.chromium, self.port)
        self.process = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + startup_timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ServiceError(f"{self.chromium} exited with code {self.process.returncode} at start")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/json/version", timeout=2):
                    return
            except OSError:
                time.sleep(0.3)
        self.close()
        raise ServiceError(f"headless {self.chromium} did not open DevTools within {startup_timeout:.0f} s")

    def open(self) -> Page:
        """The first page target (the ``about:blank`` tab) as a :class:`Page`."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/json/list", timeout=10) as response:
            targets = json.loads(response.read())
        pages = [t for t in targets if t.get("type") == "page" and t.get("webSocketDebuggerUrl")]
        if not pages:
            raise ServiceError("headless Chromium has no page target")
        page = Page(pages[0]["webSocketDebuggerUrl"])
        page.call("Emulation.setDeviceMetricsOverride",
                  {"width": self.size[0], "height": self.size[1], "deviceScaleFactor": 1, "mobile": False})
        return page

    def close(self) -> None:
        _stop_process(self.process, None, name="headless chromium", grace=5.0)
        shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> HeadlessChromium:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
