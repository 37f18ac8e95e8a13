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

A login (``bearer``/``session``/``form``) may start with a **pre-login** request in the same
cookie jar (``login.prelogin``): e.g. ``GET /login/`` of a server-rendered form, whose hidden
CSRF token is read by ``regex`` (group 1), ``css`` (a simple selector such as
``input[name=csrf_token]`` or ``input#csrf_token``, read with the stdlib HTML parser: tag,
``#id``, ``.class``, ``[attr]``, ``[attr=value]`` without combinators; ``attr`` names the
attribute, ``value`` by default), ``json_path`` or ``cookie``. Each extracted value is
``{{name}}`` in the login body and headers; a pattern that finds nothing is a LoginFailed naming
the pattern and the page. Redirects of the login are not followed unless
``login.follow_redirects``; a redirect back to the login page (``success_redirect_not: /login``
or ``failure_location_regex``) or a body matching ``failure_body_regex`` (a form re-rendered
with 200) is a LoginFailed saying the credentials were rejected.

``browser_scheme`` names the scheme the browser primitives log the active role in with (a
cookie session for server-rendered pages) while HTTP primitives keep the active identity (e.g.
a JWT bearer): :meth:`AuthManager.browser_identity`. Example: ``docs/examples/superset-auth.yaml``.
"""

from __future__ import annotations

import base64
import html
import re
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urljoin, urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from saasbench.dag.placeholders import UnresolvedPlaceholder
from saasbench.inputs import InputError, load_yaml
from saasbench.services import saferegex
from saasbench.services.http import ANONYMOUS, HttpResponse, Identity

if TYPE_CHECKING:
    from saasbench.evaluation.context import RunContext

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


_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_CSS_PART = re.compile(
    r"""(?P<tag>[A-Za-z][A-Za-z0-9-]*|\*)
      | \#(?P<id>[A-Za-z0-9_-]+)
      | \.(?P<cls>[A-Za-z0-9_-]+)
      | \[\s*(?P<attr>[A-Za-z_:][-A-Za-z0-9_:.]*)\s*
          (?:=\s*(?:"(?P<dq>[^"]*)"|'(?P<sq>[^']*)'|(?P<bare>[^\]\s"']+))\s*)?\]""",
    re.X,
)


@dataclass(frozen=True)
class SimpleSelector:
    """A compound CSS selector without combinators: ``tag``, ``#id``, ``.class``, ``[attr]``, ``[attr=value]``."""

    tag: str | None
    classes: tuple[str, ...]
    attrs: tuple[tuple[str, str | None], ...]  # (name, exact value or None for presence); #id is ("id", value)

    @classmethod
    def parse(cls, text: str) -> "SimpleSelector":
        source = text.strip()
        tag: str | None = None
        classes: list[str] = []
        attrs: list[tuple[str, str | None]] = []
        pos = 0
        while pos < len(source):
            m = _CSS_PART.match(source, pos)
            if m is None or (m.group("tag") and pos != 0):
                raise ValueError(
                    f"unsupported CSS selector {text!r} at {source[pos:]!r}: only one element's tag, #id, .class, "
                    "[attr] and [attr=value] written together without spaces (e.g. input[name=csrf_token], "
                    'input#csrf_token, meta[name="csrf-token"]); no combinators, lists or pseudo-classes'
                )
            if m.group("tag"):
                tag = None if m.group("tag") == "*" else m.group("tag").lower()
            elif m.group("id") is not None:
                attrs.append(("id", m.group("id")))
            elif m.group("cls") is not None:
                classes.append(m.group("cls"))
            else:
                value = next((v for v in (m.group("dq"), m.group("sq"), m.group("bare")) if v is not None), None)
                attrs.append((m.group("attr").lower(), value))
            pos = m.end()
        if not source:
            raise ValueError("empty CSS selector")
        return cls(tag, tuple(classes), tuple(attrs))

    def matches(self, tag: str, attrs: dict[str, str]) -> bool:
        if self.tag is not None and tag != self.tag:
            return False
        if self.classes and not set(self.classes) <= set(attrs.get("class", "").split()):
            return False
        return all(name in attrs and (value is None or attrs[name] == value) for name, value in self.attrs)


class _FirstElement(HTMLParser):
    """The attributes of the first element (document order) a :class:`SimpleSelector` matches."""

    def __init__(self, selector: SimpleSelector):
        super().__init__(convert_charrefs=True)
        self.selector = selector
        self.found: tuple[str, dict[str, str]] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if self.found is not None:
            return
        seen: dict[str, str] = {}
        for name, value in attrs:
            seen.setdefault(
                name, value if value is not None else ""
            )  # the first of duplicate attributes wins, as in browsers
        if self.selector.matches(tag, seen):
            self.found = (tag, seen)


