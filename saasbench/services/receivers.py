"""Receivers the evaluator runs for the app to talk to: a webhook receiver and an SMTP sink.

* :class:`WebhookReceiver` -- a ``ThreadingHTTPServer`` on an **ephemeral** port (never a fixed
  one, so parallel runs never collide) that records every request it gets: method, path (with
  query), lower-cased headers, body (at most :data:`MAX_BODY_BYTES`; the rest is read and dropped,
  ``truncated`` says so), client address and arrival time. :meth:`WebhookReceiver.wait_for`
  blocks on a condition variable until a recorded request satisfies a predicate (no polling).
  It also answers the routes of the public harness's compose ``mock-receiver`` service, so the
  same class is that service (:data:`MockReceiver`, ``python -m saasbench.services.receivers mock``):

  ====================  =========================================================
  ``POST /hook``        recorded, 200 ``{"ok": true}``
  ``POST /always-500``  recorded, 500 (for retry / failure-handling checks)
  ``GET /history``      JSON list of recorded requests (oldest first); not recorded
  ``DELETE /history``   clears the record; not recorded
  anything else         recorded, 200 ``{"ok": true}``
  ====================  =========================================================

* :class:`SmtpSink` -- a minimal SMTP server (``socketserver``; RFC 5321 subset: EHLO/HELO, MAIL,
  RCPT, DATA, RSET, NOOP, VRFY, QUIT, and AUTH PLAIN/LOGIN accepting any credentials; no
  STARTTLS) that keeps every message (at most :data:`MAX_MESSAGE_BYTES`), parsed with the stdlib
  :mod:`email` package (from, to, cc, subject, text and HTML body), plus a MailHog-compatible HTTP
  read API (``GET /api/v2/messages``, ``GET /api/v1/messages``, ``DELETE /api/v1/messages``) so a
  reader cannot tell it from a task's MailHog. Written with the stdlib instead of ``aiosmtpd``:
  the protocol subset an app's mailer uses is ~150 lines, and it keeps the evaluator free of an
  asyncio event-loop thread and of a dependency.

Reachability. Both bind ``127.0.0.1`` by default: right for the local backend, where the app runs
on the host. An app in a container cannot reach the host's loopback; for it, bind the Docker
network's gateway address (``docker network inspect <net> -f '{{(index .IPAM.Config 0).Gateway}}'``,
often ``172.17.0.1``) or ``0.0.0.0`` and *advertise* the address the container uses
(the gateway IP, or ``host.docker.internal`` when the container maps it with
``--add-host=host.docker.internal:host-gateway``). :func:`receiver_hosts` picks them, first hit
wins: run variables ``receiver_bind_host`` / ``receiver_advertise_host`` (task config), the
environment's members of the same names (``Environment.receiver_bind_host``, by default its
``gateway_ip``), the process environment
``SAASBENCH_RECEIVER_BIND_HOST`` / ``SAASBENCH_RECEIVER_ADVERTISE_HOST``, then ``127.0.0.1``.
Binding ``0.0.0.0`` exposes the receiver on every interface; prefer the gateway address.

Per run: :func:`ensure_webhook_receiver` / :func:`ensure_smtp_sink` start one instance lazily in
``ctx.resources``, stop it through ``ctx.add_closer`` and seed ``{{webhook_url}}``,
``{{webhook_port}}``, ``{{webhook_host}}``, ``{{webhook_base_url}}`` / ``{{smtp_host}}``,
``{{smtp_port}}``, ``{{smtp_api_url}}`` (run-wide variables; they replace values of the same
name).

Limits: request bodies are kept up to 1 MiB (a request body over 64 MiB closes the connection
unread), at most :data:`MAX_RECORDS` requests / messages are kept (the oldest are dropped and
counted), idle connections are closed after 30 s.
"""

from __future__ import annotations

import argparse
import base64
import email
import email.policy
import json
import signal
import socket
import socketserver
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from email.message import EmailMessage
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any, Generic, Self, TypeVar
from urllib.parse import parse_qs, urlsplit

