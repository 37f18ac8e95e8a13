"""The LLM judge: the paper's two-message template, a retrying litellm client, reply parsing,
a call cache and the evidence the judge sees.

What the judge does (paper Appendix C.2, docs/dag-semantics.md):

- one chat completion per vote, through ``litellm.completion`` (any litellm model string,
  optionally an OpenAI-compatible ``api_base``), ``temperature`` (default 0) and ``max_tokens``
  (default 1024) from :class:`JudgeConfig` on every call and re-ask, with exactly two messages::

      system: You are an expert evaluator. Score the evidence against the rubric. Respond ONLY
              with a JSON object: {"score": <0-{max_score}>, "reasoning": "<brief explanation>"}
      user:   ## Rubric\\n{rubric_prompt}\\n\\n## Evidence\\n{evidence}

  (screenshots travel as ``image_url`` data URLs after the user text);
- transient failures (429, 5xx, timeouts, dropped connections) are retried ``retries`` times
  with exponential backoff (``Retry-After`` honoured up to the cap); 400/401/403/404/422 are
  not retried; an unparseable reply is asked again ``parse_retries`` times (same request);
- the reply is parsed as JSON, fenced JSON, the first ``{...}`` object holding a score, then
  ``score: n`` / ``Score: n/m`` text; an echoed range (``{"score": 0-4}``) is no score; the
  score is clipped into ``score_range`` (the unclipped value is kept as ``parsed_score``);
- a failure after all that is a verdict with ``error`` set: the caller marks the node
  SKIPPED_LLM, never crashes;
- calls are cached by (model, prompt hash, evidence digest, api_base, temperature, max_tokens,
  drop_params[, vote]) in memory and, with ``cache_dir``, on disk (one JSON file per call,
  atomic writes); only parsed replies are cached. Entries written before these settings were in
  the key simply miss (they are asked again, never reused);
- every call, cached or not, is appended to :attr:`Judge.calls` for the lake's ``judge_calls``.

The API key is never stored: :class:`JudgeConfig` names an environment variable, read at call
time, and the key's value is redacted from every recorded reply and error.

Evidence (:func:`code_evidence`, :func:`response_evidence`, :func:`dom_evidence`,
:func:`screenshot_evidence`) is built deterministically: identical inputs give identical text,
hence identical digests and cache hits. Workspace files are read only through a
:class:`FileSource` (``stat``/``listdir``/``read``), so an Environment backend can replace the
host folder.
"""

from __future__ import annotations

import base64
import datetime as _dt
import hashlib
import json
import math
import os
import re
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator

from saasbench import failures as _failures
from saasbench.redaction import redact_text
from saasbench.services.workspace import Listing as FileEntry
from saasbench.services.workspace import Walk, glob_to_regex

# --- the paper's template (Appendix C.2), verbatim -----------------------------------------------
SYSTEM_TEMPLATE = (
    "You are an expert evaluator. Score the evidence against the rubric. Respond ONLY with a JSON "
    'object: {{"score": <{lo}-{max_score}>, "reasoning": "<brief explanation>"}}'
)
USER_TEMPLATE = "## Rubric\n{rubric_prompt}\n\n## Evidence\n{evidence}"
TEMPLATE_VERSION = "paper-c2-v1"

REPLY_RECORD_CHARS = 20_000  # raw replies kept in call records
ERROR_TEXT_CHARS = 500


def _num(x: float) -> str:
    """4.0 -> '4', 2.5 -> '2.5' (how a range bound is written into the prompt)."""
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def system_message(score_range: tuple[float, float]) -> str:
    """The paper's system message; with the usual lower bound 0 it is the paper's text exactly."""
    lo, hi = score_range
    return SYSTEM_TEMPLATE.format(lo=_num(lo), max_score=_num(hi))


def user_message(rubric: str, evidence: str) -> str:
    return USER_TEMPLATE.format(rubric_prompt=rubric, evidence=evidence)


def image_data_url(image: bytes | str) -> str:
    """A data URL for PNG/JPEG bytes; strings already starting with ``data:`` pass through."""
    if isinstance(image, str):
        if not image.startswith("data:"):
            raise ValueError("images must be bytes or data: URLs")
        return image
    mime = "image/jpeg" if image[:3] == b"\xff\xd8\xff" else "image/png"
    return f"data:{mime};base64,{base64.b64encode(image).decode('ascii')}"


def build_messages(
    rubric: str, evidence: str, score_range: tuple[float, float], images: Sequence[bytes | str] = ()
) -> list[dict[str, Any]]:
    """The two messages sent to the judge (images as multimodal ``image_url`` parts)."""
    text = user_message(rubric, evidence)
    if images:
        content: Any = [{"type": "text", "text": text}]
        content += [{"type": "image_url", "image_url": {"url": image_data_url(img)}} for img in images]
    else:
        content = text
    return [{"role": "system", "content": system_message(score_range)}, {"role": "user", "content": content}]


def _sha256(text: str | bytes) -> str:
    return hashlib.sha256(text.encode("utf-8") if isinstance(text, str) else text).hexdigest()


def prompt_hash(rubric: str, score_range: tuple[float, float]) -> str:
    """Hash of everything sent except the evidence: template, system message and rubric."""
    return _sha256(
        json.dumps(
            {
                "template": TEMPLATE_VERSION,
                "system": system_message(score_range),
                "user": USER_TEMPLATE,
                "rubric": rubric,
            },
            sort_keys=True,
        )
    )


def evidence_digest(evidence: str, images: Sequence[bytes | str] = ()) -> str:
    h = hashlib.sha256(evidence.encode("utf-8"))
    for img in images:
        h.update(b"\0image\0" + _sha256(image_data_url(img)).encode())
    return h.hexdigest()


# --- reply parsing ---------------------------------------------------------------------------------
@dataclass
class ParsedReply:
    score: float  # as the judge wrote it (rescaled from n/m when the judge used another scale)
    reasoning: str | None = None
    form: str = "json"  # json | fenced_json | embedded_json | pattern | number
    denominator: float | None = None


_FENCE_RE = re.compile(r"```[ \t]*(?:json|JSON|javascript)?[ \t]*\n?(.*?)```", re.DOTALL)
_NUMBER = r"[-+]?\d+(?:\.\d+)?"
# not the start of a range: "0-4", "<0-5>", "0 - 4", "0 to 4", "1\u20135" echo the told range, they are no score
_NOT_RANGE = r"(?!\.?\d|\s*(?:[-\u2013\u2014~]|to\b)\s*[-+]?\d)"
_SCORE_LINE_RE = re.compile(
    rf"(?im)^[\s>*#_`\-]*(?:final\s+|overall\s+|total\s+)?score\b[^\d\n\-+]{{0,12}}({_NUMBER}){_NOT_RANGE}"
    rf"(?:\s*(?:/|out\s+of)\s*({_NUMBER}))?"
)
_SCORE_ANY_RE = re.compile(
    rf"(?i)\bscore\b[^\d\n\-+]{{0,12}}({_NUMBER}){_NOT_RANGE}(?:\s*(?:/|out\s+of)\s*({_NUMBER}))?"
)
_REASON_RE = re.compile(r'"reason(?:ing)?"\s*:\s*"((?:[^"\\]|\\.)*)', re.DOTALL)


