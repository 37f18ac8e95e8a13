"""The model gateway's hooks, run inside the LiteLLM proxy process (custom_auth and callbacks).

Loaded through a one-line shim that ``saasbench.runs.gateway`` writes next to the proxy config
(LiteLLM imports hooks by file path); the proxy runs with this virtual environment's Python, so
this module imports the key helpers from the gateway instead of copying them. Reads its
configuration from ``SAASBENCH_GATEWAY_*`` variables the gateway sets for the proxy.
"""

import contextvars
import hmac
import json
import os
import threading
import time

from litellm.integrations.custom_logger import CustomLogger

from saasbench.runs.gateway import LLM_ROUTES
from saasbench.runs.gateway import key_trial as _key_trial
from saasbench.runs.upstream import CALL_HEADER

CALLS_PATH = os.environ["SAASBENCH_GATEWAY_CALLS"]
_SECRET = os.environ["SAASBENCH_GATEWAY_SECRET"].encode()
_MASTER = os.environ["SAASBENCH_GATEWAY_MASTER_KEY"]
MIN_S = float(os.environ.get("SAASBENCH_GATEWAY_BACKOFF_MIN_S", "10"))
MAX_S = float(os.environ.get("SAASBENCH_GATEWAY_BACKOFF_MAX_S", "60"))
NUM_RETRIES = int(os.environ.get("SAASBENCH_GATEWAY_NUM_RETRIES", "5"))
_lock = threading.Lock()


def write(kind, **fields):
    line = json.dumps({"kind": kind, "t": time.time(), **fields}, default=str)
    with _lock, open(CALLS_PATH, "a", encoding="utf-8") as fh:
        fh.write(line + "\n")


def key_trial(key):
    """(trial_id, session) of a valid virtual key, else None (the gateway's own check)."""
    return _key_trial(_SECRET, key)


async def user_api_key_auth(request, api_key):
    from litellm.proxy._types import LitellmUserRoles, ProxyException, UserAPIKeyAuth

    if isinstance(api_key, str) and _MASTER and hmac.compare_digest(api_key.encode(), _MASTER.encode()):
        return UserAPIKeyAuth(api_key=api_key, user_id="saasbench-admin", user_role=LitellmUserRoles.PROXY_ADMIN)
    found = key_trial(api_key)
    if found is None:
        raise ProxyException(message="invalid saasbench gateway key", type="auth_error", param="api_key", code=401)
    trial, session = found
    route = request.url.path
    if route.rstrip("/").endswith(LLM_ROUTES):
        write("request", trial_id=trial, session=session, route=route)
    return UserAPIKeyAuth(
        api_key=api_key, user_id=trial, metadata={"saasbench_trial": trial, "saasbench_session": session}
    )


def _who(kwargs, slo):
    md = slo.get("metadata") or {}
    auth = md.get("user_api_key_auth_metadata") or {}
    trial = auth.get("saasbench_trial") or md.get("user_api_key_user_id")
    session = auth.get("saasbench_session")
    if not trial:
        for key in ("litellm_metadata", "metadata"):
            meta = (kwargs.get("litellm_params") or {}).get(key) or kwargs.get(key) or {}
            if isinstance(meta, dict) and meta.get("user_api_key_user_id"):
                trial = meta.get("user_api_key_user_id")
                break
    return trial, session


def _common(kwargs, slo):
    trial, session = _who(kwargs, slo)
    hidden = slo.get("hidden_params") or {}
    return {
        "call_id": slo.get("litellm_call_id") or kwargs.get("litellm_call_id") or slo.get("id"),
        "trial_id": trial,
        "session": session,
        "model": slo.get("model"),
        "model_group": slo.get("model_group"),
        "api_base": slo.get("api_base") or hidden.get("api_base"),
        "call_type": slo.get("call_type"),
        "stream": slo.get("stream"),
        "start": slo.get("startTime"),
        "end": slo.get("endTime"),
    }


def _status(exc):
    code = getattr(exc, "status_code", None) or getattr(exc, "code", None)
    try:
        return int(code)
    except (TypeError, ValueError):
        return None