from saasbench import settings

if TYPE_CHECKING:
    from saasbench.evaluation.context import RunContext

MAX_BODY_BYTES = 1024 * 1024
MAX_DRAIN_BYTES = 64 * 1024 * 1024
MAX_MESSAGE_BYTES = 10 * 1024 * 1024
MAX_RECORDS = 10_000
IDLE_TIMEOUT_S = 30.0
DEFAULT_HOST = "127.0.0.1"
WEBHOOK_PATH = "/hook"
_UNSET: Any = object()


# --- records ------------------------------------------------------------------------------------
@dataclass
class Delivery:
    """One request the receiver got."""

    seq: int
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    received_at: float
    client: str = ""
    truncated: bool = False
    _json: Any = field(default=_UNSET, repr=False, compare=False)

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")

    @property
    def json(self) -> Any:
        """The body parsed as JSON, or None when it is not JSON."""
        if self._json is _UNSET:
            try:
                self._json = json.loads(self.text) if self.body.strip() else None
            except (ValueError, RecursionError):
                self._json = None
        return self._json

    def as_dict(self, body_chars: int | None = None) -> dict[str, Any]:
        text = self.text
        if body_chars is not None and len(text) > body_chars:
            text = text[:body_chars] + f"... [{len(text) - body_chars} more chars]"
        parsed = self.json if body_chars is None else None
        return {
            "seq": self.seq,
            "method": self.method,
            "path": self.path,
            "headers": dict(self.headers),
            "body": parsed if parsed is not None else text,
            "received_at": self.received_at,
            "client": self.client,
            "truncated": self.truncated,
        }


class _Log:
    """A thread-safe append-only log with a condition variable, shared by both receivers."""

    def __init__(self, limit: int = MAX_RECORDS):
        self._cond = threading.Condition()
        self._items: list[Any] = []
        self._seq = 0
        self.dropped = 0
        self.limit = limit

    def next_seq(self) -> int:
        with self._cond:
            self._seq += 1
            return self._seq

    def add(self, item: Any) -> None:
        with self._cond:
            self._items.append(item)
            if len(self._items) > self.limit:
                del self._items[0]
                self.dropped += 1
            self._cond.notify_all()

    @property
    def last_seq(self) -> int:
        with self._cond:
            return self._seq

    def snapshot(self) -> list[Any]:
        with self._cond:
            return list(self._items)

    def clear(self) -> None:
        with self._cond:
            self._items.clear()

    def wait_for(self, predicate: Callable[[Any], bool], timeout: float, after_seq: int = 0) -> Any | None:
        """The first item with ``seq > after_seq`` satisfying ``predicate``, waiting up to ``timeout`` s."""
        deadline = time.monotonic() + max(0.0, timeout)
        checked = after_seq
        with self._cond:
            while True:
                for item in self._items:
                    if item.seq > checked:
                        checked = item.seq
                        if predicate(item):
                            return item
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self._cond.wait(remaining)


# --- HTTP side -----------------------------------------------------------------------------------
class _HttpServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True

    def __init__(
        self, address: tuple[str, int], *, receiver: WebhookReceiver | None = None, sink: SmtpSink | None = None
    ):
        self.receiver = receiver
        self.sink = sink
        family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.address_family = family
        super().__init__(address, _Handler)