def first_element(html_text: str, selector: str) -> tuple[str, dict[str, str]] | None:
    """``(tag, attributes)`` of the first element matching a simple selector, or None (stdlib parser)."""
    parser = _FirstElement(SimpleSelector.parse(selector))
    try:
        parser.feed(html_text)
        parser.close()
    except Exception:  # noqa: BLE001 - html.parser is lenient; anything it still rejects ends the search
        pass
    return parser.found


class ExtractSpec(BaseModel):
    """Where one pre-login value is read from: exactly one of ``regex``, ``css``, ``json_path``, ``cookie``."""

    model_config = ConfigDict(extra="forbid")

    regex: str | None = Field(
        default=None,
        description="Searched in the response text; the value is group 1 (the whole "
        "match when the pattern has no group), HTML character references decoded",
    )
    css: str | None = Field(
        default=None,
        description="A simple CSS selector read with the stdlib HTML parser: one element's "
        "tag, #id, .class, [attr], [attr=value] written together (input[name=csrf_token], "
        "input#csrf_token, meta[name=csrf-token]); no combinators or pseudo-classes. The first "
        "matching element's `attr` is the value",
    )
    attr: str = Field(
        default="value", description="With css: the attribute read (value for inputs, content for meta tags)"
    )
    json_path: str | None = Field(default=None, description="Dotted path in a JSON response body")
    cookie: str | None = Field(default=None, description="A cookie the pre-login response set (double-submit tokens)")

    @model_validator(mode="after")
    def _one_source(self) -> "ExtractSpec":
        given = [k for k in ("regex", "css", "json_path", "cookie") if getattr(self, k)]
        if len(given) != 1:
            raise ValueError(f"give exactly one of regex, css, json_path, cookie (got {given or 'none'})")
        if self.regex:
            try:
                saferegex.validate(self.regex)
            except re.error as exc:
                raise ValueError(f"invalid regex {self.regex!r}: {exc}") from exc
        if self.css:
            SimpleSelector.parse(self.css)
        self.attr = self.attr.lower()
        return self

    def describe(self) -> str:
        if self.regex:
            return f"regex {self.regex!r}"
        if self.css:
            return f"css {self.css!r} (attribute {self.attr!r})"
        if self.json_path:
            return f"json_path {self.json_path!r}"
        return f"cookie {self.cookie!r}"


class PreloginSpec(BaseModel):
    """A request sent before the login (same cookie jar) to read values the login needs, e.g. a form's CSRF token."""

    model_config = ConfigDict(extra="forbid")

    method: str = Field(default="GET", description="HTTP method of the pre-login request")
    path: str | None = Field(
        default=None, description="Page to request; default: the login path (after a P13 login_path override)"
    )
    headers: dict[str, str] = Field(
        default_factory=dict, description="Extra request headers, templated with the user's fields"
    )
    ok_statuses: list[int] = Field(
        default_factory=lambda: [200], description="Statuses that count as the page being served"
    )
    extract: dict[str, ExtractSpec] = Field(
        default_factory=dict,
        description="name -> where to read it; each value is available as {{name}} to the login body and headers",
    )

    @model_validator(mode="after")
    def _names(self) -> "PreloginSpec":
        for name in self.extract:
            if not _NAME.fullmatch(name):
                raise ValueError(f"extract name {name!r} is not an identifier usable as {{{{name}}}}")
        return self


