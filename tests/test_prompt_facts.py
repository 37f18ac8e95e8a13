"""saasbench.catalog.prompt_facts on the 15 real public prompt_for_model.md files and on odd inputs.

The expected values below were read off each prompt by hand (ports that the prompt states in two
conflicting ways were settled against the task's docker-compose.yml: gavmyneb maps 8017:80 and
lgzivily maps 8030:80).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from shared_data import PUBLIC_TASKS_DIR

from saasbench.catalog.prompt_facts import DatabaseFacts, EvalUser, PromptFacts, parse_prompt_for_model

NO_ENV = "no environment variables documented"

# product, container, workdir, base_os,
# database (engine, version, host, port, host_port, name, user, password, extensions) or None,
# services [(name, host, port)], app_port, host_port,
# number of users, first user (role, username, email, password),
# env_vars, number of "Key technical requirements" bullets, warnings
EXPECTED: dict[str, dict] = {
    "task_aoiwqoiq": dict(
        product="Community Forum Platform",
        container="task_aoiwqoiq-app",
        workdir="/app",
        base_os="Ubuntu 22.04",
        db=(
            "postgresql",
            "16",
            "db",
            5432,
            None,
            "app_aoiwqoiq",
            "appaoiwqoiq",
            "app123aoiwqoiq",
            ["pg_trgm", "hstore", "unaccent", "uuid-ossp", "vector"],
        ),
        services=[("Redis", "redis", 6379)],
        app_port=8020,
        host_port=None,
        n_users=3,
        first_user=("admin", "eval_admin", "eval_admin@eval.test", "EvalPass12345!"),
        env_vars=[],
        n_requirements=7,
        warnings=[NO_ENV],
    ),
    "task_cqfnbfay": dict(
        product="Document Signing & Form Filling Platform",
        container="cqfnbfay-app-1",
        workdir="/app",
        base_os="Alpine Linux",
        db=(
            "postgresql",
            "16",
            "db",
            5432,
            None,
            "app_cqfnbfay",
            "appcqfnbfay",
            "app123cqfnbfay",
            ["plpgsql", "btree_gin"],
        ),
        services=[("Redis", "redis", 6379)],
        app_port=8021,
        host_port=None,
        n_users=1,
        first_user=(None, None, "eval@test.com", "EvalPass123!"),
        env_vars=["DATABASE_URL", "REDIS_URL", "SECRET_KEY_BASE", "PORT"],
        n_requirements=12,
        warnings=[],
    ),
    "task_cvyocaao": dict(
        product="Identity and Access Management Platform",
        container="app_cvyocaao",
        workdir="/app",
        base_os="Ubuntu 22.04",
        db=("postgresql", "16", "db", 5432, None, "app_cvyocaao", "appcvyocaao", "app123cvyocaao", []),
        services=[],
        app_port=8027,
        host_port=None,
        n_users=1,
        first_user=("admin", "admin", None, "admin"),
        env_vars=[],
        n_requirements=13,
        warnings=[NO_ENV],
    ),
    "task_dfhjkeb": dict(
        product="Full-Featured E-Commerce Platform",
        container="ecommerce-app",
        workdir="/app",
        base_os="Ubuntu 22.04",
        db=("postgresql", "16", "db", 5432, None, "app_db", "app", "app123", ["uuid-ossp", "pgcrypto"]),
        services=[("Redis", "redis", 6379)],
        app_port=8003,
        host_port=None,
        n_users=7,
        first_user=("admin", None, "eval_admin@test.com", "EvalAdmin123!"),
        env_vars=["DATABASE_URL", "REDIS_URL", "JWT_SECRET", "COOKIE_SECRET", "NODE_ENV", "PORT", "WORKER_MODE"],
        n_requirements=12,
        warnings=[],
    ),
    "task_gavmyneb": dict(
        product="Learning Management System",
        container="lms-web",
        workdir="/usr/src/app",
        base_os=None,
        db=(
            "postgresql",
            "16",
            "db",
            5432,
            None,
            "app_gavmyneb",
            "appgavmyneb",
            "app123gavmyneb",
            ["pg_trgm", "btree_gist", "uuid-ossp", "pgcrypto"],
        ),
        services=[("Redis 7", "redis", 6379)],
        app_port=80,
        host_port=8017,
        n_users=6,
        first_user=("admin", None, "eval_admin@test.com", "Admin123!@#"),
        env_vars=[
            "DATABASE_URL",
            "POSTGRES_HOST",
            "POSTGRES_PORT",
            "POSTGRES_USER_TASK",
            "POSTGRES_PASSWORD_TASK",
            "POSTGRES_DB",
            "REDIS_URL",
            "SECRET_KEY_BASE",
            "ENCRYPTION_KEY",
            "APP_ENV",
            "RAILS_ENV",
            "APP_PORT",
        ],
        n_requirements=11,
        warnings=["no base OS found"],
    ),
    "task_hhrdixum": dict(
        product="Inventory Management & Light-MRP",
        container="task_hhrdixum-app",
        workdir="/app",
        base_os="Ubuntu 22.04",
        db=("postgresql", "16", "db", 5432, 5439, "app_hhrdixum", "apphhrdixum", "app123hhrdixum", []),
        services=[("Redis 7", "cache", 6379)],
        app_port=8000,
        host_port=8014,
        n_users=2,
        first_user=("admin", "admin", "admin@test.com", "Admin123!@#"),
        env_vars=[
            "APP_DB_*",
            "APP_CACHE_HOST",
            "APP_CACHE_PORT",
            "REDIS_URL",
            "APP_BASE_URL",
            "DJANGO_SETTINGS_MODULE",
        ],
        n_requirements=13,
        warnings=[],
    ),
    "task_ididetxj": dict(
        product="Collaborative Knowledge Base & Wiki Platform",
        container="task_ididetxj-app",
        workdir="/app",
        base_os="Ubuntu 22.04",
        db=(
            "postgresql",
            "16",
            "db",
            5432,
            None,
            "app_ididetxj",
            "appididetxj",
            "app123ididetxj",
            ["uuid-ossp", "pg_trgm", "citext"],
        ),
        services=[("Redis", "redis", 6379)],
        app_port=8031,
        host_port=None,
        n_users=5,
        first_user=("admin", None, "eval_admin@example.com", None),
        env_vars=[],
        n_requirements=11,
        warnings=[NO_ENV],
    ),
    "task_iyjruvfz": dict(
        product="Scheduling / Booking Platform",
        container="task_iyjruvfz-app",
        workdir="/app",
        base_os="Ubuntu 22.04",
        db=("postgresql", "15", "postgres", 5432, None, "app_iyjruvfz", "appiyjruvfz", "app123iyjruvfz", []),
        services=[("Redis", "redis", 6379), ("Mock webhook receiver", "host.docker.internal", 9012)],
        app_port=3000,
        host_port=8016,
        n_users=3,
        first_user=("admin", "admin", "admin@example.com", "ChangeMe!2026"),
        env_vars=[],
        n_requirements=10,
        warnings=[NO_ENV],
    ),
    "task_jzssnoqp": dict(
        product="Omnichannel Customer Communication Platform",
        container="jzssnoqp-app",
        workdir="/app",
        base_os="Ubuntu 22.04",
        db=(
            "postgresql",
            "16",
            "db",
            5432,
            None,
            "app_jzssnoqp",
            "appjzssnoqp",
            "app123jzssnoqp",
            ["plpgsql", "pgcrypto", "pg_trgm", "pg_stat_statements", "vector"],
        ),
        services=[("Redis", "redis", 6379)],
        app_port=8018,
        host_port=None,
        n_users=5,
        first_user=("admin", None, "admin@eval.test", "Password1!"),
        env_vars=[
            "DATABASE_URL",
            "REDIS_URL",
            "SECRET_KEY_BASE",
            "PORT",
            "RAILS_ENV",
            "ACTIVE_RECORD_ENCRYPTION_PRIMARY_KEY",
            "ACTIVE_RECORD_ENCRYPTION_DETERMINISTIC_KEY",
            "ACTIVE_RECORD_ENCRYPTION_KEY_DERIVATION_SALT",
        ],
        n_requirements=10,
        warnings=[],
    ),
    "task_kmasmnil": dict(
        product="Experience Management Platform",
        container="xm_app",
        workdir="/app",
        base_os="Ubuntu 22.04",
        db=("postgresql", "16", "db", 5432, None, "app_kmasmnil", "appkmasmnil", "app123kmasmnil", ["vector"]),
        services=[("Redis", "redis", 6379)],
        app_port=8024,
        host_port=None,
        n_users=2,
        first_user=("admin", None, "eval_admin@test.com", "EvalAdmin123!@#"),
        env_vars=[
            "DATABASE_URL",
            "REDIS_URL",
            "NEXTAUTH_URL",
            "NEXTAUTH_SECRET",
            "ENCRYPTION_KEY",
            "CRON_SECRET",
            "EMAIL_VERIFICATION_DISABLED",
            "RATE_LIMITING_DISABLED",
            "PORT",
            "NODE_ENV",
        ],
        n_requirements=14,
        warnings=[],
    ),
    "task_lgzivily": dict(
        product="Clinical Practice Management Suite",
        container="task_lgzivily_app",
        workdir="/var/www/html",
        base_os="Ubuntu 22.04",
        db=("mariadb", "11.x", "db", 3306, 3310, "app_lgzivily", "applgzivily", "app123lgzivily", []),
        services=[],
        app_port=80,
        host_port=8030,
        n_users=7,
        first_user=("administrators", "admin", None, "pass"),
        env_vars=[],
        n_requirements=11,
        warnings=[NO_ENV],
    ),
    "task_mjobbzsi": dict(
        product="Real-Time Video Conferencing Platform",
        container="mjobbzsi-app-1",
        workdir="/app",
        base_os="Debian 12 / `node:20-bookworm` based",
        db=None,
        services=[("XMPP server", None, 5222), ("Conference Focus service", None, None), ("Video Bridge", None, 10000)],
        app_port=80,
        host_port=8026,
        n_users=0,
        first_user=None,
        env_vars=[],
        n_requirements=10,
        warnings=["no database found", "no evaluation users found", NO_ENV],
    ),
    "task_orghjavi": dict(
        product="Privacy-friendly Web Analytics",
        container="webanalytics_orghjavi_app",
        workdir="/app",
        base_os="Ubuntu 22.04",
        db=("postgresql", "16", "postgres", 5432, None, "app_orghjavi", "apporghjavi", "app123orghjavi", ["citext"]),
        services=[("ClickHouse 24.12", "clickhouse", 8123)],
        app_port=8000,
        host_port=8015,
        n_users=5,
        first_user=("admin", None, "bench-v2@example.com", "BenchPass2026!@"),
        env_vars=["BASE_URL", "SECRET_KEY_BASE", "TOTP_VAULT_KEY", "DISABLE_REGISTRATION", "MAILER_ADAPTER"],
        n_requirements=12,
        warnings=[],
    ),
    "task_qmjfeopc": dict(
        product="Gamified Habit-Tracking RPG",
        container="app_qmjfeopc",
        workdir="/app",
        base_os="Ubuntu 22.04",
        db=("mongodb", "7", "mongo", 27017, None, "app_qmjfeopc", "appqmjfeopc", "app123qmjfeopc", []),
        services=[("Redis", "redis", 6379)],
        app_port=8002,
        host_port=None,
        n_users=3,
        first_user=("user1", "eval_user1", "eval1@test.com", "EvalPass123!@#"),
        env_vars=[],
        n_requirements=8,
        warnings=[NO_ENV],
    ),
    "task_rjhcjrst": dict(
        product="Personal Finance Manager",
        container="task_rjhcjrst-app",
        workdir="/var/www/html",
        base_os="Ubuntu 22.04",
        db=("mysql", "8.0", "db", 3306, 3309, "app_rjhcjrst", "apprjhcjrst", "app123rjhcjrst", []),
        services=[("mock-receiver", "host.docker.internal", 9001)],
        app_port=80,
        host_port=8022,
        n_users=2,
        first_user=("admin", None, "admin@pfm.local", "secret123"),
        env_vars=["APP_KEY", "STATIC_CRON_TOKEN"],
        n_requirements=11,
        warnings=[],
    ),
}


def _prompt_path(task_id: str) -> Path:
    return PUBLIC_TASKS_DIR / task_id / "check" / task_id / "prompt_for_model.md"


_CACHE: dict[str, PromptFacts] = {}


def _facts(task_id: str) -> PromptFacts:
    if task_id not in _CACHE:
        path = _prompt_path(task_id)
        _CACHE[task_id] = parse_prompt_for_model(path.read_text(encoding="utf-8"), source=str(path))
    return _CACHE[task_id]


def test_the_expectations_cover_every_public_task_folder():
    found = sorted(p.name for p in PUBLIC_TASKS_DIR.glob("task_*") if _prompt_path(p.name).is_file())
    assert found == sorted(EXPECTED)


# ------------------------------------------------------------------------------ the 15 real prompts


@pytest.mark.parametrize("task_id", sorted(EXPECTED))
def test_title_container_and_workdir(task_id):
    facts, want = _facts(task_id), EXPECTED[task_id]
    assert facts.task == task_id
    assert facts.product == want["product"]
    assert facts.container == want["container"]
    assert facts.workdir == want["workdir"]
    assert facts.base_os == want["base_os"]
    assert facts.source.endswith(f"{task_id}/prompt_for_model.md")


@pytest.mark.parametrize("task_id", sorted(EXPECTED))
def test_database(task_id):
    db, want = _facts(task_id).database, EXPECTED[task_id]["db"]
    if want is None:
        assert db is None
        return
    engine, version, host, port, host_port, name, user, password, extensions = want
    assert db == DatabaseFacts(
        engine=engine,
        version=version,
        host=host,
        port=port,
        host_port=host_port,
        name=name,
        user=user,
        password=password,
        extensions=extensions,
    )


@pytest.mark.parametrize("task_id", sorted(EXPECTED))
def test_services(task_id):
    got = [(s.name, s.host, s.port) for s in _facts(task_id).services]
    assert got == EXPECTED[task_id]["services"]


@pytest.mark.parametrize("task_id", sorted(EXPECTED))
def test_ports(task_id):
    facts, want = _facts(task_id), EXPECTED[task_id]
    assert (facts.app_port, facts.host_port) == (want["app_port"], want["host_port"])


@pytest.mark.parametrize("task_id", sorted(EXPECTED))
def test_users(task_id):
    users, want = _facts(task_id).users, EXPECTED[task_id]
    assert len(users) == want["n_users"]
    if want["first_user"] is not None:
        first = users[0]
        assert (first.role, first.username, first.email, first.password) == want["first_user"]
    keys = [(u.email or u.username or "").lower() for u in users]
    assert len(set(keys)) == len(keys), "users are deduplicated"


@pytest.mark.parametrize("task_id", sorted(EXPECTED))
def test_env_vars(task_id):
    assert _facts(task_id).env_vars == EXPECTED[task_id]["env_vars"]


@pytest.mark.parametrize("task_id", sorted(EXPECTED))
def test_requirements_and_prompt_text(task_id):
    facts = _facts(task_id)
    assert len(facts.requirements) == EXPECTED[task_id]["n_requirements"]
    assert facts.requirements[0].startswith("**")  # markdown kept, bullet marker gone
    assert not [r for r in facts.requirements if r.startswith(("- ", "* ")) or not r.strip()]
    text = facts.prompt_text
    assert text.startswith("> **<!-- _BENCH_ANTI_CHEAT_BANNER -->Mandatory anti-cheat policy.**")
    assert "You are a senior" in text
    assert "## Tester Workflow" not in text and "How to use" not in text
    assert not text.endswith("---")


@pytest.mark.parametrize("task_id", sorted(EXPECTED))
def test_warnings_name_exactly_the_missing_facts(task_id):
    assert _facts(task_id).warnings == EXPECTED[task_id]["warnings"]


@pytest.mark.parametrize("task_id", sorted(EXPECTED))
def test_crlf_line_endings_give_the_same_facts(task_id):
    text = _prompt_path(task_id).read_text(encoding="utf-8")
    crlf = parse_prompt_for_model(text.replace("\n", "\r\n"), source=str(_prompt_path(task_id)))
    assert crlf == _facts(task_id)


# ------------------------------------------------------------------- details of particular prompts


def test_key_value_user_lines_keep_their_extra_facts():
    admin, moderator, user = _facts("task_aoiwqoiq").users
    assert admin.extra == {"admin": "true", "trust_level": "4"}
    assert (moderator.role, moderator.email) == ("moderator", "eval_mod@eval.test")
    assert moderator.extra == {"moderator": "true", "trust_level": "4"}
    assert (user.role, user.extra) == ("user", {"trust_level": "1"})
    admin, reader = _facts("task_hhrdixum").users
    assert admin.extra == {"is_superuser": "True", "is_staff": "True"}
    assert (reader.username, reader.password, reader.extra["groups"]) == ("reader", "Reader123!", "['Read Only']")


def test_label_notes_and_first_last_names():
    customer = _facts("task_dfhjkeb").users[-1]
    assert (customer.role, customer.email, customer.extra) == (
        "customer",
        "eval_customer@test.com",
        {"note": "storefront side"},
    )
    assert [u.role for u in _facts("task_dfhjkeb").users][:3] == ["admin", "super admin", "limited admin"]
    only = _facts("task_cqfnbfay").users[0]
    assert (only.name, only.extra) == ("Eval Admin", {"first_name": "Eval", "last_name": "Admin"})
    superuser = _facts("task_qmjfeopc").users[2]
    assert (superuser.role, superuser.username, superuser.extra) == (
        "admin",
        "eval_superuser1",
        {"note": "admin permissions, contributor level"},
    )


def test_fixture_bullets_without_email_or_username_are_not_users():
    # kmasmnil also lists an Organization, a Project, two environments and an API key as "- **X**: id=..." lines
    users = _facts("task_kmasmnil").users
    assert [(u.role, u.name, u.email) for u in users] == [
        ("admin", "Eval Admin", "eval_admin@test.com"),
        ("member", "Eval Member", "eval_member@test.com"),
    ]
    assert users[0].extra == {"role": "owner"}


def test_two_tables_about_the_same_users_are_merged():
    users = _facts("task_ididetxj").users
    assert [u.role for u in users] == ["admin", "member", "viewer", "guest", "other_team_admin"]
    assert users[0].extra == {"api_token_name": "eval_admin", "bearer_format": "ol_api_<38 chars>"}
    assert users[4].email == "eval_other_team@example.com"
    assert users[4].extra["note"] == "in a separate team"
    owner = _facts("task_iyjruvfz").users[1]
    assert (owner.username, owner.password) == ("owner", "ChangeMe!2026")  # '`ChangeMe!2026`' cell, '(default)' gone
    assert owner.extra == {"user_permission_role": "USER", "membership_role": "OWNER"}


def test_duplicate_role_column_goes_to_extra():
    users = _facts("task_jzssnoqp").users
    assert (users[0].role, users[0].name, users[0].extra) == ("admin", "EvalAdmin", {"role": "administrator"})
    assert [u.email for u in users][-1] == "zero_inbox@eval.test"


def test_password_stated_above_a_table_fills_every_row():
    users = _facts("task_lgzivily").users
    assert [u.username for u in users] == [
        "admin",
        "evalphys",
        "evalclin",
        "evalfo",
        "evalacct",
        "evalrec",
        "evalemerg",
    ]
    assert {u.password for u in users} == {"pass"}
    assert users[3].role == "front office"


def test_placeholder_rows_are_skipped():
    users = _facts("task_rjhcjrst").users
    assert [(u.role, u.email, u.password) for u in users] == [
        ("admin", "admin@pfm.local", "secret123"),
        ("cross-group", "alice_user@pfm.local", "EvalRBACPass123!"),
    ]


def test_field_bullet_groups_under_an_admin_line_become_one_user():
    (admin,) = _facts("task_cvyocaao").users
    assert admin == EvalUser(
        role="admin", username="admin", password="admin", extra={"realm": "master", "client_id": "admin-cli"}
    )


def test_email_slash_password_bullets():
    users = _facts("task_orghjavi").users
    assert [u.role for u in users] == ["admin", "viewer", "editor", "billing", "guest"]
    assert (users[4].email, users[4].password) == ("bench-v2-guest@example.com", "GuestPass2026!@")


def test_tools_are_listed_without_markdown():
    tools = _facts("task_aoiwqoiq").tools
    assert len(tools) == 9
    assert tools[0] == "Ruby (ruby-full + ruby-dev) + Bundler (a mirror is preconfigured for gem and bundle)"
    lgz = _facts("task_lgzivily").tools  # wrapped bullets are joined
    assert lgz[0].startswith("PHP 8.1 CLI + ~60 PHP extensions (incl. bcmath, ctype, curl, dom, fileinfo, filter, gd")
    assert lgz[0].endswith("run php -m in the container for the full list)")
    assert len(_facts("task_gavmyneb").tools) == 7


def test_requirement_sub_bullets_and_code_stay_in_their_item():
    cvy = _facts("task_cvyocaao").requirements
    conventions = next(r for r in cvy if r.startswith("**API response conventions**"))
    assert "\n  - Create: HTTP 201 + empty body + `Location` header" in conventions
    config = _facts("task_mjobbzsi").requirements[-1]
    assert config.startswith("**Key configuration in `config.js`**:")
    assert 'domain: "conference.local"' in config and config.endswith("```")


def test_every_public_prompt_parses_without_internal_errors():
    for task_id in EXPECTED:
        assert not [w for w in _facts(task_id).warnings if w.startswith("could not extract")]


# ------------------------------------------------------------------------------------- odd inputs


def test_empty_text():
    facts = parse_prompt_for_model("")
    assert facts.task is None and facts.database is None and facts.users == [] and facts.app_port is None
    assert facts.prompt_text == ""
    assert "prompt is empty" in facts.warnings
    assert "no evaluation users found" in facts.warnings
    assert "no application port found" in facts.warnings


@pytest.mark.parametrize("value", [None, 42, b"\xff\xfe garbage"])
def test_non_text_input_is_tolerated(value):
    facts = parse_prompt_for_model(value)  # type: ignore[arg-type]
    assert facts.users == [] and facts.task is None
    assert any("prompt" in w and ("not text" in w or "bytes" in w) for w in facts.warnings)


def test_bytes_are_decoded():
    facts = parse_prompt_for_model("# SaaSBench Test Prompt — task_abc (Thing)\n".encode())  # type: ignore[arg-type]
    assert (facts.task, facts.product) == ("task_abc", "Thing")
    assert "prompt given as bytes; decoded as UTF-8" in facts.warnings


def test_no_headings_reads_the_whole_text():
    text = (
        "You work inside the container `c1`, with `/srv` as the working directory.\n\n"
        "**The application MUST listen on port `9000`.**\n"
    )
    facts = parse_prompt_for_model(text, source="inline")
    assert facts.prompt_text == text.strip()
    assert (facts.container, facts.workdir, facts.app_port, facts.host_port) == ("c1", "/srv", 9000, None)
    assert "no '## Prompt' section; facts read from the whole text" in facts.warnings
    assert "no task id found (expected '# SaaSBench Test Prompt — task_<id> (<Product>)')" in facts.warnings
    assert facts.source == "inline"


def test_prompt_section_without_tester_workflow_ends_at_the_next_section():
    text = "# SaaSBench Test Prompt — task_x (X)\n\n## Prompt\n\nBuild it.\n\n---\n\n## Appendix\n\nnot prompt\n"
    facts = parse_prompt_for_model(text)
    assert facts.prompt_text == "Build it."
    assert not any("Prompt' section" in w for w in facts.warnings)


def test_a_users_table_alone():
    text = (
        "Create these users, all with password `Shared1!`:\n\n"
        "| Role | Email | Password |\n|---|---|---|\n"
        "| **Admin** | `root@x.io` | `Pw1!` |\n"
        "| viewer | view@x.io (read only) | |\n"
        "| many | `<role>@x.io` | `Pw` |\n"
    )
    facts = parse_prompt_for_model(text)
    assert facts.users == [
        EvalUser(role="admin", email="root@x.io", password="Pw1!"),
        EvalUser(role="viewer", email="view@x.io", password="Shared1!", extra={"note": "read only"}),
    ]
    assert "no evaluation users found" not in facts.warnings
    assert "no database found" in facts.warnings


def test_empty_values_are_not_facts():
    text = "- Admin: email=``, username=``\n- Editor: email=``, username=`bob`, password=`pw`\n"
    assert parse_prompt_for_model(text).users == [EvalUser(role="editor", username="bob", password="pw")]


def test_garbage_gives_warnings_not_exceptions():
    text = "\x00```|||***((([[[ " + "=" * 50 + "\n| a |\n|-|\n**Database**\n- Port: `x`\n" + "- a: `b@` / `" * 20
    facts = parse_prompt_for_model(text)
    assert facts.database is None and facts.users == []
    assert "no database found" in facts.warnings and "no container name found" in facts.warnings
    assert not [w for w in facts.warnings if w.startswith("could not extract")]


@pytest.mark.parametrize(
    ("sentence", "ports"),
    [
        ("**The application MUST listen on port `8021`.**", (8021, None)),
        ("**The application MUST listen on container port `8000`** (mapped to host port `8014`).", (8000, 8014)),
        ("**The application must listen on host port `8016` (container port `3000` is recommended).**", (3000, 8016)),
        ("**The webapp MUST listen on container port `8031` (host port `8031`).**", (8031, None)),
        (
            "**The application MUST listen on port `8017`** (mapped to host `localhost:8017`).\n\n"
            "8. Start it bound to `0.0.0.0:80` (container port 80 is mapped to host port 8017).",
            (80, 8017),
        ),
        ("Start the server listening on `0.0.0.0:8123`.", (8123, None)),
    ],
)
def test_port_phrasings(sentence, ports):
    facts = parse_prompt_for_model(sentence)
    assert (facts.app_port, facts.host_port) == ports


def test_only_a_host_port_is_flagged():
    facts = parse_prompt_for_model("**The application MUST be reachable on host port `8026`.**")
    assert (facts.app_port, facts.host_port) == (8026, None)
    assert any(w.startswith("only a host port is stated") for w in facts.warnings)


def test_database_from_a_connection_url_only():
    text = "**Database (already running):**\n- Connection URL: `mysql://u1:p%40ss@mysqlhost:3307/shop`\n"
    db = parse_prompt_for_model(text).database
    assert db == DatabaseFacts(engine="mysql", host="mysqlhost", port=3307, name="shop", user="u1", password="p%40ss")


def test_database_with_missing_fields_warns_per_field():
    facts = parse_prompt_for_model("**SQLite 3 (already running):**\n- Host: `files`\n")
    assert facts.database == DatabaseFacts(engine="sqlite", version="3", host="files")
    for name in ("port", "name", "user", "password"):
        assert f"database: no {name} found" in facts.warnings
    assert facts.services == []  # the database block is not also a service


# Inputs that took 50 s to hours with the first, unbounded patterns. bench/prompt_facts_hostile.py times
# them (numbers in docs/benchmarks.md); here they must parse to facts with warnings, not raise.
HOSTILE = {
    "dashes": "| " + "-" * 200_000 + "x\n",
    "parens": "| Email | Password |\n|--|--|\n| a@b.c | " + "( " * 100_000 + " |\n",
    "emails": "- admin: `" + "a@b." * 100_000,
    "spaces": "container port 80" + " " * 200_000 + "x",
    "brackets": "- " + "a=[ " * 100_000,
    "wide-table": "| " * 100_000 + "|\n|---|\n" + "| x |\n" * 20_000,
    "many-headings": "**Environment variables:**\n" * 100_000,
    "title": "# SaaSBench Test Prompt — task_x" + " " * 100_000 + "y",
    "rules": "## Prompt\n" + "\n---" * 100_000 + "\nx",
    "tools-line": "Tools pre-installed (" * 20_000,
    "empty-emails": "\n- Host: `email=`" * 30_000,
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_input_gives_facts_with_warnings(name):
    facts = parse_prompt_for_model(HOSTILE[name])
    assert isinstance(facts, PromptFacts) and facts.warnings  # nothing a real prompt has was found
    assert facts.users == [] or all(u.email is None or "@" in u.email for u in facts.users)