class _Handler(BaseHTTPRequestHandler):
    server: _HttpServer
    timeout = IDLE_TIMEOUT_S
    server_version = "saasbench-receiver/1"
    protocol_version = "HTTP/1.0"

    def log_message(self, format: str, *args: Any) -> None:  # quiet: the evidence is the record
        return

    def _reply(self, status: int, payload: Any) -> None:
        raw = json.dumps(payload, default=str).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(raw)

    def _read_body(self) -> tuple[bytes, bool] | None:
        """The body (capped) and whether it was cut; None when the connection must be dropped."""
        kept = bytearray()
        total = 0

        def take(chunk: bytes) -> None:
            nonlocal total
            total += len(chunk)
            room = MAX_BODY_BYTES - len(kept)
            if room > 0:
                kept.extend(chunk[:room])

        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            while True:
                line = self.rfile.readline(1024)
                if not line:
                    return None
                try:
                    size = int(line.split(b";", 1)[0].strip() or b"0", 16)
                except ValueError:
                    return None
                if size == 0:
                    while self.rfile.readline(8192) not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    break
                if total + size > MAX_DRAIN_BYTES:
                    return None
                while size > 0:
                    chunk = self.rfile.read(min(size, 65536))
                    if not chunk:
                        return None
                    take(chunk)
                    size -= len(chunk)
                self.rfile.readline(8)  # CRLF after the chunk
            return bytes(kept), total > MAX_BODY_BYTES
        length_text = self.headers.get("Content-Length", "0").strip() or "0"
        if not length_text.isdigit():
            return None
        length = int(length_text)
        if length > MAX_DRAIN_BYTES:
            return None
        while length > 0:
            chunk = self.rfile.read(min(length, 65536))
            if not chunk:
                break
            take(chunk)
            length -= len(chunk)
        return bytes(kept), total > MAX_BODY_BYTES

    def _handle(self) -> None:
        route = urlsplit(self.path).path
        sink, receiver = self.server.sink, self.server.receiver
        if sink is not None and route.startswith("/api/"):
            self._mail_api(sink, route)
            return
        if receiver is None:
            self._reply(404, {"error": "not found"})
            return
        if route == "/history" and self.command == "GET":
            self._reply(200, [d.as_dict() for d in receiver.deliveries()])
            return
        if route == "/history" and self.command == "DELETE":
            receiver.clear()
            self._reply(200, {"ok": True, "cleared": True})
            return
        body = self._read_body()
        if body is None:
            self.close_connection = True
            self._reply(413, {"error": "body too large or malformed"})
            return
        raw, truncated = body
        receiver.record(
            self.command,
            self.path,
            {k.lower(): v for k, v in self.headers.items()},
            raw,
            client=self.client_address[0] if self.client_address else "",
            truncated=truncated,
        )
        status = receiver.status_for(self.command, route)
        self._reply(status, {"ok": status < 400, "status": status})

    def _mail_api(self, sink: SmtpSink, route: str) -> None:
        query = parse_qs(urlsplit(self.path).query)
        if self.command == "DELETE" and route in ("/api/v1/messages", "/api/v2/messages"):
            sink.clear()
            self._reply(200, {"ok": True})
            return
        if self.command in ("GET", "HEAD") and route == "/api/v2/messages":
            items = [m.mailhog() for m in reversed(sink.messages())]  # MailHog lists newest first
            start = _int(query.get("start", ["0"])[0], 0)
            limit = _int(query.get("limit", ["50"])[0], 50)
            page = items[start : start + limit]
            self._reply(200, {"total": len(items), "count": len(page), "start": start, "items": page})
            return
        if self.command in ("GET", "HEAD") and route == "/api/v1/messages":
            self._reply(200, [m.mailhog() for m in reversed(sink.messages())])
            return
        self._reply(404, {"error": "not found"})

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = _handle


def _int(text: str, default: int) -> int:
    try:
        return max(0, int(text))
    except ValueError:
        return default


def _bound_port(server: socketserver.BaseServer) -> int:
    """The port an AF_INET/AF_INET6 server is bound to (its address is ``(host, port, ...)``)."""
    address = server.server_address
    if not isinstance(address, tuple):
        raise TypeError(f"not an IP server: {address!r}")
    return int(address[1])


_R = TypeVar("_R")  # what a receiver records: Delivery or MailMessage


