"""Browser primitives: RENDER_DOM, SCREENSHOT, P18 browser_interaction, P19 dom_assertion.

All four drive the run's one headless Chromium (:mod:`saasbench.services.browser`): each step opens a
fresh browser context carrying the active identity (cookies of its jar for the app's host, its
auth headers), so pages behind a login render as that user; when the auth profile names a
``browser_scheme`` (e.g. a cookie session while the API uses a bearer token), the active role is
logged in with that scheme for the browser instead. Hosts other than the app's are
blocked, downloads refused, dialogs dismissed, every wait bounded by the step's ``timeout_ms``
and the node deadline (``ctx.timeout``).

Outcomes (never an exception for anything the app does):

- the app did not answer (connection refused, DNS, no response in time) -> ``passed=False,
  unreachable=True`` (an llm-judge node is then FAILED, not SKIPPED_LLM);
- the app answered with status >= 400, or a required selector never appeared, or the page
  left the app's host -> ``passed=False`` with a message;
- no usable Chromium/Playwright -> :class:`saasbench.services.browser.BrowserUnavailable` (ERROR: an
  environment problem, not the app's failure).

Captures (``ctx.capture``: visible to the node's later steps, placeholders and the run):
``rendered_dom`` (sanitised HTML, what P17 ``evidence_type: rendered_dom`` reads),
``rendered_dom_url``, ``rendered_dom_length``; SCREENSHOT appends to ``screenshots`` (PNG
paths, what P17 ``evidence_type: screenshot`` reads) and ``screenshot_urls``; P18 sets
``last_page_html`` (and ``rendered_dom``) and ``last_screenshot_path`` when it takes one.

Unlike the reference harness, these primitives run whether or not an LLM judge is configured
(the reference returns pass without doing anything when ``LLM_API_KEY`` is blank), and RENDER_DOM
accepts the multi-page form ``urls`` that the reference rejects.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any, Literal

import httpx
from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from saasbench.dag import note, warn
from saasbench.evaluation.context import RunContext
from saasbench.evaluation.results import StepResult
from saasbench.primitives.browser_steps import _ACTION_ALIASES, BrowserStep, _alias, normalise_steps, scoped
from saasbench.primitives.registry import PrimitiveInputs, primitive, rename_aliases
from saasbench.services.auth import LoginFailed
from saasbench.services.browser import (
    DEFAULT_MAX_CHARS,
    LAUNCH_TIMEOUT_S,
    MIN_DOM_CHARS,
    MIN_PNG_BYTES,
    BrowserSession,
    BrowserTimeout,
    Deadline,
    Guard,
    Rendered,
    absolute_url,
    check_url,
    load_page,
    quietly,
    raw_limit,
    read_dom,
    sanitize_html,
    save_evidence,
    screenshot_png,
    session_for,
    url_slug,
)
from saasbench.services.http import Identity

WaitUntil = Literal["load", "domcontentloaded", "networkidle", "commit"]
_WAIT_ALIASES = {
    "networkidle0": "networkidle",
    "networkidle2": "networkidle",
    "network_idle": "networkidle",
    "domcontentload": "domcontentloaded",
    "dom": "domcontentloaded",
    "domready": "domcontentloaded",
}
CONTEXT_CLOSE_S = 5.0
DEFAULT_ACTION_TIMEOUT_MS = 10000.0
RUN_MARGIN_S = CONTEXT_CLOSE_S + 1.0


# --- shared inputs ---------------------------------------------------------------------------------
def _viewport(value: Any) -> Any:
    """{width, height}, "1440x900" or [1440, 900] -> {width, height}."""
    if value is None:
        return None
    if isinstance(value, str):
        m = re.fullmatch(r"\s*(\d+)\s*[x×,*]\s*(\d+)\s*", value)
        if m:
            return {"width": int(m.group(1)), "height": int(m.group(2))}
    if isinstance(value, (list, tuple)) and len(value) == 2:
        return {"width": value[0], "height": value[1]}
    return value


class Viewport(BaseModel):
    width: int = Field(default=1440, ge=200, le=4096)
    height: int = Field(default=900, ge=200, le=4096)


class PageInputs(PrimitiveInputs):
    """What every browser primitive accepts about loading a page and whose page it is."""

    wait_until: WaitUntil = Field(
        default="networkidle",
        description="Load state to wait for (best effort: a page that "
        "never reaches it is read as it is when the budget runs out)",
    )
    timeout_ms: float = Field(default=15000, gt=0, description="Budget per page; bounded by the node deadline")
    settle_ms: float = Field(default=800, ge=0, description="Pause after loading, before reading the page")
    viewport: Viewport = Field(default_factory=Viewport, description="{width, height} or 'WxH'")
    wait_for_selector: str | None = Field(default=None, description="The step fails unless this selector appears")
    max_chars: int = Field(default=DEFAULT_MAX_CHARS, ge=1000, description="Cap on the sanitised DOM kept")
    strip_classes: bool = Field(default=False, description="Drop class and style attributes from the kept DOM")
    as_role: str | None = Field(
        default=None,
        description="Render as this role (logged in through the auth profile; "
        "the active identity is unchanged). Default: the active identity (its role logged in "
        "with the profile's browser_scheme when the profile names one)",
    )
    login_method: str | None = Field(
        default=None,
        description="With as_role: the auth profile scheme to log in with "
        "(e.g. 'form' for a cookie session); default: the profile's browser_scheme, "
        "else its default",
    )
    anonymous: bool = Field(default=False, description="Render with no identity (no cookies, no auth headers)")
    login_credentials: dict[str, str] | None = Field(
        default=None,
        description="Render logged in as this user ({username or email, password}) through the auth "
        "profile (login_method, else its browser_scheme, else its default scheme): as the profile role whose "
        "username/email matches, else as a role named after the user",
    )

    @model_validator(mode="before")
    @classmethod
    def _page_legacy(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        rename_aliases(data, "anonymous", ("skip_auth", "no_auth"))  # no_auth: lzdugafl RENDER_DOM
        if isinstance(data.get("login_as"), dict) and "login_credentials" not in data:
            # aoiwqoiq: "login_as": {"username", "password", "base_url"}; its reference logs in through the
            # app's login form at base_url before loading the page
            given = dict(data.pop("login_as"))
            base = given.pop("base_url", None)
            data["login_credentials"] = {str(k): str(v) for k, v in given.items()}
            note(
                "'login_as {username, password}' -> 'login_credentials' (logged in through the auth profile)"
                + (f"; its base_url {base!r} is not used (the login goes to the app under test)" if base else "")
            )
        rename_aliases(data, "as_role", ("login_as", "role"))
        rename_aliases(data, "login_method", ("auth_method",))
        if "authenticate" in data:
            value = data.pop("authenticate")
            if isinstance(value, str) and value.strip() and value.strip().lower() not in ("true", "false"):
                data.setdefault("as_role", value.strip())
                note("'authenticate: <role>' -> 'as_role'")
            elif value is False or (isinstance(value, str) and value.strip().lower() == "false"):
                data.setdefault("anonymous", True)
                note("'authenticate: false' -> 'anonymous: true'")
            else:
                note("'authenticate: true' -> the active identity (log in first with P13)")
        if "out_dir" in data:
            data.pop("out_dir")
            note("'out_dir' ignored: evidence files go to the run's evidence directory")
        wait = data.get("wait_until")
        if isinstance(wait, str) and wait.strip().lower() in _WAIT_ALIASES:
            data["wait_until"] = _WAIT_ALIASES[wait.strip().lower()]
            note(f"wait_until {wait!r} -> {data['wait_until']!r}")
        if "viewport" in data:
            data["viewport"] = _viewport(data["viewport"])
        return data


# --- shared machinery ------------------------------------------------------------------------------
def _identity(ctx: RunContext, inputs: PageInputs) -> tuple[Identity | None, str | None]:
    """The identity whose cookies/headers the browser carries, or why there is none."""
    if inputs.anonymous:
        return None, None
    if inputs.login_credentials:
        return _credentials_identity(ctx, inputs)
    # as_role, or the active role; logged in with the profile's browser_scheme when it names one
    # (AuthManager.browser_identity); the active identity is left as it was
    role = inputs.as_role or None
    who = repr(role) if role else f"active role {ctx.auth.active.role!r}"
    try:
        return ctx.auth.browser_identity(ctx, role, method=inputs.login_method if role else None), None
    except LoginFailed as exc:
        return None, f"cannot render as {who}: {exc}"
    except (httpx.HTTPError, RuntimeError) as exc:
        return None, f"cannot render as {who}: login request failed: {type(exc).__name__}: {exc}"


_USER_KEYS = ("username", "email", "login", "user", "login_id")


def _credentials_identity(ctx: RunContext, inputs: PageInputs) -> tuple[Identity | None, str | None]:
    """Log in with ``login_credentials`` (the active identity is left as it was)."""
    creds = dict(inputs.login_credentials or {})
    name = next((creds[k] for k in _USER_KEYS if creds.get(k)), None)
    if not name or not creds.get("password"):
        return None, "login_credentials need a username (or email) and a password"
    users = getattr(ctx.auth.profile, "users", {}) or {}
    role = (
        next(
            (r for r, u in users.items() if isinstance(u, dict) and any(str(u.get(k)) == name for k in _USER_KEYS)),
            None,
        )
        or inputs.as_role
        or name
    )
    previous = ctx.auth.active
    try:
        identity = ctx.auth.login(
            ctx, role, method=inputs.login_method or ctx.auth.profile.browser_scheme, credentials=creds
        )
        return (None if identity.role == "anonymous" else identity), None
    except LoginFailed as exc:
        return None, f"cannot render as user {name!r}: {exc}"
    except (httpx.HTTPError, RuntimeError) as exc:
        return None, f"cannot render as user {name!r}: login request failed: {type(exc).__name__}: {exc}"
    finally:
        ctx.auth.active = previous


def _urls(ctx: RunContext, raw: list[str]) -> tuple[list[str], str | None]:
    out: list[str] = []
    for item in raw:
        url = absolute_url(ctx, str(item))
        problem = check_url(ctx, url)
        if problem:
            return out, problem
        out.append(url)
    return out, None


def _budget(ctx: RunContext, inputs: PageInputs) -> float:
    return ctx.timeout(inputs.timeout_ms / 1000)


def _session(ctx: RunContext) -> BrowserSession:
    session = session_for(ctx)
    session.browser(timeout_s=min(LAUNCH_TIMEOUT_S, max(5.0, ctx.remaining())))  # BrowserUnavailable -> ERROR
    return session


def _in_context(
    ctx: RunContext,
    inputs: PageInputs,
    identity: Identity | None,
    work,
    total_s: float,
    *,
    javascript: bool = True,
    block_all: bool = False,
) -> Any:
    """Run ``work(page, guard)`` in a fresh context on the browser thread; the context is always closed."""
    session = _session(ctx)
    base = ctx.target.base_url or ctx.vars.get("base_url")

    async def job() -> Any:
        context, guard = await session.new_context(
            identity=identity,
            base_url=base,
            javascript=javascript,
            viewport=inputs.viewport.model_dump(),
            block_all=block_all,
        )
        try:
            page = await session.new_page(context)
            return await work(page, guard)
        finally:
            await quietly(asyncio.wait_for(context.close(), CONTEXT_CLOSE_S))

    return session.run(job, total_s + RUN_MARGIN_S)


def _dom_of(rendered: Rendered, inputs: PageInputs, max_chars: int) -> tuple[str, bool]:
    if rendered.raw_html is None:
        return "", False
    dom, cut = sanitize_html(rendered.raw_html, strip_classes=inputs.strip_classes, max_chars=max_chars)
    return dom, cut or rendered.raw_truncated


def _separator(url: str) -> str:
    return "<!-- " + url.replace("--", "%2D%2D").replace(">", "%3E") + " -->"


def _timeout_result(what: str, budget: float) -> StepResult:
    return StepResult(passed=False, message=f"{what}: the browser did not finish within {budget:.1f}s; page abandoned")


# --- RENDER_DOM ------------------------------------------------------------------------------------
class RenderDomInputs(PageInputs):
    url: str | None = Field(default=None, description="Page to render: absolute, or relative to the base URL")
    urls: list[str] | None = Field(
        default=None,
        description="Several pages: each rendered, DOMs concatenated with "
        "<!-- url --> separators; every page must render",
    )

    @model_validator(mode="before")
    @classmethod
    def _urls_form(cls, data: Any) -> Any:
        if isinstance(data, dict):
            data = dict(data)
            rename_aliases(data, "url", ("path", "page"))
            if isinstance(data.get("urls"), str):
                data["urls"] = [data["urls"]]
        return data

    @model_validator(mode="after")
    def _one_of(self) -> RenderDomInputs:
        if not self.url and not self.urls:
            raise ValueError("give 'url' or 'urls'")
        return self

    def targets(self) -> list[str]:
        return ([self.url] if self.url else []) + list(self.urls or [])


@primitive("RENDER_DOM", RenderDomInputs)
def render_dom(inputs: RenderDomInputs, ctx: RunContext) -> StepResult:
    """Render page(s) in headless Chromium; keep the sanitised DOM as ``rendered_dom``."""
    urls, problem = _urls(ctx, inputs.targets())
    if problem:
        return StepResult(passed=False, message=problem)
    identity, problem = _identity(ctx, inputs)
    if problem:
        return StepResult(passed=False, message=problem)
    per_page = max(1000, inputs.max_chars // len(urls))
    per_url_s = _budget(ctx, inputs)
    total_s = min(per_url_s * len(urls), max(0.05, ctx.remaining()))

    async def work(page: Any, guard: Guard) -> list[Rendered]:
        done: list[Rendered] = []
        for url in urls:
            deadline = Deadline(ctx.timeout(inputs.timeout_ms / 1000))
            done.append(
                await load_page(
                    page,
                    url,
                    deadline=deadline,
                    wait_until=inputs.wait_until,
                    wait_for_selector=inputs.wait_for_selector,
                    settle_ms=inputs.settle_ms,
                    guard=guard,
                    capture_limit=raw_limit(per_page),
                )
            )
            guard.blocked_navigation.clear()  # a blocked redirect belongs to the page that tried it
        return done

    try:
        pages, guard_summary = _with_guard(ctx, inputs, identity, work, total_s)
    except BrowserTimeout:
        ctx.capture("rendered_dom", "")
        return _timeout_result("RENDER_DOM", total_s)
    parts: list[str] = []
    evidence_pages: list[dict[str, Any]] = []
    for rendered in pages:
        dom, cut = _dom_of(rendered, inputs, per_page)
        item = rendered.evidence()
        item.update(chars=len(dom), truncated=cut)
        if dom:
            item["file"] = save_evidence(ctx, f"dom-{url_slug(rendered.url)}", dom, "html")
        evidence_pages.append(item)
        parts.append(f"{_separator(rendered.url)}\n{dom}" if len(urls) > 1 else dom)
    total = "\n".join(parts)[: inputs.max_chars + 200 * len(urls)]
    ctx.capture("rendered_dom", total)
    ctx.capture("rendered_dom_url", urls[0] if len(urls) == 1 else list(urls))
    ctx.capture("rendered_dom_length", len(total))
    evidence: dict[str, Any] = {"pages": evidence_pages, "chars": len(total), **guard_summary}
    failed = [r for r in pages if r.error]
    value = {
        "url": urls[0] if len(urls) == 1 else list(urls),
        "length": len(total),
        "status": pages[0].status if len(pages) == 1 else [r.status for r in pages],
    }
    if failed:
        first = failed[0]
        return StepResult(
            passed=False,
            unreachable=any(r.unreachable for r in failed),
            value=value,
            evidence=evidence,
            message=first.error if len(urls) == 1 else f"{len(failed)}/{len(urls)} pages failed; first: {first.error}",
        )
    content_chars = sum(len(p) for p in (_dom_of(r, inputs, per_page)[0] for r in pages))
    if content_chars <= MIN_DOM_CHARS:
        return StepResult(
            passed=False,
            value=value,
            evidence=evidence,
            message=f"rendered DOM has only {content_chars} chars after sanitising (needs more than {MIN_DOM_CHARS})",
        )
    where = urls[0] if len(urls) == 1 else f"{len(urls)} pages"
    return StepResult(
        passed=True, value=value, evidence=evidence, message=f"rendered {where}: {len(total)} chars of sanitised DOM"
    )


def _with_guard(
    ctx: RunContext, inputs: PageInputs, identity: Identity | None, work, total_s: float, **kw: Any
) -> tuple[Any, dict[str, Any]]:
    """Like :func:`_in_context`, also returning the guard's summary (blocked requests, dialogs...)."""
    holder: dict[str, Guard] = {}

    async def wrapped(page: Any, guard: Guard) -> Any:
        holder["guard"] = guard
        return await work(page, guard)

    result = _in_context(ctx, inputs, identity, wrapped, total_s, **kw)
    guard = holder.get("guard")
    summary = guard.summary() if guard is not None else {}
    if identity is not None:
        summary["identity"] = identity.role
    return result, summary


