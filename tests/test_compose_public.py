"""The compose import on the 15 real public task files (tests/data/public-tasks), the schema check and the image map."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from shared_data import PUBLIC_TASK_IDS, PUBLIC_TASKS_DIR

from saasbench.catalog.envspec import SpecError, import_compose
from saasbench.catalog.imagemap import ImageMap, apply_image_map, image_needs, read_image_map

# services in file order, the app service, and the variables that have neither a value nor a default
EXPECTED = {
    "task_aoiwqoiq": (["db", "redis", "app"], "app", []),
    "task_cqfnbfay": (["db", "redis", "app"], "app", []),
    "task_cvyocaao": (["app", "db"], "app", []),
    "task_dfhjkeb": (["app", "db", "redis"], "app", []),
    "task_gavmyneb": (["web", "worker", "db", "redis"], "web", []),
    "task_hhrdixum": (["app", "db", "cache"], "app", []),
    "task_ididetxj": (["db", "redis", "app"], "app", ["SECRET_KEY", "UTILS_SECRET"]),
    "task_iyjruvfz": (
        ["app", "postgres", "redis", "mock-receiver"],
        "app",
        ["APP_ENCRYPTION_KEY", "CRON_API_KEY", "JWT_SECRET", "NEXTAUTH_SECRET"],
    ),
    "task_jzssnoqp": (["app", "db", "worker", "redis"], "app", []),
    "task_kmasmnil": (["app", "db", "redis"], "app", []),
    "task_lgzivily": (["app", "db"], "app", []),
    "task_mjobbzsi": (["app", "xmpp", "focus", "jvb"], "app", ["FOCUS_AUTH_PASSWORD", "JVB_AUTH_PASSWORD"]),
    "task_orghjavi": (["app", "postgres", "clickhouse"], "app", []),
    "task_qmjfeopc": (["app", "mongo", "redis"], "app", []),
    "task_rjhcjrst": (["app", "db", "mock-receiver"], "app", []),
}


def compose_of(task: str) -> Path:
    return PUBLIC_TASKS_DIR / task / "tasks" / task / "docker" / "docker-compose.yml"


def test_the_fifteen_are_all_here() -> None:
    assert PUBLIC_TASK_IDS == sorted(EXPECTED)


@pytest.mark.parametrize("task", sorted(EXPECTED))
def test_every_public_compose_file_maps(task: str) -> None:
    services, app, missing = EXPECTED[task]
    spec = import_compose(compose_of(task), strict=False)
    assert list(spec.services) == services
    assert spec.app() == app
    assert sorted(spec.missing_variables) == missing
    # every ignored key says why
    assert spec.ignored and all(": " in item for item in spec.ignored)
    assert any(i.startswith("services.") and "container_name" in i for i in spec.ignored) or task in (
        "task_cqfnbfay",
        "task_mjobbzsi",
    )
    if missing:
        with pytest.raises(SpecError, match=missing[0] if task != "task_iyjruvfz" else "NEXTAUTH_SECRET"):
            import_compose(compose_of(task))


def test_keys_real_tasks_use_are_applied() -> None:
    web = import_compose(compose_of("task_gavmyneb")).services["web"]
    assert web.dns == ["8.8.8.8", "1.1.1.1"] and web.working_dir == "/usr/src/app" and web.stdin_open and web.tty
    assert web.environment["TZ"] == "UTC"  # merged from the x-common-env anchor
    hh = import_compose(compose_of("task_hhrdixum"))
    assert hh.services["app"].environment["APP_DB_ENGINE"] == "postgresql"
    assert any(i.startswith("x-app-env (top level)") for i in hh.ignored)
    assert (
        hh.services["db"].init_sql_target == "/docker-entrypoint-initdb.d/00-init.sql"
    )  # the name orders init scripts
    assert hh.services["db"].aliases == ["postgres"] and hh.services["cache"].aliases == ["redis"]
    lg = import_compose(compose_of("task_lgzivily"), strict=False).services["app"]
    assert lg.entrypoint == [] and lg.command == ["bash", "-c", "tail -f /dev/null"]
    ch = import_compose(compose_of("task_orghjavi"), strict=False).services["clickhouse"]
    assert ch.ulimits == {"nofile": (262144, 262144)}
    iy = import_compose(compose_of("task_iyjruvfz"), strict=False)
    assert iy.services["app"].extra_hosts == {"host.docker.internal": "host-gateway"}
    assert any("pull_policy" in i and "never pull" in i for i in iy.ignored)
    mj = import_compose(compose_of("task_mjobbzsi"), strict=False).services["xmpp"]
    assert {5222, 5280, 5347} <= set(mj.ports)  # ports + expose


def test_missing_env_file_and_bind_source_are_warnings(tmp_path: Path) -> None:
    spec = import_compose(compose_of("task_cqfnbfay"))
    assert any("env_file: .env does not exist" in w for w in spec.warnings)
    assert spec.services["app"].env_file == []
    assert any("init-db.sql does not exist" in w for w in spec.warnings)
    folder = tmp_path / "docker"
    shutil.copytree(compose_of("task_cqfnbfay").parent, folder)
    (folder / ".env").write_text("PORT=8021\n")
    (folder / "init-db.sql").write_text("select 1;\n")
    spec = import_compose(folder / "docker-compose.yml")
    assert spec.warnings == [] and spec.services["app"].env_file == [".env"]


def test_schema_violations_name_the_place(tmp_path: Path) -> None:
    path = tmp_path / "docker-compose.yml"
    path.write_text("services:\n  app:\n    image: x\n    ports: {a: 1}\n")
    with pytest.raises(SpecError, match=r"compose specification.*services\.app\.ports"):
        import_compose(path)
    path.write_text("services:\n  app:\n    image: x\n    stdin_open: maybe\n")
    with pytest.raises(SpecError, match="stdin_open"):
        import_compose(path)
    # valid compose, but a setting this backend cannot honour: refused by name, never dropped
    path.write_text("services:\n  app:\n    image: x\n    privileged: true\n")
    with pytest.raises(SpecError, match="'privileged'"):
        import_compose(path)


# --- image map -------------------------------------------------------------------------------------
def test_image_map_lookup_and_apply(tmp_path: Path) -> None:
    path = tmp_path / "map.yaml"
    path.write_text(
        "images:\n  postgres:16-alpine: local/pg:16\n  'shadetocloak/task_*-app:*':\n"
        "    image: local/app\n    command: [sleep, infinity]\n    note: toolchain stand-in\n"
    )
    mapping = read_image_map(path)
    assert mapping.lookup("postgres:16-alpine").image == "local/pg:16"
    assert mapping.lookup("postgres:15") is None
    assert mapping.lookup("shadetocloak/task_cqfnbfay-app:model").image == "local/app"
    spec = import_compose(compose_of("task_cqfnbfay"), variables={"IMAGE_TAG": "model"})
    mapped = apply_image_map(spec, mapping)
    assert mapped.services["db"].image == "local/pg:16" and mapped.services["redis"].image == "redis:7-alpine"
    assert mapped.services["app"].command == ["sleep", "infinity"]
    assert mapped.substitutions["app"].startswith("shadetocloak/task_cqfnbfay-app:model -> local/app")
    assert spec.services["db"].image == "postgres:16-alpine"  # the original is untouched
    needs = {n.service: n for n in image_needs(mapped)}
    assert needs["db"].declared == "postgres:16-alpine" and needs["db"].image == "local/pg:16"
    assert needs["db"].available is None  # no engine asked
    # bare mapping form, and a bad entry names the file and key
    path.write_text("redis:7-alpine: local/redis\n")
    assert read_image_map(path).lookup("redis:7-alpine").image == "local/redis"
    path.write_text("images:\n  redis:7-alpine: {image: local/redis, bogus: 1}\n")
    with pytest.raises(SpecError, match=r"map\.yaml: images\.redis:7-alpine\.bogus"):
        read_image_map(path)
    assert apply_image_map(spec, ImageMap()) is spec