class _Serving(Generic[_R]):
    """What both receivers share: where they bind and what they advertise, the record of what
    they got (a :class:`_Log` of ``_R``), and the lifecycle -- socketservers, each served by a
    daemon thread, started by :meth:`start` (:meth:`_open` says which) and stopped newest first."""

    _what = "receiver"  # names it in the error of ``port`` before ``start``

    def __init__(self, bind_host: str, port: int, advertise_host: str | None):
        self.bind_host = bind_host
        self.requested_port = port
        self.advertise_host = advertise_host or (DEFAULT_HOST if bind_host in ("0.0.0.0", "::", "") else bind_host)
        self._log = _Log()
        self._server: socketserver.BaseServer | None = None  # the first one served; None = stopped
        self._serving: list[tuple[socketserver.BaseServer, threading.Thread]] = []

    # lifecycle
    def _open(self) -> None:
        """Create the servers and hand each to :meth:`_serve` (the first is the main one)."""
        raise NotImplementedError

    def _serve(self, server: socketserver.BaseServer, name: str) -> None:
        if self._server is None:
            self._server = server
        thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, name=name, daemon=True)
        self._serving.append((server, thread))
        thread.start()

    def start(self) -> Self:
        if self._server is None:
            self._open()
        return self

    def stop(self) -> None:
        self._server = None
        while self._serving:
            server, thread = self._serving.pop()
            server.shutdown()
            server.server_close()
            thread.join(timeout=5)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        return self._server is not None

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError(f"{self._what} not started")
        return _bound_port(self._server)

    @property
    def _url_host(self) -> str:
        return f"[{self.advertise_host}]" if ":" in self.advertise_host else self.advertise_host

    # the record
    @property
    def last_seq(self) -> int:
        """The sequence number of the last item recorded (0 before any): a baseline for wait_for."""
        return self._log.last_seq

    def clear(self) -> None:
        self._log.clear()

    def wait_for(self, predicate: Callable[[_R], bool], timeout: float, after_seq: int = 0) -> _R | None:
        """The first item after ``after_seq`` for which ``predicate`` is true, or None after ``timeout`` s."""
        return self._log.wait_for(predicate, timeout, after_seq)


class WebhookReceiver(_Serving[Delivery]):
    """Records every HTTP request sent to it; see the module docstring for routes and limits.

    ``port=0`` (the default) takes an ephemeral port. ``advertise_host`` is the host name the app
    must use to reach it (default: the bind host, or 127.0.0.1 when binding a wildcard).
    """

    def __init__(self, bind_host: str = DEFAULT_HOST, port: int = 0, advertise_host: str | None = None):
        super().__init__(bind_host, port, advertise_host)
        self._statuses: dict[str, int] = {"/always-500": 500}

    def _open(self) -> None:
        self._serve(_HttpServer((self.bind_host, self.requested_port), receiver=self), "saasbench-webhook-receiver")

    @property
    def base_url(self) -> str:
        return f"http://{self._url_host}:{self.port}"

    @property
    def url(self) -> str:
        """Where the app should deliver webhooks: ``<base_url>/hook``."""
        return self.base_url + WEBHOOK_PATH

    # recording
    def record(
        self, method: str, path: str, headers: dict[str, str], body: bytes, *, client: str = "", truncated: bool = False
    ) -> Delivery:
        delivery = Delivery(
            seq=self._log.next_seq(),
            method=method.upper(),
            path=path,
            headers=headers,
            body=body,
            received_at=time.time(),
            client=client,
            truncated=truncated,
        )
        self._log.add(delivery)
        return delivery

    def status_for(self, method: str, route: str) -> int:
        return self._statuses.get(route, 200)

    def set_status(self, route: str, status: int) -> None:
        """Answer requests to ``route`` with ``status`` (they are still recorded)."""
        self._statuses[route] = status

    def deliveries(self) -> list[Delivery]:
        return self._log.snapshot()

    @property
    def dropped(self) -> int:
        return self._log.dropped


MockReceiver = WebhookReceiver
"""The compose ``mock-receiver`` service: the same server (``POST /hook``, ``POST /always-500``,
``GET``/``DELETE /history``). Standalone: ``python -m saasbench.services.receivers mock --port N``."""