# --- SCREENSHOT ------------------------------------------------------------------------------------
class ScreenshotInputs(PageInputs):
    url: str = Field(description="Page to screenshot: absolute, or relative to the base URL")
    name: str = Field(default="shot", description="Evidence file name stem")
    full_page: bool = Field(default=True, description=f"Whole page (clipped at {10_000} px), else the viewport")
    actions: list[BrowserStep] = Field(
        default_factory=list,
        description="Browser steps (as P18 steps) run after the "
        "page loads, before the screenshot; best effort: a failed action is recorded in "
        "the evidence and the screenshot is still taken",
    )

    @model_validator(mode="before")
    @classmethod
    def _aliases(cls, data: Any) -> Any:
        if isinstance(data, dict):
            data = dict(data)
            rename_aliases(data, "url", ("path", "page"))
            rename_aliases(data, "full_page", ("fullPage",))
            rename_aliases(data, "actions", ("steps", "interactions", "before_screenshot"))
            if "actions" in data:
                data["actions"] = normalise_steps(data["actions"], "actions")
        return data


@primitive("SCREENSHOT", ScreenshotInputs)
def screenshot(inputs: ScreenshotInputs, ctx: RunContext) -> StepResult:
    """Screenshot a page (PNG >= 1 KiB passes); appends to ``screenshots``, sets ``rendered_dom``."""
    urls, problem = _urls(ctx, [inputs.url])
    if problem:
        return StepResult(passed=False, message=problem)
    url = urls[0]
    identity, problem = _identity(ctx, inputs)
    if problem:
        return StepResult(passed=False, message=problem)
    pauses_ms = sum(step.wait_ms or 0 for step in inputs.actions)
    budget = ctx.timeout((inputs.timeout_ms + pauses_ms) / 1000)
    done_actions: list[dict[str, Any]] = []

    async def work(page: Any, guard: Guard) -> tuple[Rendered, bytes | None, list[str], str | None]:
        deadline = Deadline(budget)
        rendered = await load_page(
            page,
            url,
            deadline=deadline,
            wait_until=inputs.wait_until,
            wait_for_selector=inputs.wait_for_selector,
            settle_ms=inputs.settle_ms,
            guard=guard,
            capture_limit=raw_limit(inputs.max_chars),
        )
        if rendered.unreachable or rendered.status is None and rendered.error:
            return rendered, None, [], None
        if inputs.actions and not rendered.error:
            extra_shots: list[tuple[str, bytes]] = []
            for index, step in enumerate(inputs.actions):
                problem = await _run_step(page, step, ctx, inputs, deadline, guard, extra_shots)
                done_actions.append(
                    {
                        "index": index,
                        "action": step.action,
                        "passed": problem is None,
                        **({"message": problem} if problem else {}),
                        **({"skipped": step.skipped_action} if step.action == "noop" else {}),
                    }
                )
            try:  # the page after the actions is what the screenshot shows: keep its DOM too
                html, full = await read_dom(page, raw_limit(inputs.max_chars), max(0.5, min(5.0, deadline.left())))
                rendered.raw_html, rendered.raw_chars, rendered.raw_truncated = html, full, full > len(html)
            except Exception:  # noqa: BLE001 - Playwright raises many error types; each becomes the step's message, never a crash
                pass
        try:
            png, notes = await screenshot_png(page, full_page=inputs.full_page, deadline=deadline)
            return rendered, png, notes, None
        except Exception as exc:  # noqa: BLE001 - Playwright raises many error types; each becomes the step's message, never a crash
            return rendered, None, [], str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__

    try:
        (rendered, png, notes, shot_error), guard_summary = _with_guard(ctx, inputs, identity, work, budget)
    except BrowserTimeout:
        return _timeout_result("SCREENSHOT", budget)
    dom, cut = _dom_of(rendered, inputs, inputs.max_chars)
    ctx.capture("rendered_dom", dom)
    ctx.capture("rendered_dom_url", url)
    ctx.capture("rendered_dom_length", len(dom))
    evidence: dict[str, Any] = {**rendered.evidence(), "chars": len(dom), "truncated": cut, **guard_summary}
    if done_actions:
        evidence["actions"] = done_actions
    if notes:
        evidence["screenshot_notes"] = notes
    if png is not None:
        pointer = save_evidence(ctx, inputs.name, png, "png")
        evidence["screenshot"] = pointer
        shots = [*_as_list(ctx.vars.get("screenshots")), pointer["path"]]
        ctx.capture("screenshots", shots)
        ctx.capture("screenshot_urls", [*_as_list(ctx.vars.get("screenshot_urls")), url])
    value = {"url": url, "path": evidence.get("screenshot", {}).get("path"), "bytes": len(png or b"")}
    if rendered.error:
        return StepResult(
            passed=False, unreachable=rendered.unreachable, value=value, evidence=evidence, message=rendered.error
        )
    if png is None:
        return StepResult(
            passed=False,
            value=value,
            evidence=evidence,
            message=f"no screenshot of {url}: {shot_error or 'unknown error'}",
        )
    if len(png) < MIN_PNG_BYTES:
        return StepResult(
            passed=False,
            value=value,
            evidence=evidence,
            message=f"screenshot of {url} is only {len(png)} bytes (needs {MIN_PNG_BYTES})",
        )
    failed = [a for a in done_actions if not a["passed"]]
    tail = (
        f"; {len(failed)}/{len(done_actions)} action(s) failed (best effort), first: {failed[0]['message']}"
        if failed
        else ""
    )
    return StepResult(
        passed=True, value=value, evidence=evidence, message=f"screenshot of {url}: {len(png)} bytes{tail}"
    )


