"""Headless-browser sessions for the browser primitives (RENDER_DOM, SCREENSHOT, P18, P19).

One Chromium per run, launched lazily on first use and kept in ``ctx.resources["browser"]``;
``ctx.close()`` closes it (and the Playwright driver) through a registered closer. Nothing
else is ever killed: Playwright's own close ends the Chromium it started; only if that close
hangs is the driver process *this* session started killed by its PID.

Playwright runs on a dedicated thread with its own asyncio loop (its async API), so

- every browser operation has a real, enforced deadline (``asyncio.wait_for``; the caller's
  wait is bounded too), whatever the page does: an infinite JS loop, a DOM of millions of
  nodes, a page that never reaches network idle;
- primitives may be called from any thread, and from code that already runs an event loop.

The page under test is untrusted. Every step gets a fresh browser context carrying the active
identity (its cookie jar and its auth headers) and these limits:

- requests (and WebSockets) to hosts other than the app's host are aborted, and the browser's
  resolver cannot resolve other names (``--host-resolver-rules``), so a hostile page cannot
  make the evaluator's machine fetch the outside world; service workers are blocked;
- downloads are refused, JS dialogs (alert/confirm/prompt/beforeunload) dismissed, pop-ups
  closed, the V8 heap per page capped;
- the DOM is read in an isolated JS world (page scripts cannot tamper with the serialiser) and
  capped in the renderer before it crosses the pipe; a page whose JS blocks the renderer gets
  its running script terminated (CDP ``Runtime.terminateExecution``) before the DOM is read;
- the DOM is sanitised with a real HTML parser (:func:`sanitize_html`), never evaluated.

Evidence files (sanitised ``.html``, ``.png``) go to ``ctx.vars["evidence_dir"]`` when set,
else to a per-run temporary directory (``ctx.resources["evidence_dir"]``) that is kept after
the run so the report's pointers stay valid.
"""

from __future__ import annotations

import asyncio
import hashlib
import html as _html
import ipaddress
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urljoin, urlsplit

from saasbench import settings

if TYPE_CHECKING:
    from saasbench.evaluation.context import RunContext
    from saasbench.services.http import Identity

T = TypeVar("T")

PLAYWRIGHT_PIN = "playwright==1.65.2"
CHROMIUM_ENV = "SAASBENCH_CHROMIUM"  # path of a Chromium binary, when not /usr/bin/chromium
CHROMIUM_CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
CHROMIUM_ARGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
    "--disable-dev-shm-usage",
    "--disable-extensions",
    "--mute-audio",
    "--deny-permission-prompts",
    "--no-proxy-server",
    "--js-flags=--max-old-space-size=512",
)
DEFAULT_VIEWPORT = {"width": 1440, "height": 900}
DEFAULT_MAX_CHARS = 200_000
MIN_DOM_CHARS = 200  # RENDER_DOM passes when the sanitised DOM is longer than this
MIN_PNG_BYTES = 1024  # SCREENSHOT passes when the PNG has at least this many bytes
MAX_SCREENSHOT_HEIGHT = 10_000  # full-page screenshots are clipped to this many CSS pixels
LAUNCH_TIMEOUT_S = 30.0
CLOSE_TIMEOUT_S = 10.0
CAPTURE_RESERVE_S = 3.0  # part of a step's budget kept for reading the DOM after waiting
LOOPBACK = frozenset({"localhost", "127.0.0.1", "::1", "[::1]"})
# Navigation errors that mean "the app did not answer" (unreachable), not "the app answered badly".
UNREACHABLE_ERRORS = (
    "ERR_CONNECTION_REFUSED",
    "ERR_CONNECTION_RESET",
    "ERR_CONNECTION_CLOSED",
    "ERR_CONNECTION_TIMED_OUT",
    "ERR_TIMED_OUT",
    "ERR_NAME_NOT_RESOLVED",
    "ERR_ADDRESS_UNREACHABLE",
    "ERR_EMPTY_RESPONSE",
    "ERR_CONNECTION_FAILED",
    "ERR_NETWORK_CHANGED",
    "ERR_INTERNET_DISCONNECTED",
    "ERR_SOCKET_NOT_CONNECTED",
    "ERR_NAME_RESOLUTION_FAILED",
)


class BrowserUnavailable(RuntimeError):
    """No usable Playwright/Chromium: an environment problem, so the engine reports ERROR."""


class BrowserTimeout(Exception):
    """A browser operation did not finish within its deadline."""