# --- SMTP side -----------------------------------------------------------------------------------
@dataclass
class MailMessage:
    """One message the sink accepted (envelope + raw bytes), parsed on demand."""

    seq: int
    mail_from: str
    rcpt_to: list[str]
    raw: bytes
    received_at: float
    truncated: bool = False
    _parsed: dict[str, Any] | None = field(default=None, repr=False, compare=False)

    def parsed(self) -> dict[str, Any]:
        if self._parsed is None:
            self._parsed = parse_message(self.raw, self.mail_from, self.rcpt_to)
        return self._parsed

    @property
    def subject(self) -> str:
        return self.parsed()["subject"]

    @property
    def recipients(self) -> list[str]:
        return self.parsed()["recipients"]

    @property
    def text(self) -> str:
        return self.parsed()["text"]

    def summary(self, body_chars: int = 500) -> dict[str, Any]:
        p = self.parsed()
        body = p["text"] or p["html"]
        return {
            "from": p["from"],
            "to": p["to"],
            "recipients": p["recipients"],
            "subject": p["subject"],
            "body": body[:body_chars] + ("..." if len(body) > body_chars else ""),
            "received_at": self.received_at,
        }

    def mailhog(self) -> dict[str, Any]:
        """This message in MailHog's API shape (what P28 reads from a task's MailHog)."""
        p = self.parsed()

        def path(addr: str) -> dict[str, str | None]:
            local, _, domain = addr.partition("@")
            return {"Relays": None, "Mailbox": local, "Domain": domain, "Params": ""}

        data = self.raw.decode("utf-8", errors="replace")
        return {
            "ID": f"{self.seq}@saasbench",
            "From": path(self.mail_from),
            "To": [path(r) for r in self.rcpt_to],
            "Content": {"Headers": p["headers"], "Body": p["body_raw"], "Size": len(self.raw), "MIME": None},
            "Created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.received_at)),
            "MIME": None,
            "Raw": {"From": self.mail_from, "To": list(self.rcpt_to), "Data": data, "Helo": ""},
        }


def parse_message(raw: bytes, mail_from: str = "", rcpt_to: Iterable[str] = ()) -> dict[str, Any]:
    """Headers, subject, addresses and text/HTML body of a raw RFC 5322 message (never raises)."""
    from email.utils import getaddresses

    msg = email.message_from_bytes(raw, policy=email.policy.default)
    headers: dict[str, list[str]] = {}
    for name, value in msg.items():
        headers.setdefault(name, []).append(str(value))

    def addresses(name: str) -> list[str]:
        values = [str(v) for v in msg.get_all(name, [])]
        return [addr for _, addr in getaddresses(values) if addr]

    to, cc = addresses("To"), addresses("Cc")
    text = html = ""
    try:
        if isinstance(msg, EmailMessage):
            for kind, out in (("plain", "text"), ("html", "html")):
                part = msg.get_body(preferencelist=(kind,))
                if part is not None:
                    content = part.get_content()
                    if out == "text":
                        text = content if isinstance(content, str) else ""
                    else:
                        html = content if isinstance(content, str) else ""
    except (LookupError, ValueError, AttributeError):  # a broken MIME structure is the app's, not ours
        pass
    if not text and not html and not msg.is_multipart():
        payload = msg.get_payload(decode=True)
        text = payload.decode("utf-8", errors="replace") if isinstance(payload, bytes) else str(msg.get_payload())
    body_raw = raw.split(b"\r\n\r\n", 1)[-1] if b"\r\n\r\n" in raw else raw.split(b"\n\n", 1)[-1]
    recipients = list(dict.fromkeys([*to, *cc, *addresses("Bcc"), *rcpt_to]))
    return {
        "from": (addresses("From") or [mail_from or ""])[0],
        "to": to,
        "cc": cc,
        "recipients": recipients,
        "subject": str(msg.get("Subject", "") or ""),
        "text": text,
        "html": html,
        "headers": headers,
        "body_raw": body_raw.decode("utf-8", errors="replace"),
    }