def _as_list(value: Any) -> list[Any]:
    if isinstance(value, (list, tuple)):
        return list(value)
    return [value] if isinstance(value, str) and value else []


# --- P18 browser_interaction -------------------------------------------------------------------------
# Canonical steps and their dialects (navigate, timeout, mouse_move, ...): primitives/browser_steps.py


def _str_list(value: Any) -> Any:
    if value is None:
        return []
    return [value] if isinstance(value, str) else value


class Expectations(BaseModel):
    model_config = ConfigDict(extra="forbid")

    selector_visible: list[str] = Field(default_factory=list)
    text_contains: list[str] = Field(default_factory=list)
    url_contains: list[str] = Field(default_factory=list)

    @field_validator("selector_visible", "text_contains", "url_contains", mode="before")
    @classmethod
    def _listify(cls, value: Any) -> Any:
        return _str_list(value)


class P18Inputs(PageInputs):
    url: str | None = Field(default=None, description="First page (optional when the first step is a goto)")
    steps: list[BrowserStep] = Field(default_factory=list)
    expect: Expectations | None = Field(
        default=None,
        description="{selector_visible, text_contains, url_contains} "
        "checked after the steps (each waits up to action_timeout_ms)",
    )
    action_timeout_ms: float = Field(default=10000, gt=0, description="How long an action waits for its selector")
    screenshot: bool = Field(default=False, description="Screenshot the final page (appends to 'screenshots')")
    name: str = Field(default="interaction", description="Evidence file name stem")

    @model_validator(mode="before")
    @classmethod
    def _legacy_single_action(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        rename_aliases(data, "url", ("path", "page"))
        rename_aliases(data, "expect", ("expected", "expectations"))
        if "action" in data:
            step = {"action": data.pop("action")}
            for key in ("selector", "selector_any_of", "value"):
                if key in data:
                    step[key] = data.pop(key)
            if (
                isinstance(step["action"], str)
                and _ACTION_ALIASES.get(step["action"].strip().lower(), step["action"].strip().lower()) == "goto"
                and not step.get("value")
                and data.get("url")
            ):
                step["action"] = "wait"  # "navigate" to the step's own url: opening it is the first thing P18 does
                if not (step.get("selector") or step.get("selector_any_of")):
                    step = {}  # nothing left to do: no step
            data["steps"] = [*([step] if step else []), *(data.get("steps") or [])]
            note("single 'action'/'selector' -> steps[0]")
        elif "selector" in data or "selector_any_of" in data:
            step = {"action": "wait"}
            for key in ("selector", "selector_any_of"):
                if key in data:
                    step[key] = data.pop(key)
            data["steps"] = [step, *(data.get("steps") or [])]
            note("top-level 'selector' -> a 'wait' step")
        if "wait_ms" in data:
            data.setdefault("action_timeout_ms", data.pop("wait_ms"))
            note("'wait_ms' -> 'action_timeout_ms'")
        if "screenshot_path" in data:
            path = data.pop("screenshot_path")
            data.setdefault("screenshot", True)
            if isinstance(path, str) and path.strip():
                stem = re.sub(
                    r"\.(png|jpe?g)$", "", path.strip().replace("\\", "/").rsplit("/", 1)[-1], flags=re.IGNORECASE
                )
                data.setdefault("name", stem or "interaction")
            note("'screenshot_path' -> 'screenshot: true' (written to the run's evidence directory)")
        if "steps" in data:
            data["steps"] = normalise_steps(data["steps"], "steps")
        return data

    @model_validator(mode="after")
    def _something(self) -> P18Inputs:
        if not self.url and not (self.steps and self.steps[0].action == "goto"):
            # The public DAGs use P18 without a page to open (e.g. a lone screenshot step): the page
            # is then the app's root, {{base_url}}/ (a fresh browser context has no "current page").
            self.url = "/"
            note("no 'url' and the steps do not start with a 'goto': the app's root ({{base_url}}/) is opened first")
        return self


async def _locate(page: Any, selectors: list[str], timeout_ms: float, state: str = "attached") -> Any:
    """A locator for the first of ``selectors`` that appears (waits up to ``timeout_ms``)."""
    locator = page.locator(selectors[0])
    for other in selectors[1:]:
        locator = locator.or_(page.locator(other))
    locator = locator.first
    await locator.wait_for(state=state, timeout=timeout_ms)
    return locator


async def _settle_after(page: Any, deadline: Deadline) -> None:
    """After an action that may navigate: wait (briefly, best effort) for the page to load."""
    try:
        await page.wait_for_load_state("load", timeout=min(5000, deadline.ms()))
    except Exception:  # noqa: BLE001 - Playwright raises many error types; each becomes the step's message, never a crash
        pass


async def _run_step(
    page: Any,
    step: BrowserStep,
    ctx: RunContext,
    inputs: PageInputs,
    deadline: Deadline,
    guard: Guard,
    shots: list[tuple[str, bytes]],
) -> str | None:
    """Perform one step (of P18 ``steps`` or SCREENSHOT ``actions``); returns why it failed, or None."""
    timeout = min(step.timeout_ms or getattr(inputs, "action_timeout_ms", DEFAULT_ACTION_TIMEOUT_MS), deadline.ms())
    act = step.action
    try:
        if act == "noop":
            pass  # an action the DAG names but this build does not run (the loader warned); kept in the evidence
        elif act == "goto":
            url = absolute_url(ctx, step.url or "")
            problem = check_url(ctx, url)
            if problem:
                return problem
            page_s = (step.timeout_ms or inputs.timeout_ms) / 1000
            rendered = await load_page(
                page,
                url,
                deadline=Deadline(min(deadline.left(), page_s)),
                wait_until=inputs.wait_until,
                settle_ms=0,
                guard=guard,
            )
            if rendered.error:
                return rendered.error
        elif act == "wait":
            if step.selectors():
                await _locate(
                    page, step.selectors(), min(step.wait_ms or timeout, deadline.ms()), step.state or "attached"
                )
            elif step.wait_ms:
                await asyncio.sleep(min(step.wait_ms / 1000, deadline.left()))
            else:
                await _settle_after(page, deadline)  # a bare 'wait' (wait_for_load_state, ...): let the page load
        elif act == "reload":
            await page.reload(wait_until="load", timeout=min(inputs.timeout_ms, deadline.ms()))
        elif act == "back":
            await page.go_back(wait_until="load", timeout=min(inputs.timeout_ms, deadline.ms()))
        elif act == "mouse_move":
            size = page.viewport_size or inputs.viewport.model_dump()
            x = step.x if step.x is not None else size["width"] / 2
            y = step.y if step.y is not None else size["height"] / 2
            await page.mouse.move(x, y, steps=5)
        elif act == "scroll":
            if step.selectors():
                await (await _locate(page, step.selectors(), timeout)).scroll_into_view_if_needed(timeout=timeout)
            elif str(step.value or "").strip().lower() in ("bottom", "end"):
                await page.evaluate("window.scrollTo(0, document.documentElement.scrollHeight)")
            elif str(step.value or "").strip().lower() in ("top", "start", "home"):
                await page.evaluate("window.scrollTo(0, 0)")
            else:
                up = str(step.value or "").strip().lower() == "up"
                await page.mouse.wheel(0, -abs(step.y or 600) if up else (step.y if step.y is not None else 600))
        elif act == "expect_text":
            wanted = step.text()
            sub = Deadline(min(timeout / 1000, deadline.left()))
            seen = ""
            while True:
                if step.selectors():
                    try:
                        seen = await (await _locate(page, step.selectors(), max(1, sub.ms()))).inner_text(
                            timeout=max(1, sub.ms())
                        )
                    except Exception:  # noqa: BLE001 - Playwright raises many error types; each becomes the step's message, never a crash
                        seen = ""
                else:
                    seen = await _page_text(page, sub)
                if wanted in seen or sub.expired():
                    break
                await asyncio.sleep(0.2)
            if wanted not in seen:
                return f"text {wanted!r} not found within {timeout / 1000:.1f}s (saw {seen[:120]!r})"
        elif act == "press":
            if step.selectors():
                await (await _locate(page, step.selectors(), timeout)).press(step.text(), timeout=timeout)
            else:
                await page.keyboard.press(step.text())
            await _settle_after(page, deadline)
        elif act == "screenshot":
            png, _ = await screenshot_png(page, full_page=True, deadline=deadline)
            shots.append((step.name or str(getattr(inputs, "name", "shot")), png))
        else:
            locator = await _locate(page, step.selectors(), timeout)
            if act == "click":
                await locator.click(timeout=timeout)
                await _settle_after(page, deadline)
            elif act == "fill":
                await locator.fill(step.text(), timeout=timeout)
            elif act == "type":
                await locator.press_sequentially(step.text(), timeout=timeout)
            elif act == "select":
                values = step.value if isinstance(step.value, list) else [step.text()]
                try:
                    await locator.select_option(value=[str(v) for v in values], timeout=timeout)
                except Exception:  # noqa: BLE001 - Playwright raises many error types; each becomes the step's message, never a crash
                    await locator.select_option(label=[str(v) for v in values], timeout=timeout)
            elif act == "check":
                await locator.check(timeout=timeout)
            elif act == "uncheck":
                await locator.uncheck(timeout=timeout)
            elif act == "hover":
                await locator.hover(timeout=timeout)
        if step.wait_ms and act != "wait":
            await asyncio.sleep(min(step.wait_ms / 1000, deadline.left()))
    except Exception as exc:  # noqa: BLE001 - Playwright raises many error types; each becomes the step's message, never a crash
        what = " / ".join(step.selectors()) or step.url or ""
        text = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        if "Timeout" in type(exc).__name__ or "Timeout" in text:
            return f"{act} {what!r}: not found/actionable within {timeout / 1000:.1f}s"
        return f"{act} {what!r}: {text}"
    return None


async def _page_text(page: Any, deadline: Deadline) -> str:
    try:
        text = await asyncio.wait_for(
            page.locator("body").inner_text(timeout=min(2000, deadline.ms())), min(3.0, deadline.left())
        )
        return text if isinstance(text, str) else ""
    except Exception:  # noqa: BLE001 - Playwright raises many error types; each becomes the step's message, never a crash
        return ""


async def _check_expectations(
    page: Any, expect: Expectations, inputs: P18Inputs, deadline: Deadline
) -> list[dict[str, Any]]:
    """Each expectation polls until it holds or its time is up."""
    results: list[dict[str, Any]] = []
    for selector in expect.selector_visible:
        try:
            await page.locator(selector).first.wait_for(
                state="visible", timeout=min(inputs.action_timeout_ms, deadline.ms())
            )
            results.append({"selector_visible": selector, "passed": True})
        except Exception as exc:  # noqa: BLE001 - Playwright raises many error types; each becomes the step's message, never a crash
            results.append(
                {
                    "selector_visible": selector,
                    "passed": False,
                    "message": "not visible in time"
                    if "Timeout" in type(exc).__name__
                    else str(exc).splitlines()[0][:200],
                }
            )
    for kind, wanted_list in (("text_contains", expect.text_contains), ("url_contains", expect.url_contains)):
        for wanted in wanted_list:
            sub = Deadline(min(inputs.action_timeout_ms / 1000, deadline.left()))
            seen = ""
            while True:
                seen = (await _page_text(page, sub)) if kind == "text_contains" else str(page.url)
                if wanted in seen or sub.expired():
                    break
                await asyncio.sleep(0.2)
            item: dict[str, Any] = {kind: wanted, "passed": wanted in seen}
            if wanted not in seen:
                item["message"] = f"not found in {'page text' if kind == 'text_contains' else 'URL'}: {seen[:200]!r}"
            results.append(item)
    return results


@primitive("P18", P18Inputs)
def browser_interaction(inputs: P18Inputs, ctx: RunContext) -> StepResult:
    """Open a page, run its steps (goto/click/fill/type/wait/press/select/mouse_move/scroll/expect_text...), check expectations."""
    identity, problem = _identity(ctx, inputs)
    if problem:
        return StepResult(passed=False, message=problem)
    first: str | None = None
    if inputs.url:
        urls, problem = _urls(ctx, [inputs.url])
        if problem:
            return StepResult(passed=False, message=problem)
        first = urls[0]
    pauses_ms = sum(step.wait_ms or 0 for step in inputs.steps)
    budget = ctx.timeout((inputs.timeout_ms + pauses_ms + inputs.action_timeout_ms * (len(inputs.steps) + 1)) / 1000)

    async def work(page: Any, guard: Guard) -> dict[str, Any]:
        deadline = Deadline(budget)
        out: dict[str, Any] = {"steps": [], "expect": [], "shots": [], "failure": None, "unreachable": False}
        if first:
            rendered = await load_page(
                page,
                first,
                deadline=Deadline(min(deadline.left(), inputs.timeout_ms / 1000)),
                wait_until=inputs.wait_until,
                wait_for_selector=inputs.wait_for_selector,
                settle_ms=inputs.settle_ms,
                guard=guard,
            )
            out["page"] = rendered.evidence()
            if rendered.error:
                out["failure"], out["unreachable"] = rendered.error, rendered.unreachable
        if out["failure"] is None:
            for index, step in enumerate(inputs.steps):
                problem = await _run_step(page, step, ctx, inputs, deadline, guard, out["shots"])
                out["steps"].append(
                    {
                        "index": index,
                        "action": step.action,
                        "passed": problem is None,
                        **({"message": problem} if problem else {}),
                        **(
                            {"skipped": step.skipped_action, "message": "not run (no-op step)"}
                            if step.action == "noop"
                            else {}
                        ),
                    }
                )
                if problem:
                    out["failure"] = f"step {index} ({step.action}) failed: {problem}"
                    break
        if out["failure"] is None and inputs.expect is not None:
            out["expect"] = await _check_expectations(page, inputs.expect, inputs, deadline)
            bad = [e for e in out["expect"] if not e["passed"]]
            if bad:
                out["failure"] = "expectation failed: " + "; ".join(
                    f"{k}={v!r}" for e in bad[:3] for k, v in e.items() if k not in ("passed", "message")
                )
        if inputs.screenshot and not deadline.expired():
            try:
                png, _ = await screenshot_png(page, full_page=True, deadline=deadline)
                out["shots"].append((inputs.name, png))
            except Exception:  # noqa: BLE001 - Playwright raises many error types; each becomes the step's message, never a crash
                pass
        out["final_url"] = str(page.url)
        try:
            out["raw"], _ = await read_dom(page, raw_limit(inputs.max_chars), max(0.5, min(5.0, deadline.left())))
        except Exception:  # noqa: BLE001 - Playwright raises many error types; each becomes the step's message, never a crash
            out["raw"] = None
        return out

    try:
        out, guard_summary = _with_guard(ctx, inputs, identity, work, budget)
    except BrowserTimeout:
        return _timeout_result("P18", budget)
    evidence: dict[str, Any] = {"steps": out["steps"], "final_url": out["final_url"], **guard_summary}
    if out.get("page"):
        evidence["page"] = out["page"]
    if out["expect"]:
        evidence["expect"] = out["expect"]
    if out.get("raw") is not None:
        dom, cut = sanitize_html(out["raw"], strip_classes=inputs.strip_classes, max_chars=inputs.max_chars)
        ctx.capture("last_page_html", dom)
        ctx.capture("rendered_dom", dom)
        ctx.capture("rendered_dom_url", out["final_url"])
        ctx.capture("rendered_dom_length", len(dom))
        evidence["dom"] = {
            "chars": len(dom),
            "truncated": cut,
            **(save_evidence(ctx, f"{inputs.name}-dom", dom, "html") if dom else {}),
        }
    for stem, png in out["shots"]:
        pointer = save_evidence(ctx, stem, png, "png")
        evidence.setdefault("screenshots", []).append(pointer)
        ctx.capture("last_screenshot_path", pointer["path"])
        ctx.capture("screenshots", [*_as_list(ctx.vars.get("screenshots")), pointer["path"]])
        ctx.capture("screenshot_urls", [*_as_list(ctx.vars.get("screenshot_urls")), out["final_url"]])
    value = {"final_url": out["final_url"], "steps": len(out["steps"])}
    if out["failure"]:
        return StepResult(
            passed=False, unreachable=out["unreachable"], message=out["failure"], value=value, evidence=evidence
        )
    summary = f"{len(inputs.steps)} step(s) done" + (
        f", {len(out['expect'])} expectation(s) hold" if out["expect"] else ""
    )
    skipped = [s["skipped"] for s in out["steps"] if s.get("skipped")]
    if skipped:
        summary += f"; {len(skipped)} no-op step(s) not run: {', '.join(map(repr, skipped))}"
    return StepResult(passed=True, message=summary, value=value, evidence=evidence)


# --- P19 dom_assertion -------------------------------------------------------------------------------
_DOM_KEYS = frozenset(
    {
        "selector",
        "should_exist",
        "shouldExist",
        "exists",
        "text_contains",
        "textContains",
        "contains",
        "text",
        "count_min",
        "min_count",
        "minCount",
        "count_max",
        "max_count",
        "maxCount",
        "visible",
        "faded_counts_as_hidden",
        "case_insensitive",
        "text_any_of",
        "comment",
        "description",
        "name",
        "label",
        "note",
    }
)
_VISIBILITY_CHECKS = frozenset(
    {
        "visibility",
        "visible",
        "is_visible",
        "visibility_or_opacity",
        "display",
        "displayed",
        "opacity",
        "hidden",
        "is_hidden",
        "not_visible",
    }
)
_HIDDEN_WORDS = frozenset(
    {
        "hidden",
        "not_visible",
        "invisible",
        "false",
        "hidden_or_reduced",
        "reduced",
        "faded",
        "hidden_or_faded",
        "not_displayed",
        "none",
    }
)
_SHOWN_WORDS = frozenset({"visible", "shown", "true", "displayed", "opaque"})


def normalise_dom_assertion(raw: Any, where: str | None = None) -> Any:
    """One P19 assertion in any dialect -> canonical keys (notes and warnings name ``where``)."""
    if isinstance(raw, str):
        return {"selector": raw}
    if not isinstance(raw, dict):
        return raw
    data = dict(raw)
    at, say = scoped(where)
    _alias(data, "case_insensitive", ("caseInsensitive", "ignore_case", "ignoreCase", "icase"), say)
    _alias(data, "text_any_of", ("i18nFallback", "i18n_fallback", "text_alternatives", "textAnyOf", "text_any"), say)
    _alias(data, "should_exist", ("expect_present", "present"), say)  # lgzivily: {"selector", "expect_present": true}
    if "assertion" in data and "check" not in data and isinstance(data["assertion"], str):
        data["check"] = data.pop("assertion")  # ididetxj: {"selector", "assertion": "visible"}
        say("DOM assertion 'assertion: <check>' -> 'check'")
    if isinstance(data.get("text_any_of"), str):
        data["text_any_of"] = [data["text_any_of"]]
    state = data.pop("state", None)
    if isinstance(state, str) and state.strip().lower() in _HIDDEN_WORDS | _SHOWN_WORDS:
        data.setdefault("visible", state.strip().lower() in _SHOWN_WORDS)
        say(f"DOM assertion 'state: {state}' -> 'visible: {data['visible']}'")
    elif state is not None:
        warn(f"DOM assertion state {state!r} not understood (ignored)", at("state"))
    if "hidden" in data and isinstance(data["hidden"], bool):
        data.setdefault("visible", not data.pop("hidden"))
        say("DOM assertion 'hidden: bool' -> 'visible'")
    if "check" in data:
        check = str(data.pop("check")).strip().lower()
        has_expected = "expected" in data
        expected = data.pop("expected", None)
        word = str(expected).strip().lower() if expected is not None else ""
        if check in _VISIBILITY_CHECKS:
            negate = check in ("hidden", "is_hidden", "not_visible")
            shown = (expected is not False and word not in _HIDDEN_WORDS) if has_expected else True
            data["visible"] = shown != negate
            if not data["visible"] and (
                "opacity" in check or word in ("hidden_or_reduced", "reduced", "faded", "hidden_or_faded")
            ):
                data["faded_counts_as_hidden"] = True
            say(
                f"DOM assertion 'check: {check}'{f', expected: {expected!r}' if has_expected else ''} -> 'visible: {data['visible']}'"
                + (" (reduced opacity counts as hidden)" if data.get("faded_counts_as_hidden") else "")
            )
        elif check in ("text", "text_contains", "contains_text", "has_text", "contains") and isinstance(expected, str):
            data.setdefault("text_contains", expected)
            say(f"DOM assertion 'check: {check}' -> 'text_contains'")
        elif check in ("exists", "exist", "present", "attached", "not_exists", "absent"):
            flag = bool(expected) if has_expected and isinstance(expected, bool) else True
            data.setdefault("should_exist", flag if check not in ("not_exists", "absent") else not flag)
            say(f"DOM assertion 'check: {check}' -> 'should_exist: {data['should_exist']}'")
        elif (
            check in ("count", "count_eq", "count_min", "min_count", "count_gte", "count_max", "max_count", "count_lte")
            and isinstance(expected, int)
            and not isinstance(expected, bool)
        ):
            if check in ("count", "count_eq", "count_min", "min_count", "count_gte"):
                data.setdefault("count_min", expected)
            if check in ("count", "count_eq", "count_max", "max_count", "count_lte"):
                data.setdefault("count_max", expected)
            say(f"DOM assertion 'check: {check}' -> count bounds")
        else:
            warn(
                f"DOM assertion check {check!r}{f' (expected {expected!r})' if has_expected else ''} not understood: "
                "only the selector's existence is checked",
                at("check"),
            )
    if data.get("visible") is False and not any(k in data for k in ("should_exist", "shouldExist", "exists")):
        data["should_exist"] = None  # "hidden" holds when nothing matches, too
    for key in [k for k in data if k not in _DOM_KEYS]:
        warn(f"DOM assertion key {key!r} not understood (ignored)", at(key))
        data.pop(key)
    return data


class DomAssertion(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)

    selector: str = Field(min_length=1)
    should_exist: bool | None = Field(
        default=True,
        validation_alias=AliasChoices("should_exist", "shouldExist", "exists"),
        description="true: some element matches; false: none does; null: either",
    )
    text_contains: str | None = Field(
        default=None, validation_alias=AliasChoices("text_contains", "textContains", "contains", "text")
    )
    text_any_of: list[str] | None = Field(default=None, description="Some matching element contains one of these texts")
    case_insensitive: bool = Field(default=False, description="Text comparisons ignore case")
    count_min: int | None = Field(
        default=None, ge=0, validation_alias=AliasChoices("count_min", "min_count", "minCount")
    )
    count_max: int | None = Field(
        default=None, ge=0, validation_alias=AliasChoices("count_max", "max_count", "maxCount")
    )
    visible: bool | None = Field(
        default=None,
        description="true: some matching element is shown; false: none is "
        "(display, visibility, zero size and the opacity of its ancestors are considered)",
    )
    faded_counts_as_hidden: bool = Field(
        default=False,
        description="With visible: false, an element whose effective "
        "opacity is below 1 counts as hidden (e.g. a toolbar that fades out)",
    )
    description: str | None = None
    comment: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        return normalise_dom_assertion(data)


_TOP_SELECTOR_KEYS = (
    "selector",
    "shouldExist",
    "should_exist",
    "text_contains",
    "count_min",
    "expect_present",
    "assertion",
    "visible",
    "check",
    "text_any_of",
)


class P19Inputs(PageInputs):
    url: str | None = Field(
        default=None,
        description="Page to load; without it the assertions run with JavaScript off on "
        "the page this node rendered (rendered_dom / last_page_html), else on the last HTTP response "
        "when it is HTML, else on the page rendered last in the run",
    )
    assertions: list[DomAssertion] = Field(default_factory=list, description="CSS-selector assertions")
    source_contains_any: list[str] | None = Field(
        default=None, description="The page's source (HTML text, scripts included) contains one of these strings"
    )
    require: Literal["all", "any"] = Field(
        default="all", description="all: every assertion must hold; any: one is enough"
    )
    assertion_timeout_ms: float = Field(
        default=5000, ge=0, description="How long a should-exist selector may take to appear"
    )

    @model_validator(mode="before")
    @classmethod
    def _aliases(cls, data: Any) -> Any:
        if isinstance(data, dict):
            data = dict(data)
            rename_aliases(data, "url", ("path", "page"))
            for key in ("selector_or_text_one_of", "contains_one_of", "text_one_of"):
                # iyjruvfz: {"selector_or_text_one_of": ["Sign in", "Login", ...]}; its reference: one of the
                # strings occurs in the last response's text
                if key in data and "source_contains_any" not in data:
                    value = data.pop(key)
                    data["source_contains_any"] = value if isinstance(value, list) else [value]
                    note(f"'{key}' -> 'source_contains_any' (one of these strings in the page source)")
            if "selectors" in data and "assertions" not in data:
                # sgdoserd: {"selectors": ["#root", "html"], "all_required": false}
                selectors = data.pop("selectors")
                data["assertions"] = [
                    {"selector": x} for x in (selectors if isinstance(selectors, list) else [selectors])
                ]
                note("'selectors' -> one assertion per selector")
            if "all_required" in data:
                flag = data.pop("all_required")
                if isinstance(flag, bool):
                    data.setdefault("require", "all" if flag else "any")
                    note(f"'all_required: {str(flag).lower()}' -> 'require: {data['require']}'")
                else:
                    warn(f"all_required {flag!r} is not a boolean (ignored)", "all_required")
            if "assertions" not in data and "selector" in data:
                data["assertions"] = [{k: data.pop(k) for k in _TOP_SELECTOR_KEYS if k in data}]
                note("top-level 'selector' -> assertions[0]")
            if isinstance(data.get("assertions"), list):
                data["assertions"] = [
                    normalise_dom_assertion(a, f"assertions[{i}]") for i, a in enumerate(data["assertions"])
                ]
        return data

    @model_validator(mode="after")
    def _something(self) -> P19Inputs:
        if not self.assertions and not self.source_contains_any:
            raise ValueError("P19 needs 'assertions' (or 'selector', 'selectors', 'selector_or_text_one_of')")
        return self


# Is an element shown? Zero size, display:none or visibility:hidden (on it or an ancestor) hide it;
# opacity multiplies down the ancestor chain.
_SHOWN_JS = """el => {
  let opacity = 1;
  for (let e = el; e && e.nodeType === 1; e = e.parentElement) {
    const cs = getComputedStyle(e);
    if (cs.display === 'none' || cs.visibility === 'hidden' || cs.visibility === 'collapse') return {shown: false, opacity: 0};
    opacity *= parseFloat(cs.opacity || '1');
  }
  const r = el.getBoundingClientRect();
  return {shown: r.width > 0 && r.height > 0, opacity: opacity};
}"""


async def _assert_one(page: Any, item: DomAssertion, timeout_ms: float) -> dict[str, Any]:
    out: dict[str, Any] = {"selector": item.selector, "should_exist": item.should_exist}
    try:
        locator = page.locator(item.selector)
        if item.should_exist and timeout_ms > 0:
            try:
                await locator.first.wait_for(state="visible" if item.visible else "attached", timeout=timeout_ms)
            except Exception as exc:
                if "Timeout" not in type(exc).__name__:
                    raise
        count = await locator.count()
    except Exception as exc:  # noqa: BLE001 - Playwright raises many error types; each becomes the step's message, never a crash
        out.update(
            passed=False,
            message=f"selector error: {str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__}",
        )
        return out
    out["count"] = count
    problems: list[str] = []
    if item.should_exist and count == 0:
        problems.append("no element matches")
    if item.should_exist is False and count > 0:
        problems.append(f"{count} element(s) match but none should")
    if item.visible is not None and count > 0:
        shown = []
        for index in range(min(count, 50)):
            try:
                shown.append(await locator.nth(index).evaluate(_SHOWN_JS, timeout=1000))
            except Exception:  # noqa: BLE001 - Playwright raises many error types; each becomes the step's message, never a crash
                pass
        full = [s for s in shown if s.get("shown") and s.get("opacity", 1) >= 0.99]
        some = [s for s in shown if s.get("shown") and s.get("opacity", 1) > 0.01]
        out["shown"] = len(some)
        if item.visible and not some:
            problems.append("no matching element is visible")
        if item.visible is False and (full if item.faded_counts_as_hidden else some):
            problems.append(
                f"{len(full if item.faded_counts_as_hidden else some)} matching element(s) visible"
                + (" at full opacity" if item.faded_counts_as_hidden else "")
            )
    elif item.visible and count == 0 and not item.should_exist:
        problems.append("no element matches, so none is visible")
    if item.count_min is not None and count < item.count_min:
        problems.append(f"{count} < count_min {item.count_min}")
    if item.count_max is not None and count > item.count_max:
        problems.append(f"{count} > count_max {item.count_max}")
    wanted = ([item.text_contains] if item.text_contains is not None else []) + list(item.text_any_of or [])
    if wanted and count > 0:
        texts = []
        for index in range(min(count, 50)):
            try:
                texts.append(await locator.nth(index).text_content(timeout=1000) or "")
            except Exception:  # noqa: BLE001 - Playwright raises many error types; each becomes the step's message, never a crash
                pass
        fold = (lambda t: t.casefold()) if item.case_insensitive else (lambda t: t)
        if not any(fold(w) in fold(t) for t in texts for w in wanted):
            problems.append(f"no matching element contains {' or '.join(map(repr, wanted))}")
            out["texts"] = [t.strip()[:100] for t in texts[:3]]
    out["passed"] = not problems
    if problems:
        out["message"] = "; ".join(problems)
    return out


def _stored_page(ctx: RunContext) -> tuple[str | None, str]:
    """What P19 checks without a url: (HTML, where it came from), or (None, why not).

    The page this node rendered, else the last HTTP response when it is HTML (iyjruvfz, sgdoserd and
    lgzivily check the page a P04 just fetched), else the page rendered last in the run.
    """
    for name in ("last_page_html", "rendered_dom"):
        value = ctx.node_scope.get(name)
        if isinstance(value, str) and value.strip():
            return value, "the page rendered in this node"
    response = ctx.last_response
    if (
        response is not None
        and isinstance(response.text, str)
        and response.text.strip()
        and ("html" in str(response.headers.get("content-type", "")).lower() or response.text.lstrip()[:1] == "<")
    ):
        return response.text, f"the last response ({response.method} {response.url} -> {response.status})"
    for name in ("last_page_html", "rendered_dom"):
        value = ctx.vars.get(name)
        if isinstance(value, str) and value.strip():
            return value, "the page rendered last in the run"
    return None, "no 'url', no rendered page and no HTML response to check (run RENDER_DOM, P18 or a P04 GET first)"


def _source_check(inputs: P19Inputs, source: str | None) -> dict[str, Any]:
    wanted = list(inputs.source_contains_any or [])
    found = next((w for w in wanted if w and source is not None and w in source), None)
    out: dict[str, Any] = {"selector": None, "source_contains_any": wanted, "passed": found is not None}
    if found is not None:
        out["matched"] = found
    else:
        out["message"] = (
            (
                "the page source contains none of "
                + ", ".join(map(repr, wanted[:6]))
                + (f" (+{len(wanted) - 6})" if len(wanted) > 6 else "")
            )
            if source is not None
            else "no page source"
        )
    return out


@primitive("P19", P19Inputs)
def dom_assertion(inputs: P19Inputs, ctx: RunContext) -> StepResult:
    """CSS-selector assertions (and source text checks) on a page; passes when every one holds
    (``require: any``: when one does)."""
    identity, problem = _identity(ctx, inputs)
    if problem:
        return StepResult(passed=False, message=problem)
    url: str | None = None
    stored: str | None = None
    where = ""
    if inputs.url:
        urls, problem = _urls(ctx, [inputs.url])
        if problem:
            return StepResult(passed=False, message=problem)
        url = urls[0]
    else:
        stored, where = _stored_page(ctx)
        if stored is None:
            return StepResult(passed=False, message=where)
    budget = ctx.timeout((inputs.timeout_ms + inputs.assertion_timeout_ms) / 1000)

    async def work(page: Any, guard: Guard) -> tuple[Rendered | None, list[dict[str, Any]], str | None]:
        deadline = Deadline(budget)
        rendered = None
        if url is not None:
            rendered = await load_page(
                page,
                url,
                deadline=Deadline(min(deadline.left(), inputs.timeout_ms / 1000)),
                wait_until=inputs.wait_until,
                wait_for_selector=inputs.wait_for_selector,
                settle_ms=inputs.settle_ms,
                guard=guard,
            )
            if rendered.unreachable or (rendered.status is None and rendered.error):
                return rendered, [], None
        else:
            await page.set_content(stored, wait_until="domcontentloaded", timeout=deadline.ms())
        results = []
        for item in inputs.assertions:
            results.append(await _assert_one(page, item, min(inputs.assertion_timeout_ms, deadline.ms()) if url else 0))
        return rendered, results, (rendered.raw_html if rendered is not None else stored)

    rendered: Rendered | None = None
    guard_summary: dict[str, Any] = {}
    results: list[dict[str, Any]] = []
    source: str | None = stored
    if inputs.assertions or url is not None:  # text checks alone on a page we already have need no browser
        try:
            (rendered, results, source), guard_summary = _with_guard(
                ctx, inputs, identity if url else None, work, budget, javascript=url is not None, block_all=url is None
            )
        except BrowserTimeout:
            return _timeout_result("P19", budget)
    if inputs.source_contains_any and not (rendered is not None and rendered.error):
        results = [*results, _source_check(inputs, source)]
    evidence: dict[str, Any] = {"source": url or where, "assertions": results, **guard_summary}
    if rendered is not None:
        evidence["page"] = rendered.evidence()
        if rendered.error:
            return StepResult(passed=False, unreachable=rendered.unreachable, message=rendered.error, evidence=evidence)
    held = sum(1 for r in results if r["passed"])
    value = {"passed": held, "total": len(results), "ratio": round(held / len(results), 4) if results else 0.0}
    ok = held >= 1 if inputs.require == "any" else held == len(results)
    label = f"{held}/{len(results)} DOM assertions hold" + (" (one is enough)" if inputs.require == "any" else "")
    if not ok:
        bad = next(r for r in results if not r["passed"])
        what = repr(bad["selector"]) if bad.get("selector") else "source_contains_any"
        return StepResult(
            passed=False, value=value, evidence=evidence, message=f"{label}; {what}: {bad.get('message', '')}"
        )
    return StepResult(passed=True, value=value, evidence=evidence, message=label)