def _as_score(value: Any) -> tuple[float, float | None] | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return (float(value), None) if math.isfinite(value) else None
    if isinstance(value, str):
        m = re.fullmatch(rf"\s*({_NUMBER})\s*(?:(?:/|out\s+of)\s*({_NUMBER}))?\s*", value)
        if m:
            return float(m.group(1)), (float(m.group(2)) if m.group(2) else None)
    return None


def _from_obj(obj: Any) -> tuple[float, float | None, str | None] | None:
    if not isinstance(obj, dict):
        return None
    for key, value in obj.items():
        if isinstance(key, str) and key.strip().lower() == "score":
            got = _as_score(value)
            if got is None:
                return None
            reason = next(
                (
                    v
                    for k, v in obj.items()
                    if isinstance(k, str) and k.lower() in ("reasoning", "reason", "explanation")
                ),
                None,
            )
            return (
                got[0],
                got[1],
                (reason if isinstance(reason, str) else (json.dumps(reason) if reason is not None else None)),
            )
    return None


def _embedded_objects(text: str) -> Iterable[Any]:
    decoder = json.JSONDecoder()
    for m in re.finditer(r"\{", text):
        try:
            obj, _ = decoder.raw_decode(text, m.start())
        except ValueError:
            continue
        yield obj


def parse_reply(text: str | None) -> ParsedReply | None:
    """The score in a judge reply, or None when there is none.

    Tried in order: the whole reply as JSON (an object with ``score``, or a bare number); a
    fenced ```json block; the first ``{...}`` object holding a ``score``; a line starting with
    ``Score: n`` (``n/m`` and ``n out of m`` give ``n * hi / m`` later); ``score ... n``
    anywhere. Booleans, NaN and infinities are not scores, nor is a range the judge echoed from
    the template (``{"score": 0-4}``, ``"score": "0-4"``, ``Score: 0 to 4``): such a reply has
    no score (the parse-failure path), it is never read as 0. Out-of-range scores are kept here
    and clipped by :func:`normalise`.
    """
    if not text or not text.strip():
        return None
    stripped = text.strip()
    try:
        whole = json.loads(stripped)
    except ValueError:
        whole = None
    else:
        got = _from_obj(whole)
        if got is not None:
            return ParsedReply(got[0], got[2], "json", got[1])
        if isinstance(whole, (int, float)) and not isinstance(whole, bool) and math.isfinite(whole):
            return ParsedReply(float(whole), None, "number")
    for block in _FENCE_RE.findall(stripped):
        try:
            got = _from_obj(json.loads(block.strip()))
        except ValueError:
            got = None
        if got is None:
            got = next((g for g in map(_from_obj, _embedded_objects(block)) if g is not None), None)
        if got is not None:
            return ParsedReply(got[0], got[2], "fenced_json", got[1])
    for obj in _embedded_objects(stripped):
        got = _from_obj(obj)
        if got is not None:
            return ParsedReply(got[0], got[2], "embedded_json", got[1])
    for regex in (_SCORE_LINE_RE, _SCORE_ANY_RE):
        m = regex.search(stripped)
        if m:
            reason = _REASON_RE.search(stripped)
            reasoning = reason.group(1) if reason else None
            return ParsedReply(float(m.group(1)), reasoning, "pattern", float(m.group(2)) if m.group(2) else None)
    return None


def clip(value: float, score_range: tuple[float, float]) -> float:
    lo, hi = score_range
    return min(max(value, lo), hi)


def normalise(parsed: ParsedReply, score_range: tuple[float, float]) -> float:
    """The parsed score on the requested scale, clipped: ``n/m`` becomes ``n * hi / m``."""
    hi = score_range[1]
    value = parsed.score
    if parsed.denominator and parsed.denominator > 0 and parsed.denominator != hi:
        value = value * hi / parsed.denominator
    return clip(value, score_range)


# --- configuration and records ---------------------------------------------------------------------
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class JudgeConfig(BaseModel):
    """How to reach the judge. ``api_key_env`` is the NAME of an environment variable, never a key."""

    model_config = ConfigDict(hide_input_in_errors=True, extra="forbid")

    model: str = Field(
        min_length=1,
        description="Any litellm model string, e.g. 'anthropic/claude-sonnet-4-5' or 'openai/<name>' with api_base",
    )
    api_base: str | None = Field(default=None, description="OpenAI-compatible base URL (a local server, a proxy)")
    api_key_env: str | None = Field(
        default=None,
        description="Name of the environment variable holding the API key, read at call time. "
        "None: litellm's provider default (e.g. OPENAI_API_KEY); with api_base set and no name, a dummy key is sent",
    )
    temperature: float = Field(default=0.0, ge=0.0, le=2.0)
    max_tokens: int = Field(default=1024, ge=1)
    timeout_s: float = Field(default=120.0, gt=0)
    retries: int = Field(default=5, ge=0, description="Retries of a transient failure after the first attempt")
    backoff_base_s: float = Field(default=1.0, ge=0, description="Wait before retry i is base * 2**i ...")
    backoff_cap_s: float = Field(default=60.0, ge=0, description="... capped here (Retry-After too)")
    parse_retries: int = Field(default=1, ge=0, description="Identical re-asks after an unparseable reply")
    votes: int = Field(
        default=1, ge=1, description="k: independent calls; the score is their median, the spread max-min"
    )
    cache_dir: Path | None = Field(default=None, description="Disk cache folder; None keeps the cache in memory only")
    drop_params: bool = Field(
        default=True,
        description="Let litellm drop parameters a model rejects (e.g. temperature on some reasoning models)",
    )

    @field_validator("api_key_env")
    @classmethod
    def _env_name(cls, value: str | None) -> str | None:
        if value is not None and not _ENV_NAME_RE.match(value):
            raise ValueError(
                "api_key_env must be the NAME of an environment variable (letters, digits, underscore), not a key"
            )
        return value


class JudgeCall(BaseModel):
    """One judge call (one vote), as written to the lake's ``judge_calls``."""

    at: str
    model: str
    prompt_hash: str
    evidence_digest: str
    cache_key: str
    vote: int = 0
    rubric: str = ""
    score_range: tuple[float, float]
    evidence_chars: int = 0
    images: int = 0
    raw_reply: str | None = None
    score: float | None = None  # clipped into score_range
    parsed_score: float | None = None  # as parsed, before rescaling/clipping
    reply_form: str | None = None
    reasoning: str | None = None
    latency_ms: float = 0.0
    tokens_in: int | None = None
    tokens_out: int | None = None
    cached: bool = False
    attempts: int = 0
    error: str | None = None
    tags: dict[str, Any] = Field(default_factory=dict)


class JudgeVerdict(BaseModel):
    """The judge's answer for one rubric and evidence. ``error`` set means: no score (SKIPPED_LLM)."""

    score: float | None = None
    score_range: tuple[float, float]
    reasoning: str | None = None
    raw_reply: str | None = None
    model: str
    prompt_hash: str
    evidence_digest: str
    latency_ms: float = 0.0
    tokens_in: int | None = None
    tokens_out: int | None = None
    cached: bool = False
    attempts: int = 0
    votes: list[float] = Field(default_factory=list)
    spread: float | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.score is not None