class _SmtpServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], sink: SmtpSink):
        self.sink = sink
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        super().__init__(address, _SmtpHandler)


class _SmtpHandler(socketserver.StreamRequestHandler):
    server: _SmtpServer
    timeout = IDLE_TIMEOUT_S

    def _say(self, text: str) -> None:
        self.wfile.write(text.encode() + b"\r\n")

    def handle(self) -> None:
        try:
            self._session()
        except (OSError, TimeoutError):
            pass  # client went away or idled out

    def _session(self) -> None:
        sink = self.server.sink
        name = "saasbench-smtp-sink"
        self._say(f"220 {name} ESMTP ready")
        mail_from: str | None = None
        rcpts: list[str] = []
        while True:
            line = self.rfile.readline(4097)
            if not line:
                return
            if len(line) > 4096:
                self._say("500 5.5.2 line too long")
                continue
            text = line.decode("utf-8", errors="replace").rstrip("\r\n")
            verb, _, arg = text.partition(" ")
            verb = verb.upper()
            if verb == "EHLO":
                self.wfile.write(
                    f"250-{name}\r\n250-8BITMIME\r\n250-SMTPUTF8\r\n250-SIZE {MAX_MESSAGE_BYTES}\r\n"
                    "250-AUTH PLAIN LOGIN\r\n250 HELP\r\n".encode()
                )
                mail_from, rcpts = None, []
            elif verb == "HELO":
                self._say(f"250 {name}")
                mail_from, rcpts = None, []
            elif verb == "MAIL":
                if not arg.upper().startswith("FROM:"):
                    self._say("501 5.5.4 syntax: MAIL FROM:<address>")
                    continue
                mail_from, rcpts = _address(arg[5:]), []
                self._say("250 2.1.0 OK")
            elif verb == "RCPT":
                if mail_from is None:
                    self._say("503 5.5.1 MAIL first")
                elif not arg.upper().startswith("TO:"):
                    self._say("501 5.5.4 syntax: RCPT TO:<address>")
                else:
                    rcpts.append(_address(arg[3:]))
                    self._say("250 2.1.5 OK")
            elif verb == "DATA":
                if mail_from is None or not rcpts:
                    self._say("503 5.5.1 RCPT first")
                    continue
                self._say("354 End data with <CR><LF>.<CR><LF>")
                data, too_big = self._read_data()
                if data is None:
                    return
                if too_big:
                    self._say("552 5.3.4 message too big")
                else:
                    message = MailMessage(
                        seq=sink._log.next_seq(),
                        mail_from=mail_from,
                        rcpt_to=list(rcpts),
                        raw=data,
                        received_at=time.time(),
                    )
                    sink._log.add(message)
                    self._say(f"250 2.0.0 OK queued as {message.seq}")
                mail_from, rcpts = None, []
            elif verb == "AUTH":
                self._auth(arg)
            elif verb == "RSET":
                mail_from, rcpts = None, []
                self._say("250 2.0.0 OK")
            elif verb == "NOOP":
                self._say("250 2.0.0 OK")
            elif verb == "VRFY":
                self._say("252 2.0.0 cannot verify, will attempt delivery")
            elif verb == "QUIT":
                self._say("221 2.0.0 bye")
                return
            elif verb == "STARTTLS":
                self._say("454 4.7.0 TLS not available")
            else:
                self._say("502 5.5.2 command not implemented")

    def _auth(self, arg: str) -> None:
        """Accept any credentials (the sink is a test double): PLAIN and LOGIN."""
        mech, _, initial = arg.partition(" ")
        mech = mech.upper()
        if mech == "PLAIN":
            if not initial:
                self._say("334 ")
                if not self.rfile.readline(4097):
                    return
            self._say("235 2.7.0 authentication successful")
        elif mech == "LOGIN":
            if not initial:
                self._say("334 " + base64.b64encode(b"Username:").decode())
                if not self.rfile.readline(4097):
                    return
            self._say("334 " + base64.b64encode(b"Password:").decode())
            if not self.rfile.readline(4097):
                return
            self._say("235 2.7.0 authentication successful")
        else:
            self._say("504 5.5.4 unrecognised authentication type")

    def _read_data(self) -> tuple[bytes | None, bool]:
        chunks: list[bytes] = []
        size = 0
        too_big = False
        while True:
            line = self.rfile.readline(MAX_MESSAGE_BYTES + 2)
            if not line:
                return None, False
            if line in (b".\r\n", b".\n"):
                break
            if line.startswith(b".."):
                line = line[1:]
            size += len(line)
            if size > MAX_MESSAGE_BYTES:
                too_big = True
                chunks.clear()
            elif not too_big:
                chunks.append(line)
        return b"".join(chunks), too_big


