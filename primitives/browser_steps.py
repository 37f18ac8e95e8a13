"""Browser step dialects: one canonical :class:`BrowserStep` for P18 ``steps`` and SCREENSHOT ``actions``.

Real DAGs spell browser steps in many ways (``navigate`` for ``goto``, ``{"action": "wait",
"timeout": 12000}`` for a pause, ``mouse_move`` with ``x``/``y``, ``text``/``key`` for the value,
a step-level ``name`` for a screenshot...). :func:`normalise_steps` rewrites a list of raw steps
into the canonical keys, recording every rewrite with :func:`saasbench.dag.note`, and reports what
it cannot honour as a loader warning (:func:`saasbench.dag.warn`) naming the step and the key.

Action decisions (docs/dag-semantics.md, "Browser"):

- aliases whose meaning is clear map to a supported action (``navigate``/``visit``/``open`` ->
  ``goto``; ``input``/``type_text`` -> ``fill``; ``sleep``/``pause``/``wait_for_selector`` ->
  ``wait``; ``mousemove``/``move_mouse`` -> ``mouse_move``; ``scroll_to``/``scroll_into_view``
  -> ``scroll``; ``refresh`` -> ``reload``; ``go_back`` -> ``back``; ``assert_text``/
  ``wait_for_text`` -> ``expect_text``; ``take_screenshot`` -> ``screenshot``; camelCase
  spellings such as ``waitForSelector`` are read as snake_case);
- ``evaluate`` and its spellings (page JavaScript written in the DAG) are NOT run: the step is
  kept as a no-op recorded in the evidence, with a warning. Its effect on the page cannot be
  checked, and a script can make the page say anything the later assertions look for;
- any other unknown action is kept as a no-op step recorded in the evidence, with a warning.

Timing keys: for ``wait`` the pause (or, with a selector, how long to wait for it) is ``wait_ms``;
``timeout``, ``ms``, ``duration(_ms)``, ``delay(_ms)``, ``sleep_ms``, ``time_ms`` are read as
milliseconds (Playwright's unit) and ``seconds``/``duration_s``/``wait_s`` as seconds. For other
actions ``timeout`` is the action's own timeout (``timeout_ms``) and ``delay``/``ms`` a pause
after it (``wait_ms``).
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from saasbench.dag import as_number, note, warn

Action = Literal[
    "goto",
    "click",
    "fill",
    "type",
    "wait",
    "press",
    "select",
    "check",
    "uncheck",
    "hover",
    "screenshot",
    "mouse_move",
    "scroll",
    "reload",
    "back",
    "expect_text",
    "noop",
]
ACTIONS = frozenset(Action.__args__)  # type: ignore[attr-defined]
_ACTION_ALIASES = {
    "navigate": "goto",
    "visit": "goto",
    "open": "goto",
    "go": "goto",
    "navigate_to": "goto",
    "goto_url": "goto",
    "load": "goto",
    "open_url": "goto",
    "visit_url": "goto",
    "input": "fill",
    "set": "fill",
    "enter": "fill",
    "type_text": "fill",
    "input_text": "fill",
    "set_value": "fill",
    "fill_input": "fill",
    "wait_for": "wait",
    "wait_for_selector": "wait",
    "waitforselector": "wait",
    "check_element": "wait",
    "sleep": "wait",
    "pause": "wait",
    "delay": "wait",
    "wait_for_timeout": "wait",
    "wait_for_element": "wait",
    "wait_for_visible": "wait",
    "assert_visible": "wait",
    "expect_visible": "wait",
    "assert_exists": "wait",
    "wait_for_load_state": "wait",
    "wait_for_load": "wait",
    "wait_for_navigation": "wait",
    "wait_for_network_idle": "wait",
    "keypress": "press",
    "key": "press",
    "press_key": "press",
    "keyboard": "press",
    "keyboard_press": "press",
    "select_option": "select",
    "choose": "select",
    "tap": "click",
    "dblclick": "click",
    "double_click": "click",
    "click_element": "click",
    "capture": "screenshot",
    "take_screenshot": "screenshot",
    "snapshot": "screenshot",
    "screen_shot": "screenshot",
    "mousemove": "mouse_move",
    "move_mouse": "mouse_move",
    "mouse": "mouse_move",
    "mouse_over_point": "mouse_move",
    "scroll_to": "scroll",
    "scroll_into_view": "scroll",
    "scrollintoview": "scroll",
    "scroll_down": "scroll",
    "refresh": "reload",
    "reload_page": "reload",
    "go_back": "back",
    "navigate_back": "back",
    "history_back": "back",
    "assert_text": "expect_text",
    "expect_text": "expect_text",
    "wait_for_text": "expect_text",
    "check_text": "expect_text",
    "verify_text": "expect_text",
    "assert_text_contains": "expect_text",
    "text_contains": "expect_text",
}
# Page JavaScript written in the DAG: never run (see the module docstring).
_SCRIPT_ACTIONS = frozenset(
    {
        "evaluate",
        "eval",
        "script",
        "js",
        "javascript",
        "execute_script",
        "evaluate_script",
        "run_script",
        "exec_js",
        "run_js",
    }
)
_NEEDS_SELECTOR = frozenset({"click", "fill", "type", "select", "check", "uncheck", "hover"})
_MS_KEYS = ("timeout", "ms", "duration", "duration_ms", "delay", "delay_ms", "sleep_ms", "time_ms", "wait_time_ms")
_S_KEYS = ("seconds", "duration_s", "wait_s", "delay_s", "sleep_s")
_ANNOTATIONS = ("description", "comment", "note", "label", "_comment")
_KNOWN = frozenset(
    {
        "action",
        "selector",
        "selector_any_of",
        "value",
        "url",
        "wait_ms",
        "timeout_ms",
        "name",
        "x",
        "y",
        "state",
        "skipped_action",
        *_ANNOTATIONS,
    }
)


def scoped(where: str | None) -> tuple[Any, Any]:
    """``(at, say)`` for a nested dialect: ``at(key)`` names the field under ``where`` for a
    warning, ``say(message)`` records a normalisation prefixed with ``where``."""
    if not where:
        return (lambda key: key), note
    return (lambda key: f"{where}.{key}"), (lambda message: note(f"{where}: {message}"))


def _alias(data: dict[str, Any], target: str, aliases: tuple[str, ...], say: Any) -> None:
    """Move the first legacy alias present to ``target`` (unless set), noting it through ``say``."""
    for key in aliases:
        if key in data and target not in data:
            data[target] = data.pop(key)
            say(f"'{key}' -> '{target}'")


def normalise_step(raw: Any, where: str | None = None) -> Any:
    """One raw browser step -> canonical keys; ``where`` (e.g. ``steps[3]``) names it in warnings."""
    if not isinstance(raw, dict):
        if isinstance(raw, str) and raw.strip():  # "screenshot", "reload": a bare action name
            raw = {"action": raw}
        else:
            return raw
    data = dict(raw)
    at, say = scoped(where)
    _alias(data, "action", ("type", "op", "command", "step"), say)
    action = data.get("action")
    if isinstance(action, str):
        # camelCase (waitForSelector, goBack) -> snake_case, then one spelling
        key = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", action.strip()).lower().replace("-", "_").replace(" ", "_")
        if key in _SCRIPT_ACTIONS:
            data["action"], data["skipped_action"] = "noop", action
            warn(
                f"browser action {action!r} (page JavaScript from the DAG) is not run: kept as a no-op step "
                "(recorded in the evidence)",
                at("action"),
            )
        elif key in _ACTION_ALIASES and _ACTION_ALIASES[key] != key:
            data["action"] = _ACTION_ALIASES[key]
            say(f"browser action {action!r} -> {data['action']!r}")
        elif key in ACTIONS:
            data["action"] = key
        else:
            data["action"], data["skipped_action"] = "noop", action
            warn(
                f"browser action {action!r} is not supported: kept as a no-op step (recorded in the evidence)",
                at("action"),
            )
    act = data.get("action")
    if act == "wait" and isinstance(data.get("text"), str) and not (data.get("selector") or data.get("selectors")):
        data["action"] = act = "expect_text"  # {"action": "wait", "text": "Saved"}: wait for that text
        say("browser step wait with 'text' -> 'expect_text'")
    _alias(data, "value", ("text", "key", "option", "keys", "input", "content"), say)
    _alias(data, "selector_any_of", ("selectors",), say)
    _alias(data, "selector", ("target", "element", "locator", "css"), say)
    if isinstance(data.get("selector"), list):
        data["selector_any_of"] = data.pop("selector")
    if act == "goto":
        _alias(data, "url", ("path", "href", "page"), say)
        if not data.get("url") and isinstance(data.get("value"), str):
            data["url"] = data.pop("value")
    if act == "expect_text":
        _alias(data, "value", ("expected", "contains"), say)
    if act == "wait" and data.get("value") is not None and not (data.get("selector") or data.get("selector_any_of")):
        value = data.pop("value")
        if as_number(value) is not None and "wait_ms" not in data:
            data["wait_ms"] = as_number(value)
            say("browser step wait 'value' (a number) -> 'wait_ms'")
        elif isinstance(value, str) and value.strip():
            data["selector"] = value
            say("browser step wait 'value' (a selector) -> 'selector'")
    # timing: milliseconds unless the key says seconds
    for key in _MS_KEYS + _S_KEYS:
        if key not in data:
            continue
        value = as_number(data[key])
        if value is None:
            continue
        ms = value * 1000 if key in _S_KEYS else value
        target = "timeout_ms" if (key == "timeout" and act != "wait") else "wait_ms"
        if target in data:
            continue
        data.pop(key)
        data[target] = ms
        say(f"browser step '{key}' -> '{target}' ({ms:g} ms)")
    if act == "mouse_move":
        for key in ("coordinates", "position", "point", "to"):
            point = data.get(key)
            if isinstance(point, dict):
                data.pop(key)
                data.setdefault("x", point.get("x"))
                data.setdefault("y", point.get("y"))
                say(f"browser step '{key}: {{x, y}}' -> 'x', 'y'")
            elif isinstance(point, (list, tuple)) and len(point) == 2:
                data.pop(key)
                data.setdefault("x", point[0])
                data.setdefault("y", point[1])
                say(f"browser step '{key}: [x, y]' -> 'x', 'y'")
    if act == "scroll":
        for key in ("direction", "to"):
            if key in data and "value" not in data:
                data["value"] = data.pop(key)
                say(f"browser step '{key}' -> 'value'")
        for key in ("dy", "delta_y", "deltaY", "amount", "pixels", "by"):
            if key in data and "y" not in data:
                data["y"] = data.pop(key)
                say(f"browser step '{key}' -> 'y' (pixels)")
    if act == "screenshot":
        _alias(data, "name", ("filename", "file", "path", "screenshot_name"), say)
    for key in [k for k in data if k not in _KNOWN]:
        if data.get("action") != "noop":  # a no-op step's own inputs (e.g. 'script') were warned with its action
            warn(f"browser step key {key!r} not understood (ignored)", at(key))
        data.pop(key)
    return data


def normalise_steps(raw: Any, where: str) -> Any:
    """A list of raw steps (or one step) -> list of canonical step dicts."""
    if isinstance(raw, (dict, str)):
        raw = [raw]
        note(f"'{where}' given as one step -> list")
    if not isinstance(raw, list):
        return raw
    return [normalise_step(step, f"{where}[{i}]") for i, step in enumerate(raw)]


class BrowserStep(BaseModel):
    """One canonical browser step (P18 ``steps``, SCREENSHOT ``actions``)."""

    model_config = ConfigDict(extra="allow")

    action: Action
    selector: str | None = None
    selector_any_of: list[str] | None = Field(default=None, description="The first of these selectors that appears")
    value: Any = None
    url: str | None = None
    wait_ms: float | None = Field(
        default=None,
        ge=0,
        description="wait: pause (no selector) or selector timeout; other actions: pause after the action",
    )
    timeout_ms: float | None = Field(default=None, gt=0)
    name: str | None = Field(default=None, description="screenshot: evidence file name stem")
    x: float | None = Field(default=None, description="mouse_move: viewport x (default: the centre)")
    y: float | None = Field(default=None, description="mouse_move: viewport y (default: the centre); scroll: pixels")
    state: Literal["attached", "visible", "hidden", "detached"] | None = Field(
        default=None, description="wait with a selector: the state to wait for (default attached)"
    )
    skipped_action: str | None = Field(default=None, description="noop: the DAG's action that is not run")
    description: str | None = None
    comment: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _legacy(cls, data: Any) -> Any:
        return normalise_step(data)

    @model_validator(mode="after")
    def _complete(self) -> BrowserStep:
        if self.action in _NEEDS_SELECTOR and not (self.selector or self.selector_any_of):
            raise ValueError(f"action {self.action!r} needs a selector")
        if self.action == "goto" and not self.url:
            raise ValueError("action 'goto' needs a url")
        if self.action == "press" and self.value in (None, ""):
            raise ValueError("action 'press' needs a key in 'value'")
        if self.action in ("fill", "type", "select") and self.value is None:
            raise ValueError(f"action {self.action!r} needs a 'value'")
        if self.action == "expect_text" and self.value in (None, ""):
            raise ValueError("action 'expect_text' needs the text in 'value'")
        return self

    def selectors(self) -> list[str]:
        return [self.selector] if self.selector else list(self.selector_any_of or [])

    def text(self) -> str:
        if isinstance(self.value, bool):
            return "true" if self.value else "false"
        return "" if self.value is None else str(self.value)