class LoginSpec(BaseModel):
    method: str = "POST"
    path: str
    body: dict[str, Any] | str | None = Field(
        default=None,
        description="Templated with the user's fields: {{username}}, {{password}}, {{email}}, ... and the pre-login's "
        "extracted values ({{csrf_token}}); default: the user's username/email/password plus those values",
    )
    body_format: Literal["json", "form", "graphql"] = "json"
    headers: dict[str, str] = Field(
        default_factory=dict, description="Extra login request headers, templated like the body"
    )
    token_path: str | None = Field(
        default=None, description="Dotted path of the token in the response body; default: common keys"
    )
    ok_statuses: list[int] = Field(default_factory=lambda: [200, 201, 204, 302, 303])
    prelogin: PreloginSpec | None = Field(
        default=None,
        description="A request before the login (same cookie jar) whose "
        "extracted values the login body uses: an HTML form's hidden CSRF token",
    )
    follow_redirects: bool = Field(
        default=False,
        description="Follow the login's redirects (GET, same origin, at most 5) and "
        "judge the last response; off: the login's own response is judged",
    )
    success_redirect_not: str | None = Field(
        default=None,
        description="A redirect whose Location path is this path or under "
        "it (e.g. /login) means the credentials were rejected",
    )
    failure_location_regex: str | None = Field(
        default=None, description="A redirect whose Location matches this regex means the credentials were rejected"
    )
    failure_body_regex: str | None = Field(
        default=None,
        description="A response body matching this regex means the "
        "credentials were rejected (apps that re-render the form with 200)",
    )

    @field_validator("failure_location_regex", "failure_body_regex")
    @classmethod
    def _compiles(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                saferegex.validate(value)
            except re.error as exc:
                raise ValueError(f"invalid regex {value!r}: {exc}") from exc
        return value


class CsrfSpec(BaseModel):
    header: str = "X-CSRF-Token"
    token_path: str | None = Field(
        default="csrf_token", description="Dotted path in the login (or csrf endpoint) response body"
    )
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
    users: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="role -> username, password, email, api_key, ..."
    )
    role_schemes: dict[str, str] = Field(
        default_factory=dict, description="role -> scheme name, when a role logs in differently"
    )
    browser_scheme: str | None = Field(
        default=None,
        description="Scheme the browser primitives (RENDER_DOM, SCREENSHOT, P18, "
        "P19) log the active role in with, its cookies copied into the browser; HTTP "
        "primitives keep the active identity. Default: the browser carries the active identity",
    )

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
        if self.browser_scheme is not None and self.browser_scheme not in self.schemes:
            raise ValueError(f"browser_scheme {self.browser_scheme!r} is not among schemes {sorted(self.schemes)}")
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
        chosen = self.role_schemes.get(role, self.default_scheme)
        if chosen is None:
            return None
        return chosen, self.schemes[chosen]

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
        raw = load_yaml(path, what="auth profile")
    except InputError as exc:
        raise AuthProfileError(str(exc)) from None
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
        # id(identity) -> (role, scheme name, credentials) of every identity logged in here, so the
        # browser can log the active role in again with the profile's browser_scheme
        # (the identity itself is kept so a reused id() of a dropped one never matches)
        self._origins: dict[int, tuple[Identity, str, str, dict[str, Any]]] = {}

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
            raise LoginFailed(
                f"role {role!r} has no credentials in the auth profile (known roles: {sorted(self.profile.users) or 'none'})"
            )
        chosen = self.profile.scheme_for(role, method)
        if chosen is None:
            raise LoginFailed(
                "the auth profile declares no scheme; pass --auth PROFILE.yaml or declare auth in task.yaml"
            )
        name, scheme = chosen
        key = (role, name, tuple(sorted((k, str(v)) for k, v in user.items())) + (("_path", login_path or ""),))
        if not force and key in self.identities:
            self.active = self.identities[key]
            return self.active
        identity = self._login(ctx, role, scheme, user, login_path)
        self.identities[key] = identity
        self._origins[id(identity)] = (identity, role, name, user)
        self.active = identity
        for field_name, value in identity.info.items():
            ctx.vars[f"{role}_{field_name}"] = value
        return identity

    def browser_identity(
        self, ctx: "RunContext", role: str | None = None, method: str | None = None
    ) -> Identity | None:
        """The identity a browser page carries (None: anonymous); the active identity is left as it was.

        With ``role``: that role logged in with ``method``, else the profile's ``browser_scheme``, else
        the scheme P13 would use. Without: the active identity, or, when the profile names a
        ``browser_scheme`` and the active identity was logged in with another scheme, the active role
        (same credentials) logged in with the browser scheme (once per run, then cached). An identity
        that did not come from a login here (nothing to log in again) is carried as it is. Raises
        :class:`LoginFailed` and ``httpx.HTTPError`` like :meth:`login`.
        """
        previous = self.active
        try:
            if role is not None:
                identity = self.login(ctx, role, method=method or self.profile.browser_scheme)
                return None if identity.role == ANONYMOUS else identity
            if previous is None or previous.role == ANONYMOUS:
                return None
            origin = self._origins.get(id(previous))
            wanted = self.profile.browser_scheme
            if wanted is None or origin is None or origin[0] is not previous or origin[2] == wanted:
                return previous
            _identity, active_role, _scheme_name, user = origin
            return self.login(ctx, active_role, method=wanted, credentials=user)
        finally:
            self.active = previous

    def _login(
        self, ctx: "RunContext", role: str, scheme: Scheme, user: dict[str, Any], login_path: str | None
    ) -> Identity:
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
        chain = self._send_login(ctx, role, identity, scheme, user, login_path)
        response = chain[-1]
        _check_rejected(role, login_path or scheme.login.path, scheme.login, chain)
        if response.status not in scheme.login.ok_statuses:
            snippet = response.text[:200].replace("\n", " ")
            raise LoginFailed(
                f"login as {role!r} at {scheme.login.path if not login_path else login_path} answered {response.status}: {snippet}"
            )
        if scheme.kind == "bearer":
            token = _find_token(response.body, scheme.login.token_path)
            if not token:
                raise LoginFailed(
                    f"login as {role!r} answered {response.status} but no token was found in the body"
                    + (f" at {scheme.login.token_path}" if scheme.login.token_path else "")
                )
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

    def _send_login(
        self,
        ctx: "RunContext",
        role: str,
        identity: Identity,
        scheme: Scheme,
        user: dict[str, Any],
        login_path: str | None,
    ) -> list[HttpResponse]:
        """The login exchange in the identity's cookie jar: the pre-login request (if any), the login,
        and its redirects when ``follow_redirects``. Returns the login's response and the followed ones."""
        assert scheme.login is not None
        login = scheme.login
        path = login_path or login.path
        extracted = (
            self._prelogin(ctx, role, identity, login.prelogin, path, user) if login.prelogin is not None else {}
        )
        resolver = ctx.resolver_with({**user, **extracted})
        try:
            if login.body is not None:
                body = resolver.resolve(login.body)
            else:
                body = {k: user[k] for k in ("username", "email", "password") if k in user} | extracted
            headers = {str(k): str(v) for k, v in resolver.resolve(login.headers).items()}
        except UnresolvedPlaceholder as exc:
            raise LoginFailed(
                f"login as {role!r}: the login request names {exc.placeholder}, which is neither a field of "
                f"the user ({', '.join(sorted(user))}) nor a pre-login value "
                f"({', '.join(sorted(extracted)) or 'none'}) nor a run variable"
            ) from exc
        if login.body_format == "form" or scheme.kind == "form":
            data = body if isinstance(body, dict) else None
            content = body if isinstance(body, str) else None
            if content is not None and not any(k.lower() == "content-type" for k in headers):
                headers["Content-Type"] = "application/x-www-form-urlencoded"
            response = ctx.http.request(
                login.method,
                path,
                identity=identity,
                data=data,
                content=content,
                headers=headers or None,
                timeout_s=ctx.timeout(),
            )
        else:
            response = ctx.http.request(
                login.method, path, identity=identity, json_body=body, headers=headers or None, timeout_s=ctx.timeout()
            )
        chain = [response]
        if login.follow_redirects:
            chain += _follow_redirects(ctx, identity, response)
        return chain

    def _prelogin(
        self,
        ctx: "RunContext",
        role: str,
        identity: Identity,
        spec: PreloginSpec,
        login_path: str,
        user: dict[str, Any],
    ) -> dict[str, str]:
        """Send the pre-login request (its cookies land in the identity's jar) and read its values."""
        path = spec.path or login_path
        page = f"pre-login {spec.method.upper()} {path}"
        try:
            headers = {str(k): str(v) for k, v in ctx.resolver_with(user).resolve(spec.headers).items()}
        except UnresolvedPlaceholder as exc:
            raise LoginFailed(f"login as {role!r}: {page}: unresolved header placeholder {exc.placeholder}") from exc
        response = ctx.http.request(
            spec.method, path, identity=identity, headers=headers or None, timeout_s=ctx.timeout()
        )
        if response.status not in spec.ok_statuses:
            snippet = response.text[:200].replace("\n", " ")
            raise LoginFailed(
                f"login as {role!r}: {page} answered {response.status} (expected {spec.ok_statuses}): {snippet}"
            )
        out: dict[str, str] = {}
        for name, how in spec.extract.items():
            value, why = _extract(how, response, identity)
            if value is None:
                raise LoginFailed(
                    f"login as {role!r}: {page}: {how.describe()} for {name!r} {why} "
                    f"(status {response.status}, {len(response.text)} chars of body)"
                )
            out[name] = value
        return out

    def _csrf_token(
        self, ctx: "RunContext", identity: Identity, csrf: CsrfSpec, login_response: HttpResponse
    ) -> str | None:
        if csrf.cookie:
            for cookie in identity.cookies.jar:
                if cookie.name == csrf.cookie:
                    return cookie.value
            return None
        source = login_response
        if csrf.path:
            source = ctx.http.request("GET", csrf.path, identity=identity, timeout_s=ctx.timeout())
        if csrf.token_path:
            from saasbench.dag.placeholders import MISSING, split_path, walk

            found = walk(source.body, split_path(csrf.token_path.removeprefix("$.")))
            return None if found is MISSING or found is None else str(found)
        return None


