"""Auth primitives: P13 (log in as a role through the task's auth profile)."""

from __future__ import annotations

from typing import Any

import httpx
from pydantic import Field, model_validator

from saasbench.dag import note
from saasbench.evaluation.context import RunContext
from saasbench.evaluation.results import StepResult
from saasbench.primitives.registry import PrimitiveInputs, primitive
from saasbench.services.auth import LoginFailed


class P13Inputs(PrimitiveInputs):
    role: str = Field(default="admin", description="Evaluation role to log in as; 'anonymous' clears the identity")
    method: str | None = Field(
        default=None,
        description="Scheme name or legacy alias (jwt, password_login, api_key, basic_auth, form, graphql_mutation)",
    )
    credentials: dict[str, Any] | None = Field(default=None, description="Override the role's username/email/password")
    login_path: str | None = Field(default=None, description="Override the scheme's login path")
    force_refresh: bool = Field(default=False, description="Log in again even if this role has a cached identity")

    @model_validator(mode="before")
    @classmethod
    def _legacy(cls, data: Any) -> Any:
        if isinstance(data, dict) and ("username" in data or "password" in data or "email" in data):
            data = dict(data)
            creds = dict(data.get("credentials") or {})
            for key in ("username", "password", "email"):
                if key in data:
                    creds[key] = data.pop(key)
            data["credentials"] = creds
            note("top-level username/password/email -> credentials")
        return data


@primitive("P13", P13Inputs)
def auth_login(inputs: P13Inputs, ctx: RunContext) -> StepResult:
    """Log in as ``role`` (cached per run) and make it the identity of later requests."""
    try:
        identity = ctx.auth.login(
            ctx,
            inputs.role,
            method=inputs.method,
            credentials=inputs.credentials,
            login_path=inputs.login_path,
            force=inputs.force_refresh,
        )
    except LoginFailed as exc:
        return StepResult(passed=False, message=str(exc))
    except httpx.HTTPError as exc:
        return StepResult(passed=False, unreachable=True, message=f"login request failed: {type(exc).__name__}: {exc}")
    return StepResult(
        passed=True,
        message=f"active identity: {identity.role}",
        value={"role": identity.role},
        evidence={"role": identity.role, "headers": sorted(identity.headers)},
    )
