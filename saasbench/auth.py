"""Declared auth profiles: how an evaluation user of a task logs in, per role.

Per-task differences in authentication are data, not code: a task's ``auth.yaml`` (or the
``auth`` block of ``task.yaml``) names the evaluation users and one or more schemes. P13
logs a role in through them and makes that identity active; later HTTP primitives send its
headers and cookies. Built-in schemes cover the common cases:

- ``bearer``: JSON (or form) login, token taken from the response, sent as a header;
- ``session``: login sets a session cookie; a CSRF token (from the login body, a CSRF
  endpoint or a cookie) goes into a header on mutating requests;
- ``form``: an HTML form post (``application/x-www-form-urlencoded``) that sets a cookie;
- ``basic``: HTTP Basic with the user's username and password;
- ``api_key``: a header carrying the user's API key;
- ``none``: anonymous.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import yaml
from pydantic import BaseModel, Field, ValidationError, model_validator

from saasbench.http import ANONYMOUS, HttpResponse, Identity

if TYPE_CHECKING:
    from saasbench.context import RunContext

SchemeKind = Literal["bearer", "session", "form", "basic", "api_key", "none"]

# DAG P13 ``method`` values seen in real DAGs -> scheme kinds.
METHOD_ALIASES: dict[str, SchemeKind] = {
    "jwt": "bearer",
    "bearer": "bearer",
    "token": "bearer",
    "password_login": "bearer",
    "graphql_mutation": "bearer",
    "json": "bearer",
    "session": "session",
    "cookie": "session",
    "form": "form",
    "form_login": "form",
    "basic": "basic",
    "basic_auth": "basic",
    "api_key": "api_key",
    "apikey": "api_key",
    "none": "none",
    "anonymous": "none",
}

TOKEN_KEYS = ("access_token", "accessToken", "token", "jwt", "id_token", "api_key", "apiKey")


class LoginSpec(BaseModel):
    method: str = "POST"
    path: str
    body: dict[str, Any] | str | None = Field(
        default=None,
        description="Templated with the user's fields: {{username}}, {{password}}, {{email}}, ...",
    )
    body_format: Literal["json", "form", "graphql"] = "json"
    token_path: str | None = Field(default=None, description="Dotted path of the token in the response body; default: common keys")
    ok_statuses: list[int] = Field(default_factory=lambda: [200, 201, 204, 302, 303])


class CsrfSpec(BaseModel):
    header: str = "X-CSRF-Token"
    token_path: str | None = Field(default="csrf_token", description="Dotted path in the login (or csrf endpoint) response body")
    path: str | None = Field(default=None, description="GET this path after login to read the token")
    cookie: str | None = Field(default=None, description="Read the token from this cookie instead (double-submit)")


class Scheme(BaseModel):
    kind: SchemeKind
    login: LoginSpec | None = None
    header: str = "Authorization"
    header_template: str = "Bearer {token}"
    api_key_header: str = "X-API-Key"
    api_key_field: str = "api_key"
    csrf: CsrfSpec | None = None

    @model_validator(mode="after")
    def _needs_login(self) -> "Scheme":
        if self.kind in ("bearer", "session", "form") and self.login is None:
            raise ValueError(f"scheme kind {self.kind!r} needs a 'login' block")
        return self


class AuthProfile(BaseModel):
    """The file format of ``auth.yaml``."""

    default_scheme: str | None = None
    default_role: str = "admin"
    schemes: dict[str, Scheme] = Field(default_factory=dict)
    users: dict[str, dict[str, Any]] = Field(default_factory=dict, description="role -> username, password, email, api_key, ...")
    role_schemes: dict[str, str] = Field(default_factory=dict, description="role -> scheme name, when a role logs in differently")

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        # A single scheme may be written inline: {scheme: bearer, login: {...}, users: {...}}
        if isinstance(data, dict) and "scheme" in data and "schemes" not in data:
            data = dict(data)
            kind = data.pop("scheme")
            spec = {k: data.pop(k) for k in list(data) if k in Scheme.model_fields and k != "kind"}
            data["schemes"] = {kind: {"kind": kind, **spec}}
            data.setdefault("default_scheme", kind)
        return data

    @model_validator(mode="after")
    def _check(self) -> "AuthProfile":
        if self.default_scheme is None and self.schemes:
            self.default_scheme = next(iter(self.schemes))
        if self.default_scheme is not None and self.default_scheme not in self.schemes:
            raise ValueError(f"default_scheme {self.default_scheme!r} is not among schemes {sorted(self.schemes)}")
        for role, name in self.role_schemes.items():
            if name not in self.schemes:
                raise ValueError(f"role_schemes[{role}] names unknown scheme {name!r}")
        return self

    def scheme_for(self, role: str, method: str | None) -> tuple[str, Scheme] | None:
        """The scheme P13 uses: the DAG's ``method`` if the profile has it, else the role's, else the default."""
        if method:
            if method in self.schemes:
                return method, self.schemes[method]
            kind = METHOD_ALIASES.get(method.lower())
            for name, scheme in self.schemes.items():
                if kind is not None and scheme.kind == kind:
                    return name, scheme
        name = self.role_schemes.get(role, self.default_scheme)
        if name is None:
            return None
        return name, self.schemes[name]

    def context_vars(self) -> dict[str, Any]:
        """``<role>_<field>`` and ``eval_<role>_<field>`` for every evaluation user."""
        out: dict[str, Any] = {}
        for role, fields in self.users.items():
            for key, value in fields.items():
                out[f"{role}_{key}"] = value
                out[f"eval_{role}_{key}"] = value
        return out


class AuthProfileError(ValueError):
    pass


def load_auth_profile(path: str | Path) -> AuthProfile:
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise AuthProfileError(f"{path}: cannot read auth profile: {exc}") from exc
    except yaml.YAMLError as exc:
        raise AuthProfileError(f"{path}: invalid YAML: {exc}") from exc
    if isinstance(raw, dict) and isinstance(raw.get("auth"), dict):  # the auth block of a task.yaml
        raw = raw["auth"]
    try:
        return AuthProfile.model_validate(raw or {})
    except ValidationError as exc:
        details = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
        raise AuthProfileError(f"{path}: invalid auth profile: {details}") from exc


class LoginFailed(Exception):
    pass


class AuthManager:
    """Holds one identity per (role, scheme, credentials) for a run and logs in on demand."""

    def __init__(self, profile: AuthProfile | None):
        self.profile = profile or AuthProfile()
        self.identities: dict[tuple[str, str, tuple], Identity] = {}
        self.active: Identity = Identity(role=ANONYMOUS)

    def activate_anonymous(self) -> Identity:
        self.active = Identity(role=ANONYMOUS)
        return self.active

    def login(
        self,
        ctx: "RunContext",
        role: str,
        *,
        method: str | None = None,
        credentials: dict[str, Any] | None = None,
        login_path: str | None = None,
        force: bool = False,
    ) -> Identity:
        if role == ANONYMOUS or (method and METHOD_ALIASES.get(method.lower()) == "none"):
            return self.activate_anonymous()
        user = dict(self.profile.users.get(role, {}))
        if credentials:
            user.update({k: v for k, v in credentials.items() if v is not None})
        if not user:
            raise LoginFailed(f"role {role!r} has no credentials in the auth profile (known roles: {sorted(self.profile.users) or 'none'})")
        chosen = self.profile.scheme_for(role, method)
        if chosen is None:
            raise LoginFailed("the auth profile declares no scheme; pass --auth PROFILE.yaml or declare auth in task.yaml")
        name, scheme = chosen
        key = (role, name, tuple(sorted((k, str(v)) for k, v in user.items())) + (("_path", login_path or ""),))
        if not force and key in self.identities:
            self.active = self.identities[key]
            return self.active
        identity = self._login(ctx, role, scheme, user, login_path)
        self.identities[key] = identity
        self.active = identity
        for field_name, value in identity.info.items():
            ctx.vars[f"{role}_{field_name}"] = value
        return identity

    def _login(self, ctx: "RunContext", role: str, scheme: Scheme, user: dict[str, Any], login_path: str | None) -> Identity:
        identity = Identity(role=role)
        if scheme.kind == "none":
            return identity
        if scheme.kind == "basic":
            if "username" not in user or "password" not in user:
                raise LoginFailed(f"basic auth for role {role!r} needs username and password")
            raw = f"{user['username']}:{user['password']}".encode()
            identity.headers["Authorization"] = "Basic " + base64.b64encode(raw).decode()
            return identity
        if scheme.kind == "api_key":
            key = user.get(scheme.api_key_field)
            if not key:
                raise LoginFailed(f"role {role!r} has no {scheme.api_key_field!r} for the api_key scheme")
            identity.headers[scheme.api_key_header] = str(key)
            identity.info["api_key"] = key
            return identity
        assert scheme.login is not None
        response = self._send_login(ctx, identity, scheme, user, login_path)
        if response.status not in scheme.login.ok_statuses:
            snippet = response.text[:200].replace("\n", " ")
            raise LoginFailed(f"login as {role!r} at {scheme.login.path if not login_path else login_path} answered {response.status}: {snippet}")
        if scheme.kind == "bearer":
            token = _find_token(response.body, scheme.login.token_path)
            if not token:
                raise LoginFailed(f"login as {role!r} answered {response.status} but no token was found in the body" + (f" at {scheme.login.token_path}" if scheme.login.token_path else ""))
            identity.headers[scheme.header] = scheme.header_template.format(token=token)
            identity.info["token"] = token
        else:  # session / form: the cookie jar now holds the session
            if not identity.cookies:
                raise LoginFailed(f"login as {role!r} answered {response.status} but set no cookie")
        if scheme.csrf is not None:
            identity.csrf_header = scheme.csrf.header
            identity.csrf_token = self._csrf_token(ctx, identity, scheme.csrf, response)
            if not identity.csrf_token:
                raise LoginFailed(f"login as {role!r}: no CSRF token found")
        if isinstance(response.body, dict):
            user_obj = response.body.get("user") if isinstance(response.body.get("user"), dict) else None
            if user_obj and "id" in user_obj:
                identity.info["user_id"] = user_obj["id"]
        return identity

    def _send_login(self, ctx: "RunContext", identity: Identity, scheme: Scheme, user: dict[str, Any], login_path: str | None) -> HttpResponse:
        assert scheme.login is not None
        login = scheme.login
        body = ctx.resolver_with(user).resolve(login.body) if login.body is not None else {
            k: user[k] for k in ("username", "email", "password") if k in user
        }
        path = login_path or login.path
        if login.body_format == "form" or scheme.kind == "form":
            data = body if isinstance(body, dict) else None
            content = body if isinstance(body, str) else None
            headers = {"Content-Type": "application/x-www-form-urlencoded"} if content is not None else None
            return ctx.http.request(login.method, path, identity=identity, data=data, content=content, headers=headers, timeout_s=ctx.timeout())
        return ctx.http.request(login.method, path, identity=identity, json_body=body, timeout_s=ctx.timeout())

    def _csrf_token(self, ctx: "RunContext", identity: Identity, csrf: CsrfSpec, login_response: HttpResponse) -> str | None:
        if csrf.cookie:
            for cookie in identity.cookies.jar:
                if cookie.name == csrf.cookie:
                    return cookie.value
            return None
        source = login_response
        if csrf.path:
            source = ctx.http.request("GET", csrf.path, identity=identity, timeout_s=ctx.timeout())
        if csrf.token_path:
            from saasbench.placeholders import MISSING, split_path, walk

            found = walk(source.body, split_path(csrf.token_path.removeprefix("$.")))
            return None if found is MISSING or found is None else str(found)
        return None


def _find_token(body: Any, token_path: str | None) -> str | None:
    from saasbench.placeholders import MISSING, split_path, walk

    if token_path:
        found = walk(body, split_path(token_path.removeprefix("$.").removeprefix("$")))
        return None if found is MISSING or found in (None, "") else str(found)

    def search(value: Any, depth: int) -> str | None:
        if depth > 4:
            return None
        if isinstance(value, dict):
            for key in TOKEN_KEYS:
                if isinstance(value.get(key), str) and value[key]:
                    return value[key]
            for nested in value.values():
                found = search(nested, depth + 1)
                if found:
                    return found
        return None

    return search(body, 0)