def _find_token(body: Any, token_path: str | None) -> str | None:
    from saasbench.dag.placeholders import MISSING, split_path, walk

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


MAX_LOGIN_REDIRECTS = 5
_REDIRECTS = (301, 302, 303, 307, 308)


def _origin(url: str) -> tuple[str, str]:
    parts = urlsplit(url)
    return parts.scheme.lower(), parts.netloc.lower()


def _follow_redirects(ctx: "RunContext", identity: Identity, response: HttpResponse) -> list[HttpResponse]:
    """GET each redirect target on the app's own origin, at most :data:`MAX_LOGIN_REDIRECTS`."""
    followed: list[HttpResponse] = []
    origin = _origin(ctx.http.url("/"))
    current = response
    for _ in range(MAX_LOGIN_REDIRECTS):
        location = current.headers.get("location")
        if current.status not in _REDIRECTS or not location:
            break
        target = urljoin(current.url, location)
        if _origin(target) != origin:
            break  # never leave the app (an SSO hop is not followed; the redirect is judged as it is)
        current = ctx.http.request("GET", target, identity=identity, timeout_s=ctx.timeout())
        followed.append(current)
    return followed


def _path_is_under(url: str, page: str) -> bool:
    """Whether ``url``'s path is ``page`` or below it (``/login`` covers ``/login/`` and ``/login/?next=/``)."""
    path = urlsplit(url).path or "/"
    wanted = (urlsplit(page).path if "://" in page else page).rstrip("/") or "/"
    return path == wanted or path.rstrip("/") == wanted or path.startswith(wanted.rstrip("/") + "/")