class JudgeError(_failures.JudgeError):
    """A failed judge call (the judge_error outcome of saasbench.failures): ``transient`` ones are retried."""

    def __init__(self, message: str, transient: bool, retry_after: float | None = None):
        super().__init__(message)
        self.transient = transient
        self.retry_after = retry_after


#: Exception class names of failures a later try can get past (litellm's, openai's, httpx's, Python's), for a
#: failure without a telling HTTP status (a refused or reset connection, a timeout, a broken stream).
TRANSIENT_NAMES = frozenset(
    {
        "Timeout",
        "APITimeoutError",
        "APIConnectionError",
        "RateLimitError",
        "InternalServerError",
        "ServiceUnavailableError",
        "BadGatewayError",
        "MidStreamFallbackError",
        "ConnectError",
        "ReadError",
        "WriteError",
        "ReadTimeout",
        "WriteTimeout",
        "ConnectTimeout",
        "PoolTimeout",
        "RemoteProtocolError",
        "TimeoutError",
        "ConnectionError",
        "ConnectionRefusedError",
        "ConnectionResetError",
        "ConnectionAbortedError",
        "BrokenPipeError",
    }
)
#: HTTP statuses of a request or configuration problem (bad request, key, permission, route, size): retrying
#: the same request cannot help.
PERMANENT_STATUS = frozenset({400, 401, 403, 404, 405, 413, 422})
_TIMEOUT_NAMES = frozenset({"Timeout", "APITimeoutError"})


def transient_failure(status: int | None, names: Collection[str]) -> bool:
    """The one rule of what a retry can fix, from a failure's HTTP status and exception class names: 408, 409,
    425, 429 and every 5xx (529 "overloaded" included) are transient, :data:`PERMANENT_STATUS` is not (unless
    the class is a timeout); without a telling status the class decides (:data:`TRANSIENT_NAMES`: refused or
    reset connections, timeouts). Shared by the judge (:func:`classify`), the built-in agent and the rollout's
    model-outage classifier (``saasbench.runs.outages``), so a model outage means the same on both sides."""
    found = set(names)
    if isinstance(status, int) and status in PERMANENT_STATUS and not found & _TIMEOUT_NAMES:
        return False
    if isinstance(status, int) and (status in (408, 409, 425, 429) or status >= 500):
        return True
    return bool(found & TRANSIENT_NAMES)


def classify(exc: BaseException) -> JudgeError:
    """Whether a failed completion is worth retrying, with a short description."""
    status = getattr(exc, "status_code", None)
    transient = transient_failure(status, {c.__name__ for c in type(exc).__mro__})
    retry_after = None
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None)
    if headers is not None:
        try:
            raw = headers.get("retry-after")
            retry_after = float(raw) if raw is not None else None
        except (TypeError, ValueError):
            retry_after = None
    label = f"HTTP {status}" if isinstance(status, int) else "no HTTP status"
    return JudgeError(f"{type(exc).__name__} ({label}): {str(exc)[:ERROR_TEXT_CHARS]}", transient, retry_after)


_litellm_module: Any = None


def _litellm() -> Any:
    """Import litellm on first use (the import takes seconds): offline cost map, no debug banner."""
    global _litellm_module
    if _litellm_module is None:
        os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        import litellm

        litellm.suppress_debug_info = True
        litellm.telemetry = False
        _litellm_module = litellm
    return _litellm_module