def _address(text: str) -> str:
    text = text.strip()
    if text.startswith("<"):
        end = text.find(">")
        return text[1:end] if end > 0 else text[1:]
    return text.split(" ", 1)[0]


class SmtpSink(_Serving[MailMessage]):
    """Accepts every message on an ephemeral SMTP port; ``api_port`` (None = no API) serves MailHog's read API."""

    _what = "SMTP sink"

    def __init__(
        self, bind_host: str = DEFAULT_HOST, port: int = 0, advertise_host: str | None = None, api_port: int | None = 0
    ):
        super().__init__(bind_host, port, advertise_host)
        self.requested_api_port = api_port
        self._api_server: _HttpServer | None = None

    def _open(self) -> None:
        self._serve(_SmtpServer((self.bind_host, self.requested_port), self), "saasbench-smtp-sink")
        if self.requested_api_port is not None:
            try:
                api = _HttpServer((self.bind_host, self.requested_api_port), sink=self)
            except OSError:
                self.stop()
                raise
            self._api_server = api
            self._serve(api, "saasbench-smtp-api")

    def stop(self) -> None:
        self._api_server = None
        super().stop()

    @property
    def api_port(self) -> int | None:
        return None if self._api_server is None else _bound_port(self._api_server)

    @property
    def api_url(self) -> str | None:
        """``http://host:port/api/v2/messages`` (MailHog's messages URL), or None without the API."""
        if self.api_port is None:
            return None
        return f"http://{self._url_host}:{self.api_port}/api/v2/messages"

    def messages(self) -> list[MailMessage]:
        return self._log.snapshot()


# --- per-run instances ---------------------------------------------------------------------------
def receiver_hosts(ctx: RunContext) -> tuple[str, str | None]:
    """(bind host, advertised host or None) for this run; see the module docstring for the order."""
    env = ctx.target.environment  # an Environment (saasbench.environments.base declares both members) or None

    def pick(name: str, declared: Callable[[Any], Any], env_var: str) -> str | None:
        for get in (
            lambda: ctx.vars.get(name),
            lambda: declared(env) if env is not None else None,
            lambda: settings.get(env_var),
        ):
            value = get()  # in order, only as far as needed (a Docker environment asks its engine)
            if isinstance(value, str) and value.strip():
                return value.strip()
        return None

    return (
        pick("receiver_bind_host", lambda e: e.receiver_bind_host, "SAASBENCH_RECEIVER_BIND_HOST") or DEFAULT_HOST,
        pick("receiver_advertise_host", lambda e: e.receiver_advertise_host, "SAASBENCH_RECEIVER_ADVERTISE_HOST"),
    )


WEBHOOK_RESOURCE = "webhook_receiver"
SMTP_RESOURCE = "smtp_sink"