# --- URLs and hosts --------------------------------------------------------------------------------
def host_of(url: str) -> str:
    try:
        return (urlsplit(url).hostname or "").lower()
    except ValueError:
        return ""


def allowed_hosts_for(base_url: str | None, first_url: str | None = None) -> frozenset[str]:
    """The app's host (any port), plus every loopback name when the app is on loopback."""
    host = host_of(base_url or "") or host_of(first_url or "")
    if not host:
        return frozenset()
    if host in LOOPBACK or _is_loopback_ip(host):
        return frozenset(LOOPBACK | {host})
    return frozenset({host})


def _is_loopback_ip(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def url_allowed(url: str, allowed: frozenset[str]) -> bool:
    """http(s)/ws(s) URLs must point at an allowed host; other schemes are not network fetches."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return False
    if parts.scheme not in ("http", "https", "ws", "wss"):
        return True  # data:, blob:, about: (file: and chrome: are refused by Chromium itself for web pages)
    host = (parts.hostname or "").lower()
    return host in allowed


def absolute_url(ctx: RunContext, url: str) -> str:
    """Relative URLs are joined to the base URL; absolute http(s) URLs are kept."""
    url = url.strip()
    if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", url):
        return url
    base = ctx.target.base_url or ctx.vars.get("base_url")
    if not base:
        return url
    return urljoin(str(base).rstrip("/") + "/", url.lstrip("/"))


def check_url(ctx: RunContext, url: str) -> str | None:
    """Why ``url`` may not be opened (not http(s), not the app's host), or None."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        return f"refusing to open {url!r}: only http(s) URLs of the app are opened"
    allowed = allowed_hosts_for(ctx.target.base_url or ctx.vars.get("base_url"), url)
    if not url_allowed(url, allowed):
        return f"refusing to open {url!r}: host {parts.hostname!r} is not the app's host ({', '.join(sorted(allowed))})"
    return None


# --- the DOM sanitiser -----------------------------------------------------------------------------
DROP_ELEMENTS = frozenset(
    {
        "script",
        "style",
        "noscript",
        "svg",
        "iframe",
        "template",
        "object",
        "embed",
        "math",
        "frame",
        "frameset",
        "base",
        "applet",
        "portal",
    }
)
VOID_ELEMENTS = frozenset(
    {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "param", "source", "track", "wbr"}
)
URL_ATTRS = frozenset(
    {"href", "src", "action", "formaction", "xlink:href", "poster", "data", "background", "cite", "srcset", "ping"}
)
_JS_URL_RE = re.compile(r"^\s*(?:javascript|vbscript)\s*:", re.IGNORECASE)
_CTRL_RE = re.compile(r"[\x00-\x20]+")
_WS_RE = re.compile(r"\s+")
_BAD_STYLE_RE = re.compile(r"javascript\s*:|expression\s*\(|-moz-binding|behavior\s*:", re.IGNORECASE)
DATA_URL_KEEP = 64  # long data: URLs (inline images) are cut: they only spend the character budget


class _Sanitiser(HTMLParser):
    def __init__(self, strip_classes: bool, limit: int):
        super().__init__(convert_charrefs=True)
        self.strip_classes = strip_classes
        self.limit = limit
        self.out: list[str] = []
        self.size = 0
        self.skip: list[str] = []  # open dropped elements (their contents are dropped)
        self.full = False

    def _emit(self, text: str) -> None:
        if self.full or not text:
            return
        self.out.append(text)
        self.size += len(text)
        if self.size >= self.limit:
            self.full = True

    def _attrs(self, attrs: list[tuple[str, str | None]]) -> str:
        parts: list[str] = []
        for name, value in attrs:
            name = name.lower()
            if name.startswith("on") or name in ("srcdoc", "nonce", "integrity"):
                continue
            if self.strip_classes and name in ("class", "style"):
                continue
            if value is None:
                parts.append(f" {name}")
                continue
            if name == "style" and _BAD_STYLE_RE.search(value):
                continue
            if name in URL_ATTRS:
                if _JS_URL_RE.match(_CTRL_RE.sub("", value)):
                    continue
                if value.lower().startswith("data:") and len(value) > DATA_URL_KEEP:
                    value = value[:DATA_URL_KEEP] + "..."
            value = _WS_RE.sub(" ", value).strip()
            parts.append(f' {name}="{_html.escape(value, quote=True)}"')
        return "".join(parts)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if self.skip:
            if tag == self.skip[-1] or tag in DROP_ELEMENTS and tag not in VOID_ELEMENTS:
                self.skip.append(tag)
            return
        if tag in DROP_ELEMENTS:
            if tag not in VOID_ELEMENTS:
                self.skip.append(tag)
            return
        if tag == "meta" and any(name.lower() == "http-equiv" for name, _ in attrs):
            return  # meta refresh / set-cookie: active content
        self._emit(f"<{tag}{self._attrs(attrs)}>")

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if self.skip or tag in DROP_ELEMENTS or (tag == "meta" and any(n.lower() == "http-equiv" for n, _ in attrs)):
            return
        self._emit(f"<{tag}{self._attrs(attrs)}>")

    def handle_endtag(self, tag: str) -> None:
        if self.skip:
            if tag in self.skip:
                while self.skip and self.skip.pop() != tag:
                    pass
            return
        if tag in DROP_ELEMENTS or tag in VOID_ELEMENTS:
            return
        self._emit(f"</{tag}>")

    def handle_data(self, data: str) -> None:
        if self.skip:
            return
        text = _WS_RE.sub(" ", data)
        if text.strip() or (self.out and not self.out[-1].endswith(" ")):
            self._emit(_html.escape(text, quote=False))

    # comments, <!DOCTYPE>, <?pi?> and CDATA are dropped
    def handle_comment(self, data: str) -> None:
        pass

    def handle_decl(self, decl: str) -> None:
        pass

    def handle_pi(self, data: str) -> None:
        pass

    def unknown_decl(self, data: str) -> None:
        pass


def sanitize_html(raw: str, *, strip_classes: bool = False, max_chars: int = DEFAULT_MAX_CHARS) -> tuple[str, bool]:
    """Sanitised HTML and whether it was cut at ``max_chars``.

    Drops script/style/noscript/svg/iframe/template/object/embed elements with their contents,
    ``<base>`` and ``<meta http-equiv>`` (refresh), comments and declarations, ``on*`` event attributes, ``style`` and ``srcdoc`` attributes and
    ``javascript:`` URLs; cuts long ``data:`` URLs; optionally drops ``class`` attributes;
    collapses whitespace. Pure text processing: nothing from the page is evaluated.
    """
    parser = _Sanitiser(strip_classes, max(1, max_chars))
    try:
        parser.feed(raw)
        parser.close()
    except Exception:  # noqa: BLE001 - html.parser is lenient; never let odd markup crash a step
        pass
    text = "".join(parser.out).strip()
    text = re.sub(r">\s+<", "> <", text)
    truncated = parser.full or len(text) > max_chars
    return text[:max_chars], truncated


# --- evidence files --------------------------------------------------------------------------------
def evidence_dir(ctx: RunContext) -> Path:
    configured = ctx.vars.get("evidence_dir")
    if isinstance(configured, (str, Path)) and str(configured):
        path = Path(configured)
    else:
        existing = ctx.resources.get("evidence_dir")
        if existing is None:
            existing = tempfile.mkdtemp(prefix="saasbench-evidence-")
            ctx.resources["evidence_dir"] = existing
        path = Path(existing)
    path.mkdir(parents=True, exist_ok=True)
    return path


_SLUG_RE = re.compile(r"[^A-Za-z0-9._-]+")


def _slug(text: str, limit: int = 60) -> str:
    slug = _SLUG_RE.sub("-", text).strip("-._")
    return (slug or "page")[:limit]


def save_evidence(ctx: RunContext, name: str, data: bytes | str, ext: str) -> dict[str, Any]:
    """Write one evidence file; returns its pointer {path, bytes, sha256}."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    seq = int(ctx.resources.get("browser_evidence_seq", 0)) + 1
    ctx.resources["browser_evidence_seq"] = seq
    path = evidence_dir(ctx) / f"{seq:03d}-{_slug(name)}.{ext}"
    path.write_bytes(raw)
    return {"path": str(path), "bytes": len(raw), "sha256": hashlib.sha256(raw).hexdigest()}


def url_slug(url: str) -> str:
    parts = urlsplit(url)
    return _slug((parts.path or "/").strip("/").replace("/", "_") or "root")


# --- the session -----------------------------------------------------------------------------------
def find_chromium() -> str | None:
    configured = settings.get(CHROMIUM_ENV)
    if configured:
        return configured
    for name in CHROMIUM_CANDIDATES:
        found = shutil.which(name)
        if found:
            return found
    return None


@dataclass
class Guard:
    """What the context's request guard and page handlers saw (reported as evidence)."""

    allowed: frozenset[str]
    blocked_count: int = 0
    blocked: list[str] = field(default_factory=list)  # the first few blocked URLs (a page may send millions)
    blocked_navigation: list[str] = field(default_factory=list)
    dialogs: int = 0
    popups: int = 0
    downloads: int = 0
    crashed: bool = False

    def block(self, url: str, *, navigation: bool = False) -> None:
        self.blocked_count += 1
        if len(self.blocked) < 20:
            self.blocked.append(url[:500])
        if navigation and len(self.blocked_navigation) < 5:
            self.blocked_navigation.append(url[:500])

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.blocked_count:
            out["blocked_requests"] = self.blocked_count
            out["blocked_examples"] = [u[:200] for u in self.blocked[:5]]
        if self.blocked_navigation:
            out["blocked_navigation"] = [u[:200] for u in self.blocked_navigation[:3]]
        for name in ("dialogs", "popups", "downloads"):
            if getattr(self, name):
                out[f"{name}_dismissed"] = getattr(self, name)
        if self.crashed:
            out["page_crashed"] = True
        return out


class BrowserSession:
    """One Chromium (through Playwright's async API) on a private thread with its own loop."""

    def __init__(self, allowed_hosts: frozenset[str] = frozenset(), ports: tuple[int, ...] = ()):
        self.allowed_hosts = allowed_hosts
        self.ports = ports  # the app's ports, allowed even when Chromium deems them unsafe (6000, 6666...)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run_loop, name="saasbench-browser", daemon=True)
        self._thread.start()
        self._playwright: Any = None
        self._browser: Any = None
        self._closed = False
        self.launch_s: float | None = None
        self.version: str | None = None

    def _run_loop(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_forever()

    # --- running work on the browser thread ---------------------------------------------------
    def run(self, make: Callable[[], Awaitable[T]], timeout_s: float) -> T:
        """Run ``make()`` on the browser loop; at most ``timeout_s`` (raises BrowserTimeout)."""
        if self._closed:
            raise BrowserUnavailable("the browser session is closed")

        async def bounded() -> T:
            return await asyncio.wait_for(make(), timeout=max(0.05, timeout_s))

        future = asyncio.run_coroutine_threadsafe(bounded(), self._loop)
        try:
            return future.result(timeout=max(0.05, timeout_s) + 10.0)  # room for the cancelled job's cleanup
        except (TimeoutError, FutureTimeout) as exc:
            future.cancel()
            raise BrowserTimeout(f"browser operation exceeded {timeout_s:.1f}s") from exc

    def browser(self, timeout_s: float = LAUNCH_TIMEOUT_S) -> Any:
        """The Playwright Browser, launched on first use (raises BrowserUnavailable)."""
        if self._browser is not None and self._browser.is_connected():
            return self._browser
        try:
            self.run(self._launch, timeout_s)
        except BrowserTimeout as exc:
            raise BrowserUnavailable(f"Chromium did not start within {timeout_s:.0f}s") from exc
        return self._browser

    async def _launch(self) -> None:
        try:
            from playwright.async_api import async_playwright
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise BrowserUnavailable(f"the browser primitives need Playwright: pip install {PLAYWRIGHT_PIN}") from exc
        started = time.monotonic()
        if self._browser is not None:  # disconnected (crashed): drop it and start again
            await self._shutdown()
        executable = find_chromium()
        args = list(CHROMIUM_ARGS)
        rules = self._resolver_rules()
        if rules:
            args.append(f"--host-resolver-rules={rules}")
        if self.ports:
            args.append("--explicitly-allowed-ports=" + ",".join(str(p) for p in self.ports))
        self._playwright = await async_playwright().start()
        try:
            self._browser = await self._playwright.chromium.launch(
                executable_path=executable,
                headless=True,
                args=args,
                handle_sigint=False,
                handle_sigterm=False,
                handle_sighup=False,
                timeout=LAUNCH_TIMEOUT_S * 1000,
            )
        except Exception as exc:
            await self._stop_playwright()
            hint = "" if executable else " (no chromium found: apt-get install chromium, or set SAASBENCH_CHROMIUM)"
            raise BrowserUnavailable(f"cannot launch Chromium{hint}: {str(exc).splitlines()[0][:300]}") from exc
        self.launch_s = round(time.monotonic() - started, 3)
        self.version = self._browser.version

    def _resolver_rules(self) -> str:
        """Only the app's host names (and IP literals) resolve; everything else is NOTFOUND."""
        if not self.allowed_hosts:
            return ""
        names = sorted({f"[{h.strip('[]')}]" if ":" in h else h for h in self.allowed_hosts if h})
        return ", ".join(["MAP * ~NOTFOUND", *(f"EXCLUDE {h}" for h in names)])

    # --- contexts -------------------------------------------------------------------------------
    async def new_context(
        self,
        *,
        identity: Identity | None,
        base_url: str | None,
        viewport: dict[str, int] | None,
        javascript: bool = True,
        block_all: bool = False,
    ) -> tuple[Any, Guard]:
        """A fresh context with the identity's cookies and headers, the host guard and handlers."""
        browser = self._browser
        if browser is None or not browser.is_connected():
            await self._launch()
            browser = self._browser
        guard = Guard(allowed=frozenset() if block_all else self.allowed_hosts)
        headers = {
            str(k): str(v)
            for k, v in (identity.headers if identity is not None else {}).items()
            if k.lower() not in ("cookie", "host", "content-length")
        }
        context = await browser.new_context(
            viewport=viewport or DEFAULT_VIEWPORT,
            accept_downloads=False,
            java_script_enabled=javascript,
            extra_http_headers=headers or None,
            service_workers="block",
            ignore_https_errors=True,
            user_agent=None,
            bypass_csp=False,
        )
        cookies = identity_cookies(identity, base_url)
        if cookies:
            await context.add_cookies(cookies)

        def blocked(url: str) -> bool:
            return not url_allowed(url, guard.allowed)

        async def abort(route: Any) -> None:
            request = route.request
            try:
                navigation = request.is_navigation_request() and request.frame.parent_frame is None
            except Exception:  # noqa: BLE001 - the page, context or browser may already be gone; a probe failure is not the step's result
                navigation = False
            guard.block(request.url, navigation=navigation)
            try:
                await route.abort("blockedbyclient")
            except Exception:  # noqa: BLE001 - the page, context or browser may already be gone; a probe failure is not the step's result
                pass

        await context.route(blocked, abort)
        if hasattr(context, "route_web_socket"):

            async def ws_abort(ws: Any) -> None:  # never connected to the server: the socket is mocked, then closed
                guard.block(ws.url)
                try:
                    await ws.close()
                except Exception:  # noqa: BLE001 - the page, context or browser may already be gone; a probe failure is not the step's result
                    pass

            try:
                await context.route_web_socket(blocked, ws_abort)
            except Exception:  # noqa: BLE001 - the page, context or browser may already be gone; a probe failure is not the step's result
                pass

        def on_page(page: Any) -> None:
            attach_page_handlers(page, guard)
            if getattr(context, "_saasbench_main", None) is not None and page is not context._saasbench_main:
                guard.popups += 1
                asyncio.ensure_future(quietly(page.close()))

        context.on("page", on_page)
        return context, guard

    async def new_page(self, context: Any) -> Any:
        """The context's page, with a CDP session attached before any page script runs (attaching
        to a renderer busy in a script is unreliable; ``read_dom`` needs it to stop such scripts)."""
        page = await context.new_page()
        context._saasbench_main = page
        try:
            page._saasbench_cdp = await asyncio.wait_for(context.new_cdp_session(page), 5.0)
        except Exception:  # noqa: BLE001 - the page, context or browser may already be gone; a probe failure is not the step's result
            page._saasbench_cdp = None
        return page

    # --- closing --------------------------------------------------------------------------------
    async def _stop_playwright(self) -> None:
        if self._playwright is not None:
            try:
                await asyncio.wait_for(self._playwright.stop(), CLOSE_TIMEOUT_S)
            except Exception:  # noqa: BLE001 - the page, context or browser may already be gone; a probe failure is not the step's result
                pass
            self._playwright = None

    async def _shutdown(self) -> None:
        browser, self._browser = self._browser, None
        if browser is not None:
            try:
                await asyncio.wait_for(browser.close(), CLOSE_TIMEOUT_S)
            except Exception:  # noqa: BLE001 - the page, context or browser may already be gone; a probe failure is not the step's result
                pass
        await self._stop_playwright()

    def _driver_process(self) -> Any:
        """The Playwright driver this session started (a private attribute; best effort)."""
        try:
            return self._playwright._connection._transport._proc
        except Exception:  # noqa: BLE001 - the page, context or browser may already be gone; a probe failure is not the step's result
            return None

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        driver = self._driver_process()
        try:
            future = asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop)
            future.result(timeout=2 * CLOSE_TIMEOUT_S + 5)
        except Exception:  # noqa: BLE001 - the page, context or browser may already be gone; a probe failure is not the step's result
            # Graceful close hung: end the driver *this session* started (Chromium exits when its
            # pipe to the driver closes). Never a broad kill.
            if driver is not None and getattr(driver, "returncode", 0) is None:
                try:
                    driver.kill()
                except Exception:  # noqa: BLE001 - the page, context or browser may already be gone; a probe failure is not the step's result
                    pass
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        if not self._thread.is_alive():
            self._loop.close()


def _ports(base_url: str | None) -> tuple[int, ...]:
    try:
        port = urlsplit(base_url or "").port
    except ValueError:
        return ()
    return (port,) if port else ()


def _looks_like_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
        return True
    except ValueError:
        return False


async def quietly(awaitable: Awaitable[Any]) -> None:
    try:
        await awaitable
    except Exception:  # noqa: BLE001 - the page, context or browser may already be gone; a probe failure is not the step's result
        pass


def attach_page_handlers(page: Any, guard: Guard) -> None:
    """Dismiss dialogs, refuse downloads, note crashes."""

    def on_dialog(dialog: Any) -> None:
        guard.dialogs += 1
        asyncio.ensure_future(quietly(dialog.dismiss()))

    def on_download(download: Any) -> None:
        guard.downloads += 1
        asyncio.ensure_future(quietly(download.cancel()))

    def on_crash(_page: Any) -> None:
        guard.crashed = True

    page.on("dialog", on_dialog)
    page.on("download", on_download)
    page.on("crash", on_crash)


def identity_cookies(identity: Identity | None, base_url: str | None) -> list[dict[str, Any]]:
    """The identity's cookies for the app's host, in Playwright's ``add_cookies`` form."""
    if identity is None or not base_url:
        return []
    host = host_of(base_url)
    if not host:
        return []
    out: list[dict[str, Any]] = []
    for cookie in identity.cookies.jar:
        domain = (cookie.domain or "").lstrip(".").lower()
        if domain.endswith(".local") and domain[: -len(".local")] == host:  # cookiejar's name for dotless hosts
            domain = host
        if domain and domain != host and not host.endswith("." + domain):
            continue  # a cookie of another site never goes to the app
        entry: dict[str, Any] = {
            "name": cookie.name,
            "value": cookie.value or "",
            "domain": host,
            "path": cookie.path or "/",
            "secure": bool(cookie.secure),
            "httpOnly": bool(cookie.has_nonstandard_attr("HttpOnly") or cookie.has_nonstandard_attr("httponly")),
            "sameSite": "Lax",
        }
        if cookie.expires:
            entry["expires"] = float(cookie.expires)
        out.append(entry)
    return out


def session_for(ctx: RunContext) -> BrowserSession:
    """The run's browser session (created on first use, closed when the run closes)."""
    session = ctx.resources.get("browser")
    if isinstance(session, BrowserSession) and not session._closed:
        return session
    base = ctx.target.base_url or ctx.vars.get("base_url")
    session = BrowserSession(allowed_hosts_for(base), ports=_ports(base))
    ctx.resources["browser"] = session
    ctx.add_closer(session.close)
    return session


# --- rendering one page -----------------------------------------------------------------------------
@dataclass
class Rendered:
    """One page load: what answered, the raw (capped) DOM and why it failed, if it did."""

    url: str
    final_url: str = ""
    status: int | None = None
    raw_html: str | None = None
    raw_chars: int = 0
    raw_truncated: bool = False
    error: str | None = None
    unreachable: bool = False
    notes: list[str] = field(default_factory=list)
    elapsed_ms: float = 0.0

    def evidence(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "url": self.url,
            "final_url": self.final_url,
            "status": self.status,
            "elapsed_ms": round(self.elapsed_ms, 1),
        }
        if self.raw_html is not None:
            out["raw_dom_chars"] = self.raw_chars
        if self.raw_truncated:
            out["raw_dom_truncated"] = True
        if self.notes:
            out["notes"] = self.notes
        if self.error:
            out["error"] = self.error
        return out


class Deadline:
    def __init__(self, seconds: float):
        self.end = time.monotonic() + max(0.05, seconds)

    def left(self, reserve: float = 0.0) -> float:
        return max(0.05, self.end - time.monotonic() - reserve)

    def ms(self, reserve: float = 0.0) -> float:
        return round(self.left(reserve) * 1000)

    def expired(self) -> bool:
        return time.monotonic() >= self.end


_CAPTURE_JS = """(() => {
  const limit = %d;
  const root = document.documentElement;
  if (!root) return {html: "", length: 0};
  const html = root.outerHTML;
  return {html: html.length > limit ? html.slice(0, limit) : html, length: html.length};
})()"""


def raw_limit(max_chars: int) -> int:
    """How much raw DOM may leave the renderer: room for scripts and styles the sanitiser drops."""
    return max(1_000_000, min(max_chars * 10, 10_000_000))


async def read_dom(page: Any, limit: int, timeout_s: float) -> tuple[str, int]:
    """The page's HTML (at most ``limit`` chars) and its full length, read in an isolated world.

    Page scripts cannot redefine the serialiser there. If the renderer is busy (a page script
    that never yields), the running script is terminated and the read tried again.
    """
    deadline = Deadline(timeout_s)
    cdp = getattr(page, "_saasbench_cdp", None)

    async def once(wait: float) -> tuple[str, int]:
        if cdp is not None:
            tree = await asyncio.wait_for(cdp.send("Page.getFrameTree"), wait)
            world = await asyncio.wait_for(
                cdp.send(
                    "Page.createIsolatedWorld",
                    {"frameId": tree["frameTree"]["frame"]["id"], "worldName": "saasbench-dom"},
                ),
                wait,
            )
            reply = await asyncio.wait_for(
                cdp.send(
                    "Runtime.evaluate",
                    {
                        "expression": _CAPTURE_JS % limit,
                        "contextId": world["executionContextId"],
                        "returnByValue": True,
                    },
                ),
                wait,
            )
            if reply.get("exceptionDetails"):
                raise RuntimeError(
                    "Execution was terminated"
                    if "terminat" in str(reply["exceptionDetails"]).lower()
                    else "the page's DOM could not be serialised"
                )
            value = (reply.get("result") or {}).get("value")
        else:
            value = await asyncio.wait_for(page.evaluate(_CAPTURE_JS % limit), wait)
        if not isinstance(value, dict) or not isinstance(value.get("html"), str):
            raise RuntimeError("the page's DOM could not be serialised")
        return value["html"], int(value.get("length") or len(value["html"]))

    try:
        return await once(min(3.0, max(0.5, deadline.left() / 3)))
    except TimeoutError:
        if cdp is None:
            raise
    # the renderer is busy: stop the running script (V8 TerminateExecution), then read again
    await asyncio.wait_for(cdp.send("Runtime.terminateExecution"), min(2.0, deadline.left()))
    for attempt in range(3):
        try:
            return await once(deadline.left())
        except RuntimeError as exc:
            if attempt == 2 or "terminated" not in str(exc).lower():
                raise  # a pending termination may hit our own read once; then read again
    raise AssertionError("unreachable: the last attempt returns or raises")


def classify_navigation_error(url: str, exc: BaseException, seconds: float) -> tuple[str, bool]:
    """(message, unreachable) for a failed page.goto."""
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if type(exc).__name__ == "TimeoutError" or isinstance(exc, asyncio.TimeoutError):
        return f"GET {url}: no response within {seconds:.1f}s (timeout)", True
    code = re.search(r"net::(ERR_[A-Z_]+)", text)
    if code and code.group(1) == "ERR_BLOCKED_BY_CLIENT":
        return f"GET {url}: blocked (not the app's host)", False
    if code and code.group(1) in UNREACHABLE_ERRORS:
        return f"GET {url}: cannot connect ({code.group(1)})", True
    return f"GET {url}: navigation failed: {text[:300]}", False


async def load_page(
    page: Any,
    url: str,
    *,
    deadline: Deadline,
    wait_until: str = "networkidle",
    wait_for_selector: str | None = None,
    settle_ms: float = 0,
    guard: Guard | None = None,
    capture_limit: int | None = None,
    fail_status: int = 400,
) -> Rendered:
    """Navigate, wait (best effort for the load state), settle, and read the DOM if asked.

    - no answer (refused, DNS, timeout before the response) -> ``error`` + ``unreachable``;
    - an answer with status >= ``fail_status`` -> ``error`` (the DOM is still read);
    - the load state not reached in time -> a note (pages that poll never reach network idle);
    - ``wait_for_selector`` not found in time -> ``error``;
    - the page navigated away to a blocked host -> ``error``.
    """
    started = time.monotonic()
    out = Rendered(url=url)
    total = deadline.left()
    reserve = min(CAPTURE_RESERVE_S, max(1.0, total / 3))
    try:
        response = await page.goto(url, wait_until="commit", timeout=deadline.ms(reserve))
    except Exception as exc:  # noqa: BLE001 - the page, context or browser may already be gone; a probe failure is not the step's result
        out.error, out.unreachable = classify_navigation_error(url, exc, total)
        out.elapsed_ms = (time.monotonic() - started) * 1000
        out.final_url = _page_url(page)
        return out
    if response is not None:
        out.status = response.status
    if wait_until != "commit":
        try:
            await page.wait_for_load_state(wait_until, timeout=deadline.ms(reserve))
        except Exception:  # noqa: BLE001 - the page, context or browser may already be gone; a probe failure is not the step's result
            out.notes.append(f"load state {wait_until!r} not reached within the budget; the page was read as it was")
    if wait_for_selector and out.error is None:
        try:
            await page.wait_for_selector(wait_for_selector, state="attached", timeout=deadline.ms(reserve))
        except Exception as exc:  # noqa: BLE001 - the page, context or browser may already be gone; a probe failure is not the step's result
            out.error = f"selector {wait_for_selector!r} did not appear on {url}: {str(exc).splitlines()[0][:200]}"
    if settle_ms > 0 and not deadline.expired():
        await asyncio.sleep(min(settle_ms / 1000, deadline.left(reserve)))
    out.final_url = _page_url(page)
    if out.status is not None and out.status >= fail_status and out.error is None:
        out.error = f"GET {url} answered {out.status}"
    if guard is not None and guard.blocked_navigation and out.error is None:
        out.error = f"the page tried to navigate to {guard.blocked_navigation[0][:200]!r} (not the app's host; blocked)"
    elif out.error is None and out.final_url and not out.final_url.startswith(("http://", "https://")):
        out.error = f"the page ended on {out.final_url[:200]!r} instead of an app page"
    if guard is not None and guard.crashed:
        out.error = out.error or f"the page at {url} crashed (renderer out of memory or killed)"
    if capture_limit is not None and not (guard is not None and guard.crashed):
        try:
            out.raw_html, out.raw_chars = await read_dom(page, capture_limit, deadline.left())
            out.raw_truncated = out.raw_chars > capture_limit
        except Exception as exc:  # noqa: BLE001 - the page, context or browser may already be gone; a probe failure is not the step's result
            message = (
                "renderer busy (timeout)"
                if isinstance(exc, asyncio.TimeoutError)
                else str(exc).splitlines()[0][:200]
                if str(exc)
                else type(exc).__name__
            )
            out.error = out.error or f"could not read the DOM of {url}: {message}"
    out.elapsed_ms = (time.monotonic() - started) * 1000
    return out


def _page_url(page: Any) -> str:
    try:
        return str(page.url)
    except Exception:  # noqa: BLE001 - the page, context or browser may already be gone; a probe failure is not the step's result
        return ""


async def screenshot_png(page: Any, *, full_page: bool, deadline: Deadline) -> tuple[bytes, list[str]]:
    """A PNG of the page; full-page shots are clipped at MAX_SCREENSHOT_HEIGHT CSS pixels."""
    notes: list[str] = []
    kwargs: dict[str, Any] = {"type": "png", "full_page": full_page, "animations": "disabled", "caret": "hide"}
    if full_page:
        try:
            height = await asyncio.wait_for(
                page.evaluate(
                    "() => Math.max(document.documentElement ? document.documentElement.scrollHeight : 0,"
                    " document.body ? document.body.scrollHeight : 0)"
                ),
                min(3.0, deadline.left()),
            )
            viewport = page.viewport_size or DEFAULT_VIEWPORT
            if isinstance(height, (int, float)) and height > MAX_SCREENSHOT_HEIGHT:
                kwargs["clip"] = {"x": 0, "y": 0, "width": viewport["width"], "height": MAX_SCREENSHOT_HEIGHT}
                notes.append(f"page is {int(height)} px tall; screenshot clipped to {MAX_SCREENSHOT_HEIGHT} px")
        except Exception:  # noqa: BLE001 - the page, context or browser may already be gone; a probe failure is not the step's result
            kwargs["full_page"] = False
            notes.append("page height unavailable (renderer busy); viewport screenshot taken")
    data = await page.screenshot(timeout=deadline.ms(), **kwargs)
    return data, notes