# --- the judge -------------------------------------------------------------------------------------
class Judge:
    """A configured judge. Thread-safe; :meth:`score` never raises for API or reply problems."""

    def __init__(
        self,
        config: JudgeConfig,
        *,
        completion: Callable[..., Any] | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ):
        self.config = config
        self.calls: list[JudgeCall] = []
        self._completion = completion
        self._sleep = sleep
        self._memory: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"Judge(model={self.config.model!r}, api_base={self.config.api_base!r}, api_key_env={self.config.api_key_env!r})"

    # --- public -----------------------------------------------------------------------------------
    def score(
        self,
        rubric: str,
        evidence: str,
        score_range: tuple[float, float] | Sequence[float],
        images: Sequence[bytes | str] = (),
        *,
        tags: dict[str, Any] | None = None,
        deadline_s: float | None = None,
    ) -> JudgeVerdict:
        """Score ``evidence`` against ``rubric`` on ``score_range`` [lo, hi].

        ``images`` are PNG/JPEG bytes or data URLs. ``deadline_s`` bounds the whole call
        (retries included) in seconds from now; running out is an outage like any other.
        """
        lo, hi = float(score_range[0]), float(score_range[1])
        rng = (lo, hi)
        model = self.config.model
        p_hash = prompt_hash(rubric, rng)
        e_digest = evidence_digest(evidence, images)
        deadline = time.monotonic() + deadline_s if deadline_s is not None and math.isfinite(deadline_s) else None
        if not hi > lo:
            return JudgeVerdict(
                score_range=rng,
                model=model,
                prompt_hash=p_hash,
                evidence_digest=e_digest,
                error=f"invalid score_range [{lo:g}, {hi:g}]",
            )
        messages = build_messages(rubric, evidence, rng, images)
        calls = [
            self._vote(
                i, messages, rubric, rng, p_hash, e_digest, len(evidence), len(images), dict(tags or {}), deadline
            )
            for i in range(self.config.votes)
        ]
        ok = [c for c in calls if c.error is None and c.score is not None]
        base: dict[str, Any] = dict(
            score_range=rng,
            model=model,
            prompt_hash=p_hash,
            evidence_digest=e_digest,
            latency_ms=round(sum(c.latency_ms for c in calls), 3),
            tokens_in=_sum_opt(c.tokens_in for c in calls),
            tokens_out=_sum_opt(c.tokens_out for c in calls),
            cached=all(c.cached for c in calls),
            attempts=sum(c.attempts for c in calls),
        )
        if not ok:
            last = calls[-1]
            return JudgeVerdict(**base, raw_reply=last.raw_reply, error=last.error or "no score")
        scores = [c.score for c in ok if c.score is not None]  # all of ok; the test narrows for mypy
        first = ok[0]
        return JudgeVerdict(
            **base,
            score=float(statistics.median(scores)),
            reasoning=first.reasoning,
            raw_reply=first.raw_reply,
            votes=scores,
            spread=max(scores) - min(scores) if len(calls) > 1 else None,
            error=None,
        )

    # --- one vote ---------------------------------------------------------------------------------
    def cache_key(self, p_hash: str, e_digest: str, vote: int = 0) -> str:
        """The call's cache key: model, prompt hash, evidence digest, every setting that changes
        the reply (``api_base`` without a trailing slash, ``temperature``, ``max_tokens``,
        ``drop_params``) and, from the second vote on, the vote. Timeouts, retries, the key's
        variable and ``votes`` itself do not change a reply and are not in the key."""
        cfg = self.config
        settings = json.dumps(
            {
                "api_base": (cfg.api_base or "").rstrip("/") or None,
                "temperature": float(cfg.temperature),
                "max_tokens": cfg.max_tokens,
                "drop_params": cfg.drop_params,
            },
            sort_keys=True,
        )
        key = f"{cfg.model}\n{p_hash}\n{e_digest}\n{settings}"
        return _sha256(key if vote == 0 else f"{key}\nvote={vote}")

    def _vote(
        self,
        vote: int,
        messages: list[dict[str, Any]],
        rubric: str,
        rng: tuple[float, float],
        p_hash: str,
        e_digest: str,
        evidence_chars: int,
        n_images: int,
        tags: dict[str, Any],
        deadline: float | None,
    ) -> JudgeCall:
        key = self.cache_key(p_hash, e_digest, vote)
        call = JudgeCall(
            at=_now(),
            model=self.config.model,
            prompt_hash=p_hash,
            evidence_digest=e_digest,
            cache_key=key,
            vote=vote,
            rubric=rubric[:REPLY_RECORD_CHARS],
            score_range=rng,
            evidence_chars=evidence_chars,
            images=n_images,
            tags=tags,
        )
        hit = self._cache_get(key)
        parsed = parse_reply(hit.get("raw_reply")) if hit else None
        if hit and parsed is not None:
            call.cached = True
            call.raw_reply = hit.get("raw_reply")
            call.tokens_in, call.tokens_out = hit.get("tokens_in"), hit.get("tokens_out")
            self._finish(call, parsed, rng)
            return self._record(call)

        secret = self._api_key()
        t0 = time.perf_counter()
        transient_tries = parse_tries = 0
        while True:
            if isinstance(secret, JudgeError):
                call.error = str(secret)
                break
            timeout = self.config.timeout_s
            if deadline is not None:
                timeout = min(timeout, deadline - time.monotonic())
                if timeout <= 0.05:
                    call.error = (call.error + "; " if call.error else "") + "judge deadline reached"
                    break
            call.attempts += 1
            try:
                content, t_in, t_out = self._complete(messages, secret, timeout)
            except JudgeError as exc:
                call.error = redact_text(str(exc), secret)
                if exc.transient and transient_tries < self.config.retries:
                    wait = self._backoff(transient_tries, exc.retry_after)
                    if deadline is not None and time.monotonic() + wait >= deadline:
                        call.error += "; judge deadline reached"
                        break
                    transient_tries += 1
                    self._sleep(wait)
                    continue
                break
            call.tokens_in = _add_opt(call.tokens_in, t_in)
            call.tokens_out = _add_opt(call.tokens_out, t_out)
            content = redact_text(content, secret) if content is not None else None
            call.raw_reply = content[:REPLY_RECORD_CHARS] if content is not None else None
            parsed = parse_reply(content)
            if parsed is not None and math.isfinite(parsed.score):
                call.error = None
                self._finish(call, parsed, rng)
                self._cache_put(key, call)
                break
            call.error = "unparseable judge reply: no score found"
            if parse_tries < self.config.parse_retries:
                parse_tries += 1
                continue
            break
        call.latency_ms = round((time.perf_counter() - t0) * 1000, 3)
        return self._record(call)

    @staticmethod
    def _finish(call: JudgeCall, parsed: ParsedReply, rng: tuple[float, float]) -> None:
        call.parsed_score = parsed.score
        call.score = normalise(parsed, rng)
        call.reply_form = parsed.form
        call.reasoning = parsed.reasoning[:2000] if parsed.reasoning else None

    def _record(self, call: JudgeCall) -> JudgeCall:
        with self._lock:
            self.calls.append(call)
        return call

    def _backoff(self, attempt: int, retry_after: float | None) -> float:
        wait = self.config.backoff_base_s * (2**attempt)
        if retry_after is not None and retry_after > wait:
            wait = retry_after
        return min(wait, self.config.backoff_cap_s)

    def _api_key(self) -> str | None | JudgeError:
        name = self.config.api_key_env
        if name is None:
            return "no-key" if self.config.api_base else None
        value = os.environ.get(name, "")
        if not value.strip():
            return JudgeError(f"judge API key variable {name} is unset or empty", transient=False)
        return value

    def _complete(
        self, messages: list[dict[str, Any]], api_key: str | None, timeout: float
    ) -> tuple[str | None, int | None, int | None]:
        """One completion: (content, tokens in, tokens out), or :class:`JudgeError`."""
        cfg = self.config
        kwargs: dict[str, Any] = dict(
            model=cfg.model,
            messages=messages,
            temperature=cfg.temperature,
            max_tokens=cfg.max_tokens,
            timeout=timeout,
            num_retries=0,
            max_retries=0,
            drop_params=cfg.drop_params,
        )
        if cfg.api_base:
            kwargs["api_base"] = cfg.api_base
        if api_key is not None:
            kwargs["api_key"] = api_key
        try:
            completion = self._completion or _litellm().completion
        except ImportError as exc:
            raise JudgeError(f"litellm is not installed: {exc}", transient=False) from None
        from saasbench.services.limits import llm_provider, llm_slot

        try:
            with llm_slot(llm_provider(cfg.model)):  # LLM calls at once per provider (saasbench.services.limits)
                response = completion(**kwargs)
        except Exception as exc:  # noqa: BLE001 - litellm maps provider errors onto openai-style exceptions
            raise classify(exc) from None
        try:
            message = response.choices[0].message
            content = message.content
        except (AttributeError, IndexError, KeyError, TypeError):
            raise JudgeError("malformed completion response (no choices[0].message)", transient=True) from None
        if isinstance(content, list):  # some providers return content parts
            content = "".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in content)
        usage = getattr(response, "usage", None)
        return (
            content,
            _int_or_none(getattr(usage, "prompt_tokens", None)),
            _int_or_none(getattr(usage, "completion_tokens", None)),
        )

    # --- cache ------------------------------------------------------------------------------------
    def _cache_path(self, key: str) -> Path | None:
        if self.config.cache_dir is None:
            return None
        return Path(self.config.cache_dir) / key[:2] / f"{key}.json"

    def _cache_get(self, key: str) -> dict[str, Any] | None:
        with self._lock:
            hit = self._memory.get(key)
        if hit is not None:
            return hit
        path = self._cache_path(key)
        if path is None or not path.is_file():
            return None
        try:
            entry = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if not isinstance(entry, dict) or entry.get("model") != self.config.model:
            return None
        with self._lock:
            self._memory[key] = entry
        return entry

    def _cache_put(self, key: str, call: JudgeCall) -> None:
        entry = {
            "model": call.model,
            "prompt_hash": call.prompt_hash,
            "evidence_digest": call.evidence_digest,
            "vote": call.vote,
            "raw_reply": call.raw_reply,
            "parsed_score": call.parsed_score,
            "tokens_in": call.tokens_in,
            "tokens_out": call.tokens_out,
            "created_at": call.at,
            "template": TEMPLATE_VERSION,
        }
        with self._lock:
            self._memory[key] = entry
        path = self._cache_path(key)
        if path is None:
            return
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{key[:8]}.", suffix=".tmp")
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as fh:
                    json.dump(entry, fh, sort_keys=True)
                os.replace(tmp, path)
            except BaseException:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
                raise
        except OSError:  # a read-only or full cache folder must not fail the judge
            pass


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="milliseconds")


def _int_or_none(value: Any) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _add_opt(a: int | None, b: int | None) -> int | None:
    return b if a is None else (a if b is None else a + b)


def _sum_opt(values: Iterable[int | None]) -> int | None:
    out: int | None = None
    for v in values:
        out = _add_opt(out, v)
    return out