def _check_rejected(role: str, where: str, login: LoginSpec, chain: list[HttpResponse]) -> None:
    """Raise LoginFailed when a redirect leads back to the login page or the body says the login failed."""
    for response in chain:
        location = response.headers.get("location")
        if response.status not in _REDIRECTS or not location:
            continue
        target = urljoin(response.url, location)
        if login.success_redirect_not and _path_is_under(target, login.success_redirect_not):
            raise LoginFailed(
                f"login as {role!r} at {where}: credentials rejected: {response.status} redirect to "
                f"{location} is the login page again (success_redirect_not {login.success_redirect_not!r})"
            )
        if login.failure_location_regex and saferegex.search(
            login.failure_location_regex, location, what="the login redirect's Location"
        ):
            raise LoginFailed(
                f"login as {role!r} at {where}: credentials rejected: {response.status} redirect to "
                f"{location} matches failure_location_regex {login.failure_location_regex!r}"
            )
    if login.failure_body_regex:
        found = saferegex.search(login.failure_body_regex, chain[-1].text, what="the login response")
        if found:
            raise LoginFailed(
                f"login as {role!r} at {where}: credentials rejected: the response ({chain[-1].status}) "
                f"matches failure_body_regex {login.failure_body_regex!r}: {found.group(0)[:100]!r}"
            )


def _extract(how: ExtractSpec, response: HttpResponse, identity: Identity) -> tuple[str | None, str]:
    """One pre-login value and, when there is none, why (for the LoginFailed message)."""
    if how.regex:
        # the app's page, the profile's pattern: bounded by the node deadline (RegexTimeout)
        found = saferegex.search(how.regex, response.text, what="the pre-login page")
        if found is None:
            return None, "matched nothing"
        value = found.group(1) if found.re.groups else found.group(0)
        if not value:
            return None, "matched, but its group is empty"
        return html.unescape(value), ""
    if how.css:
        element = first_element(response.text, how.css)
        if element is None:
            return None, "matched no element"
        tag, attrs = element
        if how.attr not in attrs:
            return None, f"matched <{tag}>, which has no {how.attr!r} attribute"
        if not attrs[how.attr]:
            return None, f"matched <{tag}>, whose {how.attr!r} attribute is empty"
        return attrs[how.attr], ""
    if how.json_path:
        from saasbench.dag.placeholders import MISSING, split_path, walk

        found = walk(response.body, split_path(how.json_path.removeprefix("$.").removeprefix("$")))
        if found is MISSING or found in (None, "") or isinstance(found, (dict, list)):
            return (
                None,
                "found no scalar value in the JSON body" if response.is_json else "found nothing: the body is not JSON",
            )
        return str(found), ""
    for cookie in identity.cookies.jar:
        if cookie.name == how.cookie and cookie.value:
            return cookie.value, ""
    return None, "was not set"
