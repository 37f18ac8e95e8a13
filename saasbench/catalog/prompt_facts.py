"""Declared task facts read from a SaaSBench ``prompt_for_model.md``.

Every public SaaSBench task ships ``check/task_<id>/prompt_for_model.md``: the text a model under test
receives. It is free-form markdown written by hand, so the same fact appears in many shapes::

    # SaaSBench Test Prompt — task_<id> (<Product>)
    ## Prompt
    You work inside the container `<name>`, with `/app` as the working directory ...
    **Tools pre-installed in the container** (Ubuntu 22.04):
    - Node.js 20 + npm ...
    **Database (PostgreSQL 16, already running):**        or a `| Field | Value |` table,
    - Host: `db`                                          or "Host (intra-container): `postgres`, port `5432`"
    - Port: `3306` (in-container; host-side `3309`)
    **Redis (already running):** ...                      other running services
    **The application MUST listen on container port `8000`** (mapped to host port `8014`).
    - Admin: username=`x`, email=`y`, password=`z` (admin=true)     or a `| Role | Email | Password |` table
    ### Key technical requirements
    - **Framework**: ...
    ## Tester Workflow

``parse_prompt_for_model`` turns that text into a ``PromptFacts`` model with plain regular expressions
(one small function per fact). Facts are read from the "## Prompt" section only (the tester notes
after it talk about host-side commands); a fact that cannot be found becomes ``None`` / ``[]`` and
adds a line to ``PromptFacts.warnings`` instead of raising.

The prompt is untrusted data: it is only matched against patterns, never executed, evaluated,
fetched or used as a path. Callers should treat the extracted strings (passwords, URLs, commands in
requirements) the same way.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any, Callable, NamedTuple, TypeVar, cast

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["DatabaseFacts", "EvalUser", "PromptFacts", "ServiceFacts", "parse_prompt_for_model"]


# --------------------------------------------------------------------------------------------- models


class EvalUser(BaseModel):
    """An account the harness logs in with; the prompt tells the model to create it (or says the
    harness creates it), so a runner can check it exists before scoring."""

    model_config = ConfigDict(extra="forbid")

    role: str | None = None
    username: str | None = None
    email: str | None = None
    password: str | None = None
    name: str | None = None
    extra: dict[str, str] = Field(default_factory=dict)


class DatabaseFacts(BaseModel):
    """The primary database the app must use; its coordinates are what judges and DB probes connect
    to, so they are kept apart from the free text."""

    model_config = ConfigDict(extra="forbid")

    engine: str | None = None
    version: str | None = None
    host: str | None = None
    port: int | None = None
    host_port: int | None = None
    name: str | None = None
    user: str | None = None
    password: str | None = None
    extensions: list[str] = Field(default_factory=list)


class ServiceFacts(BaseModel):
    """Another already-running dependency (cache, queue, mock receiver) the app may reach."""

    model_config = ConfigDict(extra="forbid")

    name: str
    host: str | None = None
    port: int | None = None


class PromptFacts(BaseModel):
    """Everything a prompt declares about its environment, so runners and checks need not re-read
    the markdown; ``warnings`` lists what could not be found."""

    model_config = ConfigDict(extra="forbid")

    source: str = "<memory>"
    task: str | None = None
    product: str | None = None
    container: str | None = None
    workdir: str | None = None
    base_os: str | None = None
    tools: list[str] = Field(default_factory=list)
    database: DatabaseFacts | None = None
    services: list[ServiceFacts] = Field(default_factory=list)
    app_port: int | None = None
    host_port: int | None = None
    users: list[EvalUser] = Field(default_factory=list)
    env_vars: list[str] = Field(default_factory=list)
    requirements: list[str] = Field(default_factory=list)
    prompt_text: str = ""
    warnings: list[str] = Field(default_factory=list)


# ------------------------------------------------------------------------------------- text helpers

_HEADING_RE = re.compile(r"^#{1,6}\s")
_RULE_RE = re.compile(r"^\s*(?:-{3,}|\*{3,}|_{3,})\s*$")
_BULLET_RE = re.compile(r"^(\s*)(?:[-*+]|\d+[.)])\s+(.*)$")
_CODE_RE = re.compile(r"`([^`]*)`")
_EMAIL_RE = re.compile(r"[\w.+-]{1,64}@[\w-]{1,63}(?:\.[\w-]{1,63}){1,8}")
_ENGINE_RE = re.compile(r"(?i)\b(postgres(?:ql)?|mysql|mariadb|mongo(?:db)?|sqlite3?)\b(?:\s*(\d+(?:\.(?:\d+|x))*))?")
_URL_RE = re.compile(
    r"\b(?P<scheme>[a-z][\w+.-]{0,20})://(?:(?P<user>[^:@/\s`]+)(?::(?P<pw>[^@\s`]*))?@)?"
    r"(?P<host>[^:/\s`?]+)(?::(?P<port>\d+))?(?:/(?P<name>[\w.-]+))?"
)
_PAREN_RE = re.compile(r"\(([^)\n]{0,300})\)")
_ENV_NAME_RE = re.compile(r"\b[A-Z][A-Z0-9]*(?:_[A-Z0-9<>]+)*_?\*?")


def _strip_md(text: str) -> str:
    """Drop bold/italic markers, backticks and link targets, collapse spaces."""
    text = re.sub(r"\[([^\]\n]{0,300})\]\([^)\n]{0,500}\)", r"\1", text)
    text = text.replace("**", "").replace("__", "").replace("`", "")
    return re.sub(r"\s+", " ", text).strip()


def _first_code(text: str) -> str | None:
    m = _CODE_RE.search(text)
    return m.group(1).strip() if m else None


def _value(text: str) -> str:
    """A cell/field value: the first backticked token, else the text without parentheticals."""
    code = _first_code(text)
    if code is not None:
        return code
    return _strip_md(_PAREN_RE.sub("", text)).strip(" ,;.")


def _to_int(text: str | None) -> int | None:
    try:
        return int(text) if text else None
    except ValueError:
        return None


def _norm_key(key: str) -> str:
    """'Host (intra-container)' -> 'host'; 'UserPermissionRole' -> 'user_permission_role'."""
    key = _PAREN_RE.sub("", _strip_md(key))
    key = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", key.strip())
    return re.sub(r"[^a-z0-9]+", "_", key.lower()).strip("_")


def _is_table_sep(line: str) -> bool:
    """'|---|:---:|' (checked without a regex: the obvious pattern backtracks on long dash runs)."""
    s = line.strip()
    return "-" in s and not set(s) - set("|:- \t")


def _is_heading(line: str) -> bool:
    return bool(_HEADING_RE.match(line)) or line.startswith("**")


def _table_cells(line: str) -> list[str] | None:
    s = line.strip()
    if not (s.startswith("|") and s.endswith("|") and len(s) > 1):
        return None
    return [c.strip() for c in s[1:-1].split("|")]


def _field(text: str) -> tuple[str, str] | None:
    """'Host (intra-container): `postgres`, port `5432`' -> ('host', '`postgres`, port `5432`')."""
    m = re.match(r"^\s*([^:`]{1,60}?)\s*:\s*(.*)$", text)
    if not m or not re.fullmatch(r"[\w .()/*-]+", m.group(1)):
        return None
    return _norm_key(m.group(1)), m.group(2).strip()


class _Block(NamedTuple):
    """A bold-line paragraph such as '**Redis (already running):**' and the lines under it."""

    start: int
    heading: str
    body: list[str]


def _section_body(lines: list[str], start: int) -> list[str]:
    """The lines after ``lines[start]`` up to the next heading, bold line or horizontal rule."""
    end = start + 1
    while end < len(lines) and not (_is_heading(lines[end]) or _RULE_RE.match(lines[end])):
        end += 1
    return lines[start + 1 : end]


def _bold_blocks(lines: list[str]) -> list[_Block]:
    return [_Block(i, line, _section_body(lines, i)) for i, line in enumerate(lines) if line.startswith("**")]


def _block_fields(body: list[str]) -> list[tuple[str, str]]:
    """Key/value pairs from '- Key: value' bullets and '| Key | Value |' rows."""
    out: list[tuple[str, str]] = []
    for line in body:
        cells = _table_cells(line)
        if cells is not None:
            if len(cells) >= 2 and not _is_table_sep(line):
                out.append((_norm_key(cells[0]), cells[1]))
            continue
        m = _BULLET_RE.match(line)
        pair = _field(m.group(2)) if m else None
        if pair:
            out.append(pair)
    return out


def _prev_paragraph(lines: list[str], index: int) -> str:
    """The paragraph just above line ``index`` (skipping blank lines), joined with spaces."""
    i = index - 1
    while i >= 0 and not lines[i].strip():
        i -= 1
    para: list[str] = []
    while i >= 0 and lines[i].strip() and _table_cells(lines[i]) is None:
        para.insert(0, lines[i].strip())
        if _BULLET_RE.match(lines[i]) or _is_heading(lines[i]):
            break
        i -= 1
    return " ".join(para)


# ------------------------------------------------------------------------------------ title/section


def _title(text: str) -> tuple[str | None, str | None]:
    m = re.search(r"(?m)^#[ \t]*SaaSBench Test Prompt[ \t]*[—–-]+[ \t]*(task_\w+)(?:[ \t]*\((.*)\))?[ \t]*$", text)
    if m:
        return m.group(1), (m.group(2) or "").strip() or None
    m = re.search(r"(?m)^#\s.*?\b(task_[A-Za-z0-9]+)\b", text)
    return (m.group(1) if m else None), None


def _prompt_section(text: str) -> str | None:
    """Text between '## Prompt' and '## Tester Workflow' (or the next '## ' heading)."""
    m = re.search(r"(?m)^##\s+Prompt\s*$", text)
    if not m:
        return None
    rest = text[m.end() :]
    end = re.search(r"(?m)^##\s+Tester Workflow\b", rest) or re.search(r"(?m)^##\s", rest)
    lines = (rest[: end.start()] if end else rest).split("\n")
    while lines and (not lines[-1].strip() or _RULE_RE.match(lines[-1])):
        lines.pop()  # blank lines and the '---' separator before the next heading
    return "\n".join(lines).strip()


# -------------------------------------------------------------------------------- environment facts


def _container(prompt: str) -> str | None:
    m = re.search(r"(?i)\binside\s+(?:the\s+)?container\s+`([^`]+)`", prompt)
    return m.group(1).strip() if m else None


def _workdir(prompt: str) -> str | None:
    m = re.search(r"`([^`]+)`\s+as\s+the\s+working\s+directory", prompt)
    if not m:
        m = re.search(r"(?i)working\s+directory(?:\s+is)?[:\s]+`(/[^`]*)`", prompt)
    return m.group(1).strip() if m else None


def _base_os(prompt: str) -> str | None:
    """'**Tools pre-installed in the container** (Ubuntu 22.04):' or '... container is based on Alpine Linux'."""
    at = prompt.find("Tools pre-installed")  # only the first such line, so a hostile prompt stays linear
    end = prompt.find("\n", at)
    line = prompt[at : end if end >= 0 else None] if at >= 0 else ""
    m = re.match(r"Tools pre-installed[^\n(]{0,80}\(([^)\n]{1,200})\)", line)
    if m and m.group(1).strip():
        return m.group(1).strip()
    m = re.search(r"(?i)\bcontainer is based on\s+([A-Z][\w .-]{0,60}?)(?=\s+and\b|[.,;]|$)", prompt)
    return m.group(1).strip() if m else None


def _tools(lines: list[str]) -> list[str]:
    start = next((i for i, line in enumerate(lines) if "Tools pre-installed" in line), None)
    if start is None:
        return []
    items: list[str] = []
    for line in lines[start + 1 :]:
        bullet = _BULLET_RE.match(line)
        if bullet and not bullet.group(1):
            items.append(bullet.group(2))
        elif items and line.strip() and line[:1].isspace():
            items[-1] += " " + line.strip()
        elif items or (line.strip() and not line[:1].isspace()):
            break  # a blank line or prose after the list ends it
    return [_strip_md(item) for item in items]


# ------------------------------------------------------------------------------------------ database


def _engine_version(text: str) -> tuple[str | None, str | None]:
    m = _ENGINE_RE.search(text)
    if not m:
        return None, None
    raw = m.group(1).lower()
    engine = {"postgres": "postgresql", "mongo": "mongodb", "sqlite3": "sqlite"}.get(raw, raw)
    return engine, m.group(2)


def _engine_from_scheme(scheme: str) -> str | None:
    scheme = scheme.lower().removeprefix("jdbc:")
    for prefix, engine in (
        ("postgres", "postgresql"),
        ("mysql", "mysql"),
        ("mariadb", "mariadb"),
        ("mongodb", "mongodb"),
        ("sqlite", "sqlite"),
    ):
        if scheme.startswith(prefix):
            return engine
    return None


def _host_and_port(value: str) -> tuple[str | None, int | None]:
    """'`postgres`, port `5432`' -> ('postgres', 5432); '`db` (alias `mysql` also works)' -> ('db', None)."""
    host = _first_code(value) or next(iter(value.split()), None)
    port = re.search(r"(?i)\bport\s*`?(\d{2,5})", value)
    return (host.strip(",;") if host else None), (_to_int(port.group(1)) if port else None)


def _db_from_block(block: _Block, engine: str | None, version: str | None) -> DatabaseFacts:
    db = DatabaseFacts(engine=engine, version=version)
    urls: list[str] = []
    for key, value in _block_fields(block.body):
        if key == "host" and db.host is None:
            db.host, db.port = _host_and_port(value)
        elif key == "port" and db.port is None:
            numbers = re.findall(r"\d{2,5}", value)
            db.port = _to_int(numbers[0]) if numbers else None
            if len(numbers) > 1 and re.search(r"(?i)\bhost\b", value):
                db.host_port = _to_int(numbers[1])
        elif key in ("database", "database_name", "db", "db_name", "name") and db.name is None:
            db.name = _value(value)
        elif key in ("username", "user") and db.user is None:
            db.user = _value(value)
        elif key == "password" and db.password is None:
            db.password = _value(value)
        elif key.startswith("extension"):
            db.extensions += [_strip_md(x) for x in value.split(",") if _strip_md(x)]
        elif ("url" in key or "uri" in key) and "://" in value:
            urls.append(_first_code(value) or value)
    body = "\n".join(block.body)
    owner = re.search(r"`([\w.-]+)`\s*\(owner:\s*`([^`]+)`\s*/\s*`([^`]+)`", body)
    if owner:
        db.name = db.name or owner.group(1)
        db.user = db.user or owner.group(2)
        db.password = db.password or owner.group(3)
    for ext in re.findall(r"`([\w-]+)`\s+extension\b", body):
        if ext not in db.extensions:
            db.extensions.append(ext)
    if re.search(r"(?i)\+\s*pgvector", block.heading) and "vector" not in db.extensions:
        db.extensions.append("vector")
    for url in urls:
        _fill_from_url(db, url)
    return db


def _fill_from_url(db: DatabaseFacts, url: str) -> None:
    m = _URL_RE.search(url)
    if not m:
        return
    db.engine = db.engine or _engine_from_scheme(m.group("scheme"))
    db.host = db.host or m.group("host")
    db.port = db.port or _to_int(m.group("port"))
    db.name = db.name or m.group("name")
    db.user = db.user or m.group("user")
    db.password = db.password or m.group("pw")


def _database(blocks: list[_Block]) -> tuple[DatabaseFacts | None, int | None]:
    """The first bold block naming a database engine (or 'Database') that has coordinates."""
    for index, block in enumerate(blocks):
        heading = _strip_md(block.heading)
        engine, version = _engine_version(heading)
        if engine is None and not re.search(r"(?i)\bdatabase\b", heading):
            continue
        db = _db_from_block(block, engine, version)
        if db.host or db.port or db.name:
            return db, index
    return None, None


def _services(blocks: list[_Block], skip: int | None) -> list[ServiceFacts]:
    services: list[ServiceFacts] = []
    for index, block in enumerate(blocks):
        heading = _strip_md(block.heading)
        if index == skip or not re.search(r"(?i)already running", heading):
            continue
        name = re.split(r"\s*\(", heading, maxsplit=1)[0].strip().rstrip(":").strip()
        host: str | None = None
        port: int | None = None
        fields = _block_fields(block.body)
        for key, value in fields:
            if key == "host" and host is None:
                host, port = _host_and_port(value)
            elif key == "port" and port is None:
                port = _to_int((re.findall(r"\d{2,5}", value) or [None])[0])
        for key, value in fields:
            url = _URL_RE.search(value) if ("url" in key or "uri" in key) else None
            if url and host is None:
                host, port = url.group("host"), port or _to_int(url.group("port"))
        for key, value in fields:
            if port is None and "port" in key:
                port = _to_int((re.findall(r"\d{2,5}", value) or [None])[0])
        services.append(ServiceFacts(name=name or heading, host=host, port=port))
    return services


# --------------------------------------------------------------------------------------------- ports


def _first_sentence(text: str) -> str:
    """Up to the first '.' that ends a sentence outside backticks and parentheses."""
    depth, in_code = 0, False
    for i, ch in enumerate(text):
        if ch == "`":
            in_code = not in_code
        elif in_code:
            continue
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth = max(0, depth - 1)
        elif ch == "." and depth == 0 and (i + 1 == len(text) or text[i + 1] in " *\n"):
            return text[: i + 1]
    return text


def _classified_ports(sentence: str) -> dict[str, list[int]]:
    """Port numbers in a 'listen' sentence, labelled by the nearest 'host'/'container' before them."""
    found: dict[str, list[int]] = {"container": [], "host": [], "any": []}
    previous_end = 0
    for m in re.finditer(r"`(?:localhost:|0\.0\.0\.0:)?(\d{2,5})`|\bport\s+(\d{2,5})\b", sentence):
        window = sentence[previous_end : m.start()]
        words = re.findall(r"(?i)\b(host|container)(?:'s)?\b", window)
        label = words[-1].lower() if words else "any"
        found[label].append(int(m.group(1) or m.group(2)))
        previous_end = m.end()
    return found


def _mapping_phrase(prompt: str) -> tuple[int, int] | None:
    """'container port 80 is mapped to host port 8017' / "container's port `80` is mapped to host `8026`"."""
    m = re.search(
        r"(?i)\bcontainer(?:'s)?\s{1,3}port\s{0,3}`?(\d{2,5})`?[*\s)]{0,12}(?:is\s{1,3})?\(?\s{0,3}mapped\s+to\s+host"
        r"(?:\s+port)?\s*`?(?:localhost:)?(\d{2,5})",
        prompt,
    )
    return (int(m.group(1)), int(m.group(2))) if m else None


def _ports(prompt: str, warnings: list[str]) -> tuple[int | None, int | None]:
    listen = re.search(r"(?i)\b(?:must|should)\s+(?:listen|be\s+reachable)\b", prompt)
    sentence = ""
    if listen:
        line_start = prompt.rfind("\n", 0, listen.start()) + 1
        sentence = _first_sentence(prompt[line_start:])
    ports = _classified_ports(sentence)
    mapping = _mapping_phrase(prompt)
    mentioned = set(ports["container"] + ports["host"] + ports["any"])
    app: int | None
    host: int | None
    if ports["container"] and ports["host"]:
        app, host = ports["container"][0], ports["host"][0]
    elif mapping and (not mentioned or mapping[1] in mentioned):
        app, host = mapping
    elif ports["container"] or ports["any"]:
        app = (ports["container"] or ports["any"])[0]
        host = ports["host"][0] if ports["host"] else None
    elif ports["host"]:
        app, host = ports["host"][0], None
        warnings.append("only a host port is stated; app_port assumes the same number inside the container")
    else:
        bind = re.search(r"0\.0\.0\.0:(\d{2,5})", prompt)
        app, host = (int(bind.group(1)) if bind else None), None
    if host == app:
        host = None
    if host is None and app is not None and ports["container"]:
        host = _host_port_from_urls(prompt, app)
    if app is None:
        warnings.append("no application port found")
    return app, host


def _host_port_from_urls(prompt: str, app_port: int) -> int | None:
    """When only a container port is stated, the port of the 'http://localhost:N' URLs the harness hits."""
    others = [int(p) for p in re.findall(r"\b(?:localhost|127\.0\.0\.1):(\d{2,5})\b", prompt) if int(p) != app_port]
    return Counter(others).most_common(1)[0][0] if others else None


# --------------------------------------------------------------------------------------------- users

_KV_RE = re.compile(
    r"`(?P<k1>\w+)=(?P<v1>[^`]*)`"
    r"|\b(?P<k2>\w+)=`(?P<v2>[^`]*)`"
    r"|\b(?P<k3>\w+)=(?P<v3>\[[^\]\n]{0,200}\]|[^\s,;)`]+)"
)
_USER_FIELDS = ("username", "email", "password", "name")


def _kv_pairs(text: str) -> list[tuple[str, str]]:
    out = []
    for m in _KV_RE.finditer(text):
        key = m.group("k1") or m.group("k2") or m.group("k3")
        value = m.group("v1") if m.group("k1") else m.group("v2") if m.group("k2") else m.group("v3")
        if value.strip():  # 'email=``' states nothing
            out.append((key.lower(), value.strip()))
    return out


def _role_from_label(label: str) -> tuple[str, str | None]:
    """'Customer (storefront side)' -> ('customer', 'storefront side'); 'Admin user' -> ('admin', None)."""
    note = _PAREN_RE.search(label)
    role = _strip_md(_PAREN_RE.sub("", label)).lower()
    words = role.split()
    if len(words) == 2 and words[1] == "user":
        role = words[0]
    return role, (note.group(1).strip() if note else None)


def _add_note(user: EvalUser, note: str | None) -> None:
    if note:
        user.extra["note"] = f"{user.extra['note']}; {note}" if "note" in user.extra else note


def _user_from_pairs(pairs: list[tuple[str, str]]) -> EvalUser:
    user = EvalUser()
    for key, value in pairs:
        if key in _USER_FIELDS and getattr(user, key) is None:
            setattr(user, key, value)
        else:
            user.extra.setdefault(key, value)
    if user.name is None and "first_name" in user.extra and "last_name" in user.extra:
        user.name = f"{user.extra['first_name']} {user.extra['last_name']}"
    return user


def _users_from_kv_bullets(lines: list[str], skip: set[int]) -> list[tuple[int, EvalUser]]:
    """'- Admin: username=`x`, email=`y`, password=`z` (admin=true)' and '- **Admin**: `username=x`, ...'."""
    found = []
    for i, line in enumerate(lines):
        bullet = _BULLET_RE.match(line)
        if i in skip or not bullet:
            continue
        text = bullet.group(2)
        pairs = _kv_pairs(text)
        keys = {k for k, _ in pairs}
        if not keys & {"email", "username"}:
            continue
        user = _user_from_pairs(pairs)
        label = re.match(r"^\s*(?:\*\*)?([^:=`*]{1,80}?)(?:\*\*)?\s*:", text)
        if label:
            user.role, note = _role_from_label(label.group(1))
            _add_note(user, note)
        tail = re.search(r"\(([^()=]*)\)[\s.]*$", text)
        if tail:
            _add_note(user, _strip_md(tail.group(1)))
        found.append((i, user))
    return found


def _users_from_pair_bullets(lines: list[str], skip: set[int]) -> list[tuple[int, EvalUser]]:
    """'- admin: `bench@example.com` / `Secret1!`'."""
    found = []
    pattern = re.compile(r"^(?:\*\*)?([^:`*]{1,80}?)(?:\*\*)?\s*:\s*`([^`\s@]+@[^`\s]+)`\s*/\s*`([^`]+)`")
    for i, line in enumerate(lines):
        bullet = _BULLET_RE.match(line)
        m = pattern.match(bullet.group(2)) if bullet and i not in skip else None
        if m:
            role, note = _role_from_label(m.group(1))
            user = EvalUser(role=role, email=m.group(2), password=m.group(3))
            _add_note(user, note)
            found.append((i, user))
    return found


def _table_user(headers: list[str], cells: list[str]) -> EvalUser | None:
    user = EvalUser()
    for header, cell in zip(headers, cells):
        if header == "email":
            if re.search(r"[<{]", cell):
                return None  # a placeholder row such as `<role>_user@pfm.local`
            email = _EMAIL_RE.search(cell)
            if email and user.email is None:
                user.email = email.group(0)
                _add_note(user, _strip_md(cell.replace(email.group(0), "")).strip(" ()") or None)
            continue
        value = _value(cell)
        if not value:
            continue
        if header == "role" and user.role is None:
            user.role = value.lower()
        elif header in _USER_FIELDS and getattr(user, header) is None:
            if header == "username" and re.search(r"[<{]", value):
                return None
            setattr(user, header, value)
        else:
            key = header or "column"
            while key in user.extra:
                key += "_2"
            user.extra[key] = value
    return user if (user.email or user.username) else None


def _users_from_tables(lines: list[str], skip: set[int]) -> list[tuple[int, EvalUser]]:
    """'| Role | Email | Password |' tables; a password stated above the table fills empty cells."""
    found = []
    i = 0
    while i < len(lines) - 1:
        headers = _table_cells(lines[i])
        if i in skip or headers is None or not _is_table_sep(lines[i + 1]):
            i += 1
            continue
        keys = ["password" if _norm_key(h).startswith("password") else _norm_key(h) for h in headers]
        is_user_table = bool({"email", "username"} & set(keys))
        default = re.search(r"(?i)\bpassword\s+`([^`]+)`", _prev_paragraph(lines, i))
        j = i + 2
        while j < len(lines) and (cells := _table_cells(lines[j])) is not None:
            user = _table_user(keys, cells) if is_user_table else None
            if user is not None:
                if user.password is None and default:
                    user.password = default.group(1)
                found.append((j, user))
            j += 1
        i = j
    return found


def _users_from_field_groups(lines: list[str], skip: set[int]) -> list[tuple[int, EvalUser]]:
    """A run of '- Username: `admin`' / '- Password: `admin`' bullets under a line about a user/admin."""
    found = []
    i = 0
    while i < len(lines):
        group: list[tuple[str, str]] = []
        j = i
        while j < len(lines) and j not in skip and (b := _BULLET_RE.match(lines[j])):
            pair = _field(b.group(2))
            if pair is None or not pair[1]:  # '4. Create the admin user:' introduces a group, it is not a field
                break
            group.append(pair)
            j += 1
        keys = {k for k, _ in group}
        intro = _prev_paragraph(lines, i) if group else ""
        if keys & {"username", "email"} and "password" in keys and re.search(r"(?i)\b(users?|admin)\b", intro):
            user = _user_from_pairs([(k, _value(v)) for k, v in group])
            admin = re.search(r"(?i)\b(admin|administrator|superuser)\b", intro)
            user.role = admin.group(1).lower() if admin else None
            found.append((i, user))
        i = max(j, i + 1)
    return found


def _merge_users(users: list[EvalUser]) -> list[EvalUser]:
    """Keep the first mention of each account (same email, else same username with no conflicting
    email); later mentions only fill in what is missing."""
    merged: list[EvalUser] = []
    by_email: dict[str, EvalUser] = {}
    by_username: dict[str, EvalUser] = {}
    for user in users:
        twin = by_email.get(user.email.lower()) if user.email else None
        if twin is None and user.username:
            twin = by_username.get(user.username.lower())
            if twin is not None and twin.email and user.email:
                twin = None  # same login name, different accounts
        if twin is None:
            twin = user.model_copy(deep=True)
            merged.append(twin)
        else:
            for name in ("role", *_USER_FIELDS):
                if getattr(twin, name) is None and getattr(user, name) is not None:
                    setattr(twin, name, getattr(user, name))
            for key, value in user.extra.items():
                twin.extra.setdefault(key, value)
        if twin.email:
            by_email.setdefault(twin.email.lower(), twin)
        if twin.username:
            by_username.setdefault(twin.username.lower(), twin)
    return merged


def _users(lines: list[str], skip: set[int]) -> list[EvalUser]:
    found = (
        _users_from_kv_bullets(lines, skip)
        + _users_from_pair_bullets(lines, skip)
        + _users_from_tables(lines, skip)
        + _users_from_field_groups(lines, skip)
    )
    found.sort(key=lambda pair: pair[0])
    return _merge_users([user for _, user in found])


# ------------------------------------------------------------------------------ env vars, requirements

_ENV_PHRASE = re.compile(r"(?i)\b(?:environment\s+variables|env\s+vars)\b")
# "- **Environment variables** are pre-configured in `.env`: DATABASE_URL, REDIS_URL, PORT=8021, etc."
_ENV_INLINE = re.compile(
    r"^\s*(?:[-*+]\s+)?(?:\*\*)?(?:environment\s+variables|env\s+vars)\b(?:\*\*)?[^:(\n]*:\s*(.+)$", re.I
)
# "the `docker-compose.yml` provides `APP_KEY` and `STATIC_CRON_TOKEN` env vars"
_ENV_PROVIDES = re.compile(
    r"(?i)\b(?:provides?|exports?|sets?)\s+((?:`[A-Z][A-Z0-9_]*`[\s,/and]*)+)env(?:ironment)?\s+var"
)
_REQUIREMENTS_HEADING = re.compile(r"(?i)^#{2,6}\s+Key technical requirements")


def _env_names(text: str, backticked_only: bool) -> list[str]:
    chunks = _CODE_RE.findall(text) if backticked_only else [text]
    names: list[str] = []
    for chunk in chunks:
        for part in re.split(r"\s*/\s*", chunk) if backticked_only else [chunk]:
            head = part.split("=", 1)[0].strip()
            if backticked_only and not re.fullmatch(r"[A-Z][A-Z0-9_]*\*?", head):
                continue
            names += [n for n in _ENV_NAME_RE.findall(head) if len(n) > 1 and "<" not in n]
    return names


def _env_vars(lines: list[str]) -> list[str]:
    names: list[str] = []
    for i, line in enumerate(lines):
        if _is_heading(line) and _ENV_PHRASE.search(line):
            for body_line in _section_body(lines, i):
                cells = _table_cells(body_line)
                if cells is not None and not _is_table_sep(body_line):
                    names += _env_names(cells[0], backticked_only=True)
                elif _BULLET_RE.match(body_line):
                    names += _env_names(body_line, backticked_only=True)
        inline = _ENV_INLINE.match(line)
        if inline and not _is_heading(line):
            names += _env_names(re.sub(r"=\S*", "", _strip_md(inline.group(1))), backticked_only=False)
        provides = _ENV_PROVIDES.search(line)
        if provides:
            names += _env_names(provides.group(1), backticked_only=True)
    return list(dict.fromkeys(names))


def _requirements(lines: list[str]) -> list[str]:
    start = next((i for i, line in enumerate(lines) if _REQUIREMENTS_HEADING.match(line)), None)
    if start is None:
        return []
    items: list[list[str]] = []
    open_item = False
    for line in lines[start + 1 :]:
        if _HEADING_RE.match(line) or _RULE_RE.match(line):
            break
        top = re.match(r"^[-*+]\s+(.*)$", line)
        if top:
            items.append([top.group(1)])
            open_item = True
        elif open_item and (not line.strip() or line[:1].isspace()):
            items[-1].append(line.rstrip())
        else:
            open_item = False
    return ["\n".join(item).strip() for item in items]


# ------------------------------------------------------------------------------------------- public

_T = TypeVar("_T")


def _safe(warnings: list[str], what: str, fn: Callable[[], _T], default: Any) -> _T:
    """Run one extractor; an unexpected error becomes a warning, never an exception."""
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - the parser must not raise on odd input
        warnings.append(f"could not extract {what}: {type(exc).__name__}: {exc}")
        return cast(_T, default)


def _as_text(text: object, warnings: list[str]) -> str:
    if isinstance(text, str):
        return text
    if isinstance(text, bytes):
        warnings.append("prompt given as bytes; decoded as UTF-8")
        return text.decode("utf-8", errors="replace")
    if text is None:
        warnings.append("prompt is NoneType, not text; treated as empty")
        return ""
    warnings.append(f"prompt is {type(text).__name__}, not text; converted with str()")
    return str(text)


def parse_prompt_for_model(text: str, source: str = "<memory>") -> PromptFacts:
    """Extract the declared facts of one ``prompt_for_model.md``; never raises on odd input."""
    warnings: list[str] = []
    text = _as_text(text, warnings).replace("\r\n", "\n").replace("\r", "\n")
    if not text.strip():
        warnings.append("prompt is empty")

    task, product = _safe(warnings, "title", lambda: _title(text), (None, None))
    section = _safe(warnings, "prompt section", lambda: _prompt_section(text), None)
    if section is None:
        warnings.append("no '## Prompt' section; facts read from the whole text")
        section = text.strip()
    lines = section.split("\n")
    blocks: list[_Block] = _safe(warnings, "blocks", lambda: _bold_blocks(lines), [])

    database, db_index = _safe(warnings, "database", lambda: _database(blocks), (None, None))
    skip: set[int] = set()
    for index, block in enumerate(blocks):
        if index == db_index or re.search(r"(?i)already running", block.heading):
            skip.update(range(block.start, block.start + len(block.body) + 1))
    app_port, host_port = _safe(warnings, "ports", lambda: _ports(section, warnings), (None, None))

    facts = PromptFacts(
        source=source,
        task=task,
        product=product,
        container=_safe(warnings, "container", lambda: _container(section), None),
        workdir=_safe(warnings, "workdir", lambda: _workdir(section), None),
        base_os=_safe(warnings, "base OS", lambda: _base_os(section), None),
        tools=_safe(warnings, "tools", lambda: _tools(lines), []),
        database=database,
        services=_safe(warnings, "services", lambda: _services(blocks, db_index), []),
        app_port=app_port,
        host_port=host_port,
        users=_safe(warnings, "users", lambda: _users(lines, skip), []),
        env_vars=_safe(warnings, "environment variables", lambda: _env_vars(lines), []),
        requirements=_safe(warnings, "requirements", lambda: _requirements(lines), []),
        prompt_text=section,
    )
    facts.warnings = warnings + _missing(facts)
    return facts


def _missing(facts: PromptFacts) -> list[str]:
    """One warning per fact that could not be found."""
    checks = [
        (facts.task, "no task id found (expected '# SaaSBench Test Prompt — task_<id> (<Product>)')"),
        (facts.product, "no product name found in the title"),
        (facts.container, "no container name found"),
        (facts.workdir, "no working directory found"),
        (facts.base_os, "no base OS found"),
        (facts.tools, "no pre-installed tools listed"),
        (facts.database, "no database found"),
        (facts.users, "no evaluation users found"),
        (facts.env_vars, "no environment variables documented"),
        (facts.requirements, "no 'Key technical requirements' bullets found"),
    ]
    out = [message for value, message in checks if not value]
    if facts.database is not None:
        for name in ("engine", "port", "name", "user", "password"):
            if getattr(facts.database, name) is None:
                out.append(f"database: no {name} found")
    return out