# --- evidence ----------------------------------------------------------------------------------------
PER_FILE_CHARS = 4_000
TOTAL_CHARS = 60_000
MAX_FILES = 60
MAX_WALK_FILES = 20_000
LISTING_MAX_LINES = 200
LISTING_MAX_CHARS = 8_000
MIN_PIECE_CHARS = 200
TAIL_READ_BYTES = 1024 * 1024
MAX_IMAGES = 4
MAX_IMAGE_BYTES = 8 * 1024 * 1024
EVIDENCE_SKIP_DIRS = frozenset(
    {
        "node_modules",
        ".git",
        "dist",
        "build",
        "vendor",
        "tests",
        "test",
        "__tests__",
        "spec",
        "__pycache__",
        ".venv",
        "venv",
        "coverage",
        ".next",
        ".nuxt",
        "target",
        "tmp",
        ".cache",
        "log",
        "logs",
    }
)
_LOCK_FILES = frozenset(
    {
        "package-lock.json",
        "yarn.lock",
        "pnpm-lock.yaml",
        "poetry.lock",
        "cargo.lock",
        "gemfile.lock",
        "composer.lock",
        "go.sum",
        "uv.lock",
        "pipfile.lock",
        "bun.lockb",
    }
)
_EXT_CLASS: dict[str, int] = {}
for _cls, _exts in enumerate(
    (
        # 0: application source
        "py rb go java kt kts rs php cs ex exs scala swift ts tsx js jsx mjs cjs vue svelte erl hs clj dart lua pl",
        # 1: schema, routes, config
        "sql prisma graphql gql proto json yaml yml toml ini cfg conf xml gradle env properties tf",
        # 2: templates and styles
        "html htm erb haml slim hbs handlebars ejs njk jinja jinja2 j2 twig liquid mustache css scss sass less",
        # 3: docs
        "md rst txt adoc",
    )
):
    for _e in _exts.split():
        _EXT_CLASS[_e] = _cls
_EXT_CLASS_OTHER = 4
_BINARY_EXTS = frozenset(
    {
        "png",
        "jpg",
        "jpeg",
        "gif",
        "webp",
        "bmp",
        "ico",
        "svg",
        "pdf",
        "zip",
        "gz",
        "tgz",
        "bz2",
        "xz",
        "7z",
        "rar",
        "jar",
        "war",
        "class",
        "so",
        "dylib",
        "dll",
        "exe",
        "bin",
        "o",
        "a",
        "pyc",
        "woff",
        "woff2",
        "ttf",
        "otf",
        "eot",
        "mp3",
        "mp4",
        "mov",
        "avi",
        "webm",
        "wav",
        "ogg",
        "sqlite",
        "db",
        "lockb",
        "map",
    }
)
_SPECIAL_NAMES = {"dockerfile": 1, "makefile": 1, "procfile": 1, "gemfile": 1, "rakefile": 0, ".env.example": 1}
_STOPWORDS = frozenset(
    {
        "about",
        "above",
        "after",
        "again",
        "against",
        "also",
        "among",
        "another",
        "answer",
        "anything",
        "appropriate",
        "approach",
        "award",
        "based",
        "been",
        "before",
        "being",
        "below",
        "best",
        "between",
        "both",
        "brief",
        "check",
        "clear",
        "code",
        "codebase",
        "correct",
        "correctly",
        "criteria",
        "criterion",
        "does",
        "doing",
        "done",
        "each",
        "either",
        "evaluate",
        "evaluation",
        "evidence",
        "example",
        "exist",
        "exists",
        "explanation",
        "file",
        "files",
        "from",
        "full",
        "give",
        "given",
        "good",
        "grade",
        "high",
        "into",
        "json",
        "least",
        "less",
        "look",
        "make",
        "many",
        "meets",
        "more",
        "most",
        "much",
        "must",
        "none",
        "only",
        "other",
        "output",
        "over",
        "partial",
        "point",
        "points",
        "present",
        "properly",
        "provide",
        "quality",
        "range",
        "rate",
        "rating",
        "reason",
        "reasoning",
        "relevant",
        "response",
        "rubric",
        "same",
        "score",
        "scores",
        "scoring",
        "shall",
        "should",
        "show",
        "shows",
        "some",
        "such",
        "than",
        "that",
        "their",
        "them",
        "then",
        "there",
        "these",
        "they",
        "this",
        "those",
        "through",
        "very",
        "well",
        "were",
        "what",
        "when",
        "where",
        "which",
        "while",
        "whether",
        "with",
        "within",
        "without",
        "would",
        "your",
        "goal",
        "anchors",
        "implementation",
        "implemented",
        "implements",
        "uses",
        "using",
        "used",
        "judge",
        "integer",
        "evaluator",
    }
)


class FileSource(Protocol):
    """Read access to the candidate's files (host folder today, an Environment backend later).

    Paths are workspace-relative posix paths; ``"."`` is the root. ``saasbench.services.workspace.Workspace``
    implements it.
    """

    def stat(self, rel: str) -> FileEntry | None: ...

    def listdir(self, rel: str) -> Sequence[FileEntry]: ...

    def read(self, rel: str, limit: int) -> bytes: ...


@dataclass
class Evidence:
    text: str
    kind: str
    images: list[bytes] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)


@dataclass
class NoEvidence:
    """Nothing to judge; ``unreachable`` when the app did not answer (no response, no page)."""

    message: str
    unreachable: bool = False


def rubric_keywords(rubric: str, limit: int = 40) -> list[str]:
    """Distinctive words of a rubric (lower case, 4+ letters, no stop words), in first-seen order."""
    words: list[str] = []
    for w in re.findall(r"[A-Za-z][A-Za-z0-9_]{3,}", rubric):
        for part in _split_ident(w):
            part = part.lower()
            if len(part) >= 4 and part not in _STOPWORDS and part not in words:
                words.append(part)
    return words[:limit]


def _split_ident(word: str) -> list[str]:
    parts = re.findall(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])", word)
    return [word] + parts if len(parts) > 1 else [word]


def _ext_of(rel: str) -> str:
    name = rel.rsplit("/", 1)[-1].lower()
    return name.rsplit(".", 1)[-1] if "." in name.lstrip(".") else ""


def _ext_class(rel: str) -> int | None:
    """Rank class of a file for broad entries (0 best); None: never sampled from a broad entry."""
    name = rel.rsplit("/", 1)[-1].lower()
    if name in _LOCK_FILES or name.endswith((".min.js", ".min.css", ".map")):
        return None
    if name in _SPECIAL_NAMES:
        return _SPECIAL_NAMES[name]
    ext = _ext_of(rel)
    if ext in _BINARY_EXTS:
        return None
    return _EXT_CLASS.get(ext, _EXT_CLASS_OTHER)


def _relevance(rel: str, keywords: Sequence[str]) -> int:
    low = rel.lower()
    tokens = [t.lower() for seg in re.split(r"[^A-Za-z0-9]+", rel) if seg for t in _split_ident(seg)]
    hits = 0
    for kw in keywords:
        if kw in low or any(len(t) >= 4 and kw.startswith(t) for t in tokens):
            hits += 1
    return hits