def ensure_webhook_receiver(ctx: RunContext) -> WebhookReceiver:
    """This run's receiver, started on first use (stopped by ``ctx.close()``); seeds the webhook_* variables."""
    receiver = ctx.resources.get(WEBHOOK_RESOURCE)
    if receiver is None or not receiver.running:
        bind, advertise = receiver_hosts(ctx)
        receiver = WebhookReceiver(bind, 0, advertise).start()
        ctx.resources[WEBHOOK_RESOURCE] = receiver
        ctx.add_closer(receiver.stop)
    ctx.vars.update(
        webhook_url=receiver.url,
        webhook_port=receiver.port,
        webhook_host=receiver.advertise_host,
        webhook_base_url=receiver.base_url,
    )
    return receiver


def ensure_smtp_sink(ctx: RunContext) -> SmtpSink:
    """This run's SMTP sink, started on first use (stopped by ``ctx.close()``); seeds the smtp_* variables."""
    sink = ctx.resources.get(SMTP_RESOURCE)
    if sink is None or sink._server is None:
        bind, advertise = receiver_hosts(ctx)
        sink = SmtpSink(bind, 0, advertise, api_port=0).start()
        ctx.resources[SMTP_RESOURCE] = sink
        ctx.add_closer(sink.stop)
    ctx.vars.update(smtp_host=sink.advertise_host, smtp_port=sink.port, smtp_api_url=sink.api_url)
    return sink


def prestart_receivers(ctx: RunContext, values: Any) -> list[str]:
    """Start the receivers that ``values`` (e.g. every step's inputs of a DAG) refer to by placeholder.

    Receivers start lazily in P27/P28; a DAG that uses ``{{webhook_url}}`` in an earlier step
    (registering a webhook subscription with P04 before the P27 that triggers it) needs the
    variables before that. Call this once before running the nodes. Returns what was started.
    """
    from saasbench.dag.placeholders import placeholders_in

    names = {p.strip("{}$").split(".", 1)[0].split("[", 1)[0] for p in placeholders_in(values)}
    started: list[str] = []
    if names & {"webhook_url", "webhook_port", "webhook_host", "webhook_base_url"}:
        ensure_webhook_receiver(ctx)
        started.append(WEBHOOK_RESOURCE)
    if names & {"smtp_host", "smtp_port", "smtp_api_url"}:
        ensure_smtp_sink(ctx)
        started.append(SMTP_RESOURCE)
    return started


# --- standalone services -------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    """``python -m saasbench.services.receivers mock|smtp``: run a receiver until SIGINT/SIGTERM.

    Prints one JSON line with the bound addresses when ready (``--port 0`` takes an ephemeral port).
    """
    parser = argparse.ArgumentParser(prog="python -m saasbench.services.receivers", description=main.__doc__)
    sub = parser.add_subparsers(dest="mode", required=True)
    mock = sub.add_parser("mock", help="the mock-receiver service: POST /hook, POST /always-500, GET/DELETE /history")
    mock.add_argument("--host", default=DEFAULT_HOST, help="bind address (0.0.0.0 inside a container)")
    mock.add_argument("--port", type=int, default=0)
    smtp = sub.add_parser("smtp", help="an SMTP sink with MailHog's read API")
    smtp.add_argument("--host", default=DEFAULT_HOST)
    smtp.add_argument("--port", type=int, default=0, help="SMTP port")
    smtp.add_argument("--api-port", type=int, default=0, help="HTTP port of the MailHog-compatible API")
    args = parser.parse_args(argv)

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    service: WebhookReceiver | SmtpSink
    if args.mode == "mock":
        receiver = WebhookReceiver(args.host, args.port).start()
        service = receiver
        info: dict[str, Any] = {"mode": "mock", "host": args.host, "port": receiver.port, "url": receiver.url}
    else:
        sink = SmtpSink(args.host, args.port, api_port=args.api_port).start()
        service = sink
        info = {
            "mode": "smtp",
            "host": args.host,
            "port": sink.port,
            "api_port": sink.api_port,
            "api_url": sink.api_url,
        }
    print(json.dumps(info), flush=True)
    try:
        stop.wait()
    finally:
        service.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