class Logger(CustomLogger):
    async def async_pre_call_hook(self, user_api_key_dict, cache, data, call_type):
        """Name the call on the provider request (the upstream tap keys the provider's usage by it)."""
        call_id = data.get("litellm_call_id") if isinstance(data, dict) else None
        if call_id:
            headers = data.get("extra_headers")
            data["extra_headers"] = {**(headers if isinstance(headers, dict) else {}), CALL_HEADER: str(call_id)}
        return data

    async def async_log_success_event(self, kwargs, response_obj, start_time, end_time):
        try:
            slo = kwargs.get("standard_logging_object") or {}
            write(
                "success",
                **_common(kwargs, slo),
                prompt_tokens=slo.get("prompt_tokens"),
                completion_tokens=slo.get("completion_tokens"),
                response_cost=slo.get("response_cost"),
            )
        except Exception as exc:  # noqa: BLE001 - never break a request for the counting
            write("hook_error", where="success", error=repr(exc))

    async def async_log_failure_event(self, kwargs, response_obj, start_time, end_time):
        try:
            slo = kwargs.get("standard_logging_object") or {}
            exc = kwargs.get("exception")
            info = slo.get("error_information") or {}
            write(
                "attempt_failure",
                **_common(kwargs, slo),
                error_class=type(exc).__name__ if exc is not None else info.get("error_class"),
                error=str(exc)[:2000] if exc is not None else info.get("error_message"),
                http_status=_status(exc),
            )
        except Exception as exc:  # noqa: BLE001 - a hook must never break a proxied request
            write("hook_error", where="failure", error=repr(exc))

    async def async_post_call_failure_hook(
        self, request_data, original_exception, user_api_key_dict, traceback_str=None
    ):
        try:
            meta = getattr(user_api_key_dict, "metadata", None) or {}
            write(
                "final_failure",
                call_id=request_data.get("litellm_call_id"),
                trial_id=meta.get("saasbench_trial") or getattr(user_api_key_dict, "user_id", None),
                session=meta.get("saasbench_session"),
                model_group=request_data.get("model"),
                error_class=type(original_exception).__name__,
                error=str(original_exception)[:2000],
                http_status=_status(original_exception),
                end=time.time(),
            )
        except Exception as exc:  # noqa: BLE001 - a hook must never break a proxied request
            write("hook_error", where="post_failure", error=repr(exc))


logger = Logger()


# --- retry waits: backoff_min_s * 2**n capped at backoff_max_s (litellm's own core caps at 8 s) --------------
def _install_backoff():
    import litellm.router_rust.core as core
    from litellm.router_python_host import PythonHost

    if getattr(PythonHost, "_saasbench_backoff", None) is not None:
        return True  # the module is loaded twice (callbacks and custom_auth): patch once
    state = contextvars.ContextVar("saasbench_retry_state", default=None)
    run_steps = core.RustCore._run_steps
    sleep = PythonHost.sleep
    retry_after_seconds = core.retry_after_seconds

    async def _run_steps(self, driver, call):
        token = state.set({"driver": driver, "n": 0})
        try:
            return await run_steps(self, driver, call)
        finally:
            state.reset(token)

    def _sleep(self, seconds):
        st = state.get()
        if st is None:
            return sleep(self, seconds)
        n = st["n"]
        st["n"] = n + 1
        if n >= NUM_RETRIES:
            return sleep(self, 0)  # litellm sleeps once more after the last attempt failed: no one waits for it
        wait = MIN_S * (2**n)
        error = getattr(st["driver"], "last_error", None)
        try:
            asked = retry_after_seconds(error) if isinstance(error, BaseException) else None
        except Exception:  # noqa: BLE001 - a hook must never break a proxied request
            asked = None
        if asked is not None and asked > wait:
            wait = asked
        wait = min(wait, MAX_S)
        request = getattr(st["driver"], "_request", None) or {}
        meta = {}
        for key in ("litellm_metadata", "metadata"):
            if isinstance(request.get(key), dict) and request[key].get("user_api_key_user_id"):
                meta = request[key]
                break
        auth = meta.get("user_api_key_auth_metadata") or meta.get("user_api_key_metadata") or {}
        write(
            "retry",
            call_id=request.get("litellm_call_id"),
            trial_id=meta.get("user_api_key_user_id"),
            session=auth.get("saasbench_session") if isinstance(auth, dict) else None,
            n=n,
            wait_s=wait,
            litellm_wait_s=seconds,
            error_class=type(error).__name__ if error is not None else None,
            model_group=request.get("model"),
        )
        return sleep(self, wait)

    core.RustCore._run_steps = _run_steps
    PythonHost.sleep = _sleep
    PythonHost._saasbench_backoff = (MIN_S, MAX_S)
    return True


try:
    _patched = _install_backoff()
    _why = None
except Exception as exc:  # noqa: BLE001 - reported to the harness, which refuses to run on litellm's schedule
    _patched, _why = False, repr(exc)
write("hooks_loaded", backoff_patched=_patched, error=_why, min_s=MIN_S, max_s=MAX_S, pid=os.getpid())