def _rank_key(rel: str, cls: int, keywords: Sequence[str]) -> tuple[int, int, str]:
    priority = 2 * min(_relevance(rel, keywords), 3) - cls
    return (-priority, rel.count("/"), rel)


_GLOB_CHARS = re.compile(r"[*?\[]")


class _Walker:
    """Cached walks of one file source, on the one walk (saasbench.services.workspace.Walk)."""

    def __init__(self, fs: FileSource, skip: frozenset[str], remaining: Callable[[], float] | None):
        self.fs = fs
        self.walk = Walk(skip=skip, cap=MAX_WALK_FILES, remaining=remaining)
        self._cache: dict[tuple[str, frozenset[str]], list[FileEntry]] = {}

    @property
    def capped(self) -> bool:
        return self.walk.capped

    @property
    def timed_out(self) -> bool:
        return self.walk.timed_out

    def files(self, start: str, enter: frozenset[str] = frozenset()) -> list[FileEntry]:
        key = (start, enter)
        if key not in self._cache:
            self._cache[key] = list(self.walk.files_under(self.fs, start, enter))
        return self._cache[key]


def _norm_entry(raw: str) -> str:
    text = raw.strip().replace("\\", "/")
    while text.startswith("./"):
        text = text[2:]
    return text.rstrip("/") or "."


def _escapes(rel: str) -> bool:
    if rel.startswith("/") or re.match(r"^[A-Za-z]:/", rel):
        return True
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    depth = 0
    for p in parts:
        depth += -1 if p == ".." else 1
        if depth < 0:
            return True
    return False


def code_evidence(
    fs: FileSource,
    entries: Sequence[str],
    rubric: str,
    *,
    per_file_chars: int = PER_FILE_CHARS,
    total_chars: int = TOTAL_CHARS,
    max_files: int = MAX_FILES,
    extensions: Sequence[str] | None = None,
    strategy: str = "head",
    skip_dirs: frozenset[str] = EVIDENCE_SKIP_DIRS,
    remaining: Callable[[], float] | None = None,
) -> Evidence | NoEvidence:
    """Deterministic, ranked, budgeted sample of workspace files.

    ``entries`` are files, directories, globs (``src/**/*.ts``) or ``keyword:<word>`` (files whose
    path contains the word); none means the whole workspace. Directory walks skip
    :data:`EVIDENCE_SKIP_DIRS` unless an entry names one. Within an entry candidates are ranked by
    rubric-keyword relevance of the path and extension class (source, then schema/config, then
    templates, then docs); across entries files are taken round-robin, one per entry per round,
    so an early broad entry cannot starve later ones. Each file gives at most ``per_file_chars``
    (its head, or its tail with ``strategy="tail"``); the whole text stays within ``total_chars``.
    When no entry matches anything, the whole workspace is sampled instead (and the header says
    so): DAG paths come from a reference solution that a candidate need not mirror.
    """
    keywords = rubric_keywords(rubric)
    exts = {e.lower().lstrip(".") for e in extensions} if extensions else None
    walker = _Walker(fs, skip_dirs, remaining)
    tail = strategy.lower() in ("tail", "last")
    raw_entries = [str(e) for e in entries if str(e).strip()] or ["."]

    def broad(files: Iterable[FileEntry]) -> list[str]:
        ranked = []
        for f in files:
            cls = _ext_class(f.rel)
            if cls is None or (exts is not None and _ext_of(f.rel) not in exts):
                continue
            ranked.append((_rank_key(f.rel, cls, keywords), f.rel))
        return [rel for _, rel in sorted(ranked)]

    sizes: dict[str, int] = {}
    plans: list[tuple[str, str, list[str]]] = []  # (entry, kind, candidates)
    for raw in raw_entries:
        if raw.lower().startswith("keyword:"):
            word = raw.split(":", 1)[1].strip().lower()
            files = walker.files(".") if word else []
            for f in files:
                sizes[f.rel] = f.size
            plans.append((raw, "keyword", broad(f for f in files if word in f.rel.lower())))
            continue
        rel = _norm_entry(raw)
        if _escapes(rel):
            plans.append((raw, "outside workspace", []))
            continue
        if _GLOB_CHARS.search(rel):
            segments = rel.split("/")
            literal = []
            for seg in segments:
                if _GLOB_CHARS.search(seg):
                    break
                literal.append(seg)
            start = "/".join(literal) or "."
            st = fs.stat(start) if start != "." else None
            if start != "." and (st is None or st.kind != "dir"):
                plans.append((raw, "glob", []))
                continue
            enter = frozenset(s for s in segments if not _GLOB_CHARS.search(s))
            rx = glob_to_regex(rel)
            files = walker.files(start, enter)
            for f in files:
                sizes[f.rel] = f.size
            plans.append((raw, "glob", broad(f for f in files if rx.fullmatch(f.rel))))
            continue
        try:
            st = fs.stat(rel) if rel != "." else None
        except ValueError as exc:  # a symlink leading outside the workspace
            plans.append((raw, f"refused: {exc}", []))
            continue
        if rel == "." or (st is not None and st.kind == "dir"):
            name = rel.rsplit("/", 1)[-1]
            files = walker.files(rel, frozenset({name}) if rel != "." else frozenset())
            for f in files:
                sizes[f.rel] = f.size
            plans.append((raw, "dir", broad(files)))
        elif st is not None and st.kind == "file":
            sizes[rel] = st.size
            plans.append((raw, "file", [rel]))
        else:
            plans.append((raw, "missing", []))

    fallback = False
    if not any(c for _, _, c in plans):
        fallback = True
        files = walker.files(".")
        for f in files:
            sizes[f.rel] = f.size
        plans.append(("(whole workspace)", "fallback", broad(files)))

    # header: what was asked, what matched, and a listing of the workspace
    listing_files = sorted(f.rel for f in walker.files("."))
    header = ["# Workspace evidence", ""]
    if fallback:
        header.append(
            "None of the requested entries matched a file; sampled the whole workspace ranked by rubric keywords."
        )
    header.append("Requested entries:")
    for raw, kind, cands in plans:
        header.append(f"- {raw} [{kind}]: {len(cands)} candidate file(s)")
    header.append("")
    listing_budget = min(LISTING_MAX_CHARS, max(0, total_chars // 6))
    shown, used = [], 0
    for rel in listing_files[:LISTING_MAX_LINES]:
        if used + len(rel) + 1 > listing_budget:
            break
        shown.append(rel)
        used += len(rel) + 1
    header.append(
        f"## File listing ({len(shown)} of {len(listing_files)} files; skipped folders: {', '.join(sorted(skip_dirs))})"
    )
    header.extend(shown)
    if len(shown) < len(listing_files):
        header.append(f"... {len(listing_files) - len(shown)} more")
    if walker.capped:
        header.append(f"(walk stopped after {MAX_WALK_FILES} files)")
    header.append("")
    text_parts = ["\n".join(header)]
    budget = total_chars - len(text_parts[0])

    queues = [list(c) for _, _, c in plans]
    taken = [0] * len(plans)
    chosen: list[str] = []
    seen: set[str] = set()
    truncated = 0
    skipped_binary: list[str] = []
    exhausted = False
    while not exhausted and any(queues) and len(chosen) < max_files and budget > MIN_PIECE_CHARS:
        progressed = False
        for qi, q in enumerate(queues):
            if len(chosen) >= max_files or budget <= MIN_PIECE_CHARS:
                exhausted = True
                break
            while q:
                rel = q.pop(0)
                if rel in seen:
                    continue
                seen.add(rel)
                got = _read_text(fs, rel, per_file_chars, tail)
                if got is None:
                    skipped_binary.append(rel)
                    continue
                content, more = got
                size = sizes.get(rel, len(content))
                head = f"### {rel} ({size} bytes)"
                room = min(per_file_chars, budget - len(head) - 80)
                if room < MIN_PIECE_CHARS and len(content) > room:
                    exhausted = True
                    break
                shown_text = (content[-room:] if tail else content[:room]) if len(content) > room else content
                cut = more or len(shown_text) < len(content)
                fence = "`" * max(3, _longest_backticks(shown_text) + 1)
                note = f"\n[{'last' if tail else 'first'} {len(shown_text)} chars of {size} bytes]" if cut else ""
                piece = f"{head}\n{fence}{_lang(rel)}\n{shown_text.rstrip()}\n{fence}{note}\n"
                if len(piece) + 1 > budget:
                    exhausted = True
                    break
                truncated += cut
                text_parts.append(piece)
                budget -= len(piece) + 1
                chosen.append(rel)
                taken[qi] += 1
                progressed = True
                break
            if exhausted:
                break
        if not progressed:
            break

    if not chosen:
        asked = ", ".join(raw_entries)
        why = (
            "the workspace has no readable text files"
            if not listing_files
            else f"no readable text file matched ({asked})"
        )
        return NoEvidence(f"no evidence: {why}")
    text = "\n".join(text_parts)
    summary = {
        "entries": [
            {"entry": raw, "kind": kind, "candidates": len(c), "sampled": n} for (raw, kind, c), n in zip(plans, taken)
        ],
        "files": chosen,
        "fallback_whole_workspace": fallback,
        "truncated_files": truncated,
        "skipped_binary": skipped_binary[:20],
        "workspace_files": len(listing_files),
        "walk_capped": walker.capped,
        "walk_timed_out": walker.timed_out,
        "chars": len(text),
    }
    return Evidence(text=text, kind="code_files", summary=summary)


def _longest_backticks(text: str) -> int:
    runs = re.findall(r"`+", text)
    return max((len(r) for r in runs), default=0)


def _lang(rel: str) -> str:
    ext = _ext_of(rel)
    return ext if re.fullmatch(r"[a-z0-9]{1,10}", ext or "") else ""


def _read_text(fs: FileSource, rel: str, chars: int, tail: bool) -> tuple[str, bool] | None:
    """(head or tail of a text file, whether the file holds more); None for binary or unreadable files.

    The tail is taken from the first :data:`TAIL_READ_BYTES` bytes of the file.
    """
    limit = TAIL_READ_BYTES if tail else max(chars * 4, 8192)
    try:
        data = fs.read(rel, limit)
    except (OSError, ValueError):
        return None
    if b"\0" in data[:8192]:
        return None
    text = data.decode("utf-8", "replace").replace("\r\n", "\n")
    more = len(data) >= limit or len(text) > chars
    return (text[-chars:] if tail else text[:chars]), more


def response_evidence(response: Any, *, total_chars: int = TOTAL_CHARS) -> Evidence | NoEvidence:
    """The last HTTP response (status, content type, path without query, body text) capped."""
    if response is None:
        return NoEvidence(
            "no evidence: no HTTP response to judge (the app did not answer, or no request was sent)", unreachable=True
        )
    text = getattr(response, "text", None)
    if text is None:
        body = getattr(response, "body", None)
        text = body if isinstance(body, str) else json.dumps(body, indent=2, sort_keys=True, default=str)
    headers = getattr(response, "headers", {}) or {}
    ctype = headers.get("content-type", "") if isinstance(headers, dict) else ""
    path = urlsplit(str(getattr(response, "url", "") or "")).path or "/"
    head = (
        f"HTTP {getattr(response, 'status', '?')} {ctype}".rstrip()
        + f"\nRequest: {getattr(response, 'method', '')} {path}\n\n"
    )
    room = max(0, total_chars - len(head))
    body = text[:room]
    note = f"\n[first {len(body)} of {len(text)} chars]" if len(text) > room else ""
    if not text.strip():
        return NoEvidence(f"no evidence: the last response (HTTP {getattr(response, 'status', '?')}) has an empty body")
    return Evidence(
        text=head + body + note,
        kind="http_response",
        summary={
            "status": getattr(response, "status", None),
            "path": path,
            "chars": len(body),
            "truncated": bool(note),
        },
    )


def dom_evidence(dom: str | None, *, fallback: Any = None, total_chars: int = TOTAL_CHARS) -> Evidence | NoEvidence:
    """The rendered DOM (from RENDER_DOM), else the last response's text; capped."""
    source = "rendered_dom"
    if not (isinstance(dom, str) and dom.strip()):
        if fallback is not None and isinstance(getattr(fallback, "text", None), str) and fallback.text.strip():
            dom, source = fallback.text, "last_response"
        else:
            return NoEvidence("no evidence: no rendered DOM (RENDER_DOM did not produce a page)", unreachable=True)
    assert isinstance(dom, str)
    body = dom[:total_chars]
    note = f"\n[first {len(body)} of {len(dom)} chars]" if len(dom) > total_chars else ""
    return Evidence(
        text=body + note, kind="rendered_dom", summary={"source": source, "chars": len(body), "truncated": bool(note)}
    )


def screenshot_evidence(
    paths: Sequence[str | Path], *, dom: str | None = None, max_images: int = MAX_IMAGES, total_chars: int = TOTAL_CHARS
) -> Evidence | NoEvidence:
    """The latest ``max_images`` screenshots (PNG/JPEG files written by SCREENSHOT) as images,
    with the rendered DOM as text when there is one."""
    chosen = list(paths)[-max_images:] if max_images > 0 else []
    images: list[bytes] = []
    names: list[str] = []
    problems: list[str] = []
    for p in chosen:
        path = Path(p)
        try:
            if path.stat().st_size > MAX_IMAGE_BYTES:
                problems.append(f"{path.name}: larger than {MAX_IMAGE_BYTES} bytes")
                continue
            data = path.read_bytes()
        except OSError as exc:
            problems.append(f"{path.name}: {exc.strerror or exc}")
            continue
        if not data.startswith((b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff")):
            problems.append(f"{path.name}: not a PNG or JPEG")
            continue
        images.append(data)
        names.append(path.name)
    if not images:
        detail = "; ".join(problems) or "no screenshot was taken"
        return NoEvidence(f"no evidence: no screenshot to judge ({detail})", unreachable=True)
    lines = [f"{len(images)} screenshot(s) attached: {', '.join(names)}"]
    if isinstance(dom, str) and dom.strip():
        room = max(0, total_chars - 200)
        lines += [
            "",
            "## Rendered DOM",
            dom[:room] + (f"\n[first {room} of {len(dom)} chars]" if len(dom) > room else ""),
        ]
    return Evidence(
        text="\n".join(lines),
        kind="screenshot",
        images=images,
        summary={"screenshots": names, "problems": problems, "with_dom": bool(dom), "chars": sum(map(len, lines))},
    )


# --- evidence of the public-DAG dialects (docs/dag-semantics.md "P17 evidence types") ---------------
EXCHANGE_BODY_CHARS = 1_500
MAX_EXCHANGES = 20
LISTING_MAX_ENTRIES = 200


def _request_path(response: Any) -> str:
    parts = urlsplit(str(getattr(response, "url", "") or ""))
    return (parts.path or "/") + (f"?{parts.query}" if parts.query else "")


def _body_text(response: Any) -> str:
    text = getattr(response, "text", None)
    if isinstance(text, str):
        return text
    body = getattr(response, "body", None)
    return body if isinstance(body, str) else json.dumps(body, indent=2, sort_keys=True, default=str)


def exchanges_evidence(
    responses: Sequence[Any],
    *,
    path_filters: Sequence[str] = (),
    max_exchanges: int = MAX_EXCHANGES,
    body_chars: int = EXCHANGE_BODY_CHARS,
    total_chars: int = TOTAL_CHARS,
    whole_log: bool = True,
) -> Evidence | NoEvidence:
    """The run's HTTP exchanges (oldest first; the newest ``max_exchanges``): method, path, status,
    content type and the first ``body_chars`` of each body. ``path_filters`` keeps the exchanges
    whose path contains one of them (all of them when none does, as the cvyocaao reference does).
    ``whole_log`` False says the context kept only the last response."""
    responses = [r for r in responses if r is not None]
    if not responses:
        return NoEvidence("no evidence: no HTTP exchange was recorded in this run", unreachable=True)
    chosen = responses
    filtered = False
    if path_filters:
        matching = [r for r in responses if any(f and f in _request_path(r) for f in path_filters)]
        if matching:
            chosen, filtered = matching, True
    chosen = chosen[-max_exchanges:] if max_exchanges > 0 else []
    head = [
        f"{len(chosen)} HTTP exchange(s) of this run, oldest first"
        + (f" (paths containing {', '.join(map(repr, path_filters))})" if filtered else "")
        + ("" if whole_log else " (only the last response is kept by this run)"),
        "",
    ]
    parts = ["\n".join(head)]
    budget = total_chars - len(parts[0])
    shown = 0
    for i, r in enumerate(chosen, 1):
        headers = getattr(r, "headers", {}) or {}
        ctype = headers.get("content-type", "") if isinstance(headers, dict) else ""
        body = _body_text(r)
        cut = body[:body_chars]
        piece = (
            f"--- exchange {i}: {getattr(r, 'method', '')} {_request_path(r)} -> {getattr(r, 'status', '?')}"
            + (f" ({ctype})" if ctype else "")
            + f" ---\n{cut}"
            + (f"\n[first {len(cut)} of {len(body)} chars]" if len(body) > len(cut) else "")
            + "\n"
        )
        if len(piece) > budget:
            break
        parts.append(piece)
        budget -= len(piece)
        shown += 1
    if not shown:
        return NoEvidence("no evidence: the recorded exchanges do not fit the evidence budget")
    text = "\n".join(parts)
    return Evidence(
        text=text,
        kind="http_exchanges",
        summary={
            "exchanges": shown,
            "recorded": len(responses),
            "filtered": filtered,
            "whole_log": whole_log,
            "chars": len(text),
        },
    )


def headers_evidence(response: Any, *, total_chars: int = TOTAL_CHARS) -> Evidence | NoEvidence:
    """The last response's status line and headers (gavmyneb ``http_response_headers``)."""
    if response is None:
        return NoEvidence("no evidence: no HTTP response whose headers could be judged", unreachable=True)
    headers = getattr(response, "headers", {}) or {}
    lines = [
        f"HTTP {getattr(response, 'status', '?')} for {getattr(response, 'method', '')} {_request_path(response)}",
        "",
        "## Response headers",
    ]
    lines += [f"{k}: {v}" for k, v in sorted(headers.items())] if isinstance(headers, dict) else []
    text = "\n".join(lines)[:total_chars]
    return Evidence(
        text=text,
        kind="http_response_headers",
        summary={
            "status": getattr(response, "status", None),
            "headers": len(headers) if isinstance(headers, dict) else 0,
            "chars": len(text),
        },
    )


def rows_evidence(document: Any, *, total_chars: int = TOTAL_CHARS) -> Evidence | NoEvidence:
    """The rows of the last database query (lgzivily ``db_query_result``: the P08 result)."""
    if not (isinstance(document, dict) and isinstance(document.get("rows"), list)):
        return NoEvidence(
            "no evidence: no database query result (db_query_result judges the rows of an earlier P08 step)"
        )
    rows = document["rows"]
    body = json.dumps(rows, indent=1, ensure_ascii=False, sort_keys=True, default=str)
    head = f"{len(rows)} row(s) returned by the last database query\n\n"
    room = max(0, total_chars - len(head))
    note = f"\n[first {room} of {len(body)} chars]" if len(body) > room else ""
    text = head + body[:room] + note
    return Evidence(
        text=text, kind="db_query_result", summary={"rows": len(rows), "chars": len(text), "truncated": bool(note)}
    )


def listing_evidence(
    fs: FileSource,
    base: str,
    *,
    depth: int = 2,
    max_entries: int = LISTING_MAX_ENTRIES,
    skip_dirs: frozenset[str] = EVIDENCE_SKIP_DIRS,
    total_chars: int = TOTAL_CHARS,
) -> Evidence | NoEvidence:
    """The files and folders under ``base`` down to ``depth`` levels (iyjruvfz ``directory_listing``),
    breadth first in name order, at most ``max_entries``; the folders of ``skip_dirs`` are listed but
    not entered."""
    rel = _norm_entry(base)
    if _escapes(rel):
        return NoEvidence(f"no evidence: directory {base!r} is outside the workspace")
    try:
        st = fs.stat(rel) if rel != "." else None
    except ValueError as exc:
        return NoEvidence(f"no evidence: {exc}")
    if rel != "." and (st is None or st.kind != "dir"):
        return NoEvidence(f"no evidence: directory {base!r} not found in the workspace")
    lines: list[str] = []
    frontier = [(rel, 1)]
    capped = False
    while frontier and not capped:
        current, level = frontier.pop(0)
        for entry in fs.listdir(current):
            if len(lines) >= max_entries:
                capped = True
                break
            shown = entry.rel if rel == "." else entry.rel[len(rel) + 1 :]
            name = entry.rel.rsplit("/", 1)[-1]
            if entry.kind == "dir":
                lines.append(shown + "/")
                if level < depth and name not in skip_dirs:
                    frontier.append((entry.rel, level + 1))
            else:
                lines.append(shown)
    header = (
        f"Listing of {'the workspace root' if rel == '.' else rel} (depth {depth}, {len(lines)} entries"
        + (f", stopped at {max_entries})" if capped else ")")
        + f"; folders not entered: {', '.join(sorted(skip_dirs))}\n\n"
    )
    text = (header + "\n".join(lines))[:total_chars]
    if not lines:
        return NoEvidence(f"no evidence: directory {base!r} is empty")
    return Evidence(
        text=text,
        kind="directory_listing",
        summary={"base": rel, "depth": depth, "entries": len(lines), "capped": capped, "chars": len(text)},
    )
