"""Object stores under the lake: a local folder or an S3 bucket (any S3-compatible endpoint).

A store maps ``/``-separated keys (relative to the lake root) to bytes. The writer needs exactly
four things from it: an atomic ``put`` of one object, ``get``, recursive ``list`` under a prefix
and ``delete``; content-addressed writers (the frozen end states, ``objects/sha256/...``) also
ask :meth:`Store.exists`. Readers also need :meth:`Store.url` (what DuckDB opens) and
:meth:`Store.configure_duckdb` (how DuckDB reaches the store).

Atomicity: :class:`LocalStore` writes a temporary file in the destination folder, fsyncs it and
``os.replace``-s it over the key (atomic on POSIX); :class:`S3Store` uses one ``PutObject`` per
object, which S3 makes visible all at once. Neither offers atomicity across objects: that is what
the writer's commit markers are for.

Credentials are never stored in the lake, in ``repr`` or in log lines: :class:`S3Store` takes them
from the usual AWS environment (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``/
``AWS_SESSION_TOKEN``, profiles, ...) through boto3 and hands them to DuckDB as an in-memory
secret of the connection only.

DuckDB reaches S3 through the ``httpfs`` extension loaded from the ``duckdb-extension-httpfs``
wheel (pinned to the exact DuckDB version; no download at run time). Chosen over fsspec/s3fs:
fastest in the feasibility check (cold query 0.10 s vs 0.3-0.7 s), native predicate and column
pushdown over HTTP range reads, and no s3fs -> aiobotocore -> botocore pin fighting boto3.
"""

from __future__ import annotations

import builtins  # the stores define a method named ``list``; annotations after it name the builtin
import os
import tempfile
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from saasbench import settings

DEFAULT_LAKE = settings.DEFAULT_LAKE
ENV_LAKE = "SAASBENCH_LAKE"
ENV_ENDPOINT = "SAASBENCH_S3_ENDPOINT"


class LakeStoreError(RuntimeError):
    """The store cannot be reached or an object cannot be read/written (message names the key)."""


def _check_key(key: str) -> str:
    if not key or key.startswith("/") or "\\" in key or any(p in ("", ".", "..") for p in key.split("/")):
        raise ValueError(f"invalid lake key {key!r}")
    return key


class Store(ABC):
    """A lake root. Keys are relative, ``/``-separated."""

    @property
    @abstractmethod
    def uri(self) -> str:
        """The lake's URI (``file:///...`` or ``s3://bucket/prefix``), no credentials."""

    @abstractmethod
    def put(self, key: str, data: bytes) -> None:
        """Write one object atomically: readers see the old bytes or the new bytes, never a mix."""

    @abstractmethod
    def get(self, key: str) -> bytes | None:
        """The object's bytes, or None if it does not exist."""

    @abstractmethod
    def list(self, prefix: str = "") -> list[str]:
        """All keys starting with ``prefix`` (recursive), sorted."""

    def list_info(self, prefix: str = "") -> builtins.list[tuple[str, float]]:
        """(key, last-modified epoch seconds) of all keys starting with ``prefix``."""
        raise NotImplementedError

    def exists(self, key: str) -> bool:
        """Whether an object exists under ``key`` (content-addressed writers skip the put then)."""
        return key in self.list(key)

    @abstractmethod
    def delete(self, keys: Iterable[str]) -> None:
        """Delete objects; missing keys are ignored."""

    @abstractmethod
    def url(self, key: str) -> str:
        """What DuckDB's ``read_parquet`` opens for ``key``."""

    def configure_duckdb(self, con: Any) -> None:  # noqa: B027 - an optional hook, a no-op by default
        """Make ``con`` able to read :meth:`url` paths. Local: nothing to do."""

    def get_many(self, keys: builtins.list[str]) -> dict[str, bytes | None]:
        return {k: self.get(k) for k in keys}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.uri!r})"


class LocalStore(Store):
    """A folder on the local filesystem (created on first write)."""

    def __init__(self, root: str | os.PathLike[str]):
        self.root = Path(root).expanduser().resolve()

    @property
    def uri(self) -> str:
        return self.root.as_uri()

    def _path(self, key: str) -> Path:
        return self.root.joinpath(*_check_key(key).split("/"))

    def put(self, key: str, data: bytes) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".part")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise
        try:  # make the rename durable
            dfd = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        except OSError:
            pass

    def get(self, key: str) -> bytes | None:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError:
            return None

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def list(self, prefix: str = "") -> list[str]:
        return [k for k, _ in self.list_info(prefix)]

    def list_info(self, prefix: str = "") -> builtins.list[tuple[str, float]]:
        # walk the deepest existing folder of the prefix, then filter by the full prefix
        folder = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        base = self.root.joinpath(*folder.split("/")) if folder else self.root
        if not base.is_dir():
            return []
        out: list[tuple[str, float]] = []
        for dirpath, _dirs, files in os.walk(base):
            rel = Path(dirpath).relative_to(self.root).as_posix()
            for name in files:
                if name.startswith(".tmp-"):
                    continue  # an in-flight or crashed atomic write, never an object
                key = name if rel == "." else f"{rel}/{name}"
                if key.startswith(prefix):
                    try:
                        out.append((key, os.stat(os.path.join(dirpath, name)).st_mtime))
                    except FileNotFoundError:
                        pass  # deleted while listing
        return sorted(out)

    def delete(self, keys: Iterable[str]) -> None:
        for key in keys:
            try:
                self._path(key).unlink()
            except FileNotFoundError:
                pass

    def url(self, key: str) -> str:
        return str(self._path(key))


class S3Store(Store):
    """A bucket + prefix on S3 or an S3-compatible endpoint (moto, MinIO, Ceph, R2, ...).

    ``endpoint_url`` None means AWS itself. Credentials come from the environment through boto3's
    default chain; pass ``client`` to reuse a configured boto3 client.
    """

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        client: Any = None,
    ):
        if not bucket:
            raise ValueError("S3Store needs a bucket")
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.endpoint_url = endpoint_url or None
        self.region = region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
        self._client = client
        self._lock = threading.Lock()

    @property
    def uri(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"

    @property
    def client(self) -> Any:
        with self._lock:
            if self._client is None:
                import boto3
                from botocore.config import Config

                cfg = Config(
                    s3={"addressing_style": "path"} if self.endpoint_url else {},
                    retries={"max_attempts": 5, "mode": "standard"},
                )
                self._client = boto3.session.Session().client(
                    "s3", endpoint_url=self.endpoint_url, region_name=self.region, config=cfg
                )
            return self._client

    def _key(self, key: str) -> str:
        _check_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def put(self, key: str, data: bytes) -> None:
        try:
            self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data)
        except Exception as exc:  # noqa: BLE001 - any botocore error; re-raised with the key, no credentials
            raise LakeStoreError(f"cannot write {self.uri}/{key}: {exc}") from None

    def get(self, key: str) -> bytes | None:
        try:
            return self.client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"].read()
        except Exception as exc:  # noqa: BLE001 - any botocore error, re-raised with the key
            code = getattr(exc, "response", {}).get("Error", {}).get("Code")
            if code in ("NoSuchKey", "404", "NotFound"):
                return None
            raise LakeStoreError(f"cannot read {self.uri}/{key}: {exc}") from None

    def exists(self, key: str) -> bool:
        try:
            self.client.head_object(Bucket=self.bucket, Key=self._key(key))
            return True
        except Exception as exc:  # noqa: BLE001 - any botocore error, re-raised with the key
            code = getattr(exc, "response", {}).get("Error", {}).get("Code")
            if code in ("NoSuchKey", "404", "NotFound"):
                return False
            raise LakeStoreError(f"cannot look up {self.uri}/{key}: {exc}") from None

    def get_many(self, keys: list[str]) -> dict[str, bytes | None]:
        if len(keys) <= 1:
            return super().get_many(keys)
        with ThreadPoolExecutor(max_workers=min(16, len(keys))) as pool:
            return dict(zip(keys, pool.map(self.get, keys)))

    def list(self, prefix: str = "") -> list[str]:
        return [k for k, _ in self.list_info(prefix)]

    def list_info(self, prefix: str = "") -> builtins.list[tuple[str, float]]:
        full = (f"{self.prefix}/" if self.prefix else "") + prefix
        strip = len(self.prefix) + 1 if self.prefix else 0
        out: list[tuple[str, float]] = []
        try:
            for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=full):
                out.extend((obj["Key"][strip:], obj["LastModified"].timestamp()) for obj in page.get("Contents", []))
        except Exception as exc:  # noqa: BLE001 - any botocore error, re-raised with the key
            raise LakeStoreError(f"cannot list {self.uri}/{prefix}: {exc}") from None
        return sorted(out)

    def delete(self, keys: Iterable[str]) -> None:
        keys = [self._key(k) for k in keys]
        for i in range(0, len(keys), 1000):
            batch = keys[i : i + 1000]
            try:
                self.client.delete_objects(
                    Bucket=self.bucket, Delete={"Objects": [{"Key": k} for k in batch], "Quiet": True}
                )
            except Exception as exc:  # noqa: BLE001 - any botocore error, re-raised with the key
                raise LakeStoreError(f"cannot delete under {self.uri}: {exc}") from None

    def _credentials(self) -> Any:
        """Frozen credentials of the boto3 default chain (or of the client given), or None."""
        creds = None
        if self._client is not None:
            creds = getattr(getattr(self._client, "_request_signer", None), "_credentials", None)
        if creds is None:
            import boto3

            creds = boto3.session.Session().get_credentials()
        return creds.get_frozen_credentials() if creds is not None else None

    def url(self, key: str) -> str:
        return f"s3://{self.bucket}/{self._key(key)}"

    def configure_duckdb(self, con: Any) -> None:
        """Load httpfs (from the pinned wheel) and create an in-memory S3 secret for this store."""
        load_httpfs(con)
        frozen = self._credentials()
        opts: dict[str, Any] = {"TYPE": "s3", "REGION": self.region}
        if frozen is not None:
            opts["KEY_ID"] = frozen.access_key
            opts["SECRET"] = frozen.secret_key
            if frozen.token:
                opts["SESSION_TOKEN"] = frozen.token
        if self.endpoint_url:
            u = urlparse(self.endpoint_url)
            opts["ENDPOINT"] = u.netloc + (u.path.rstrip("/") if u.path not in ("", "/") else "")
            opts["URL_STYLE"] = "path"
            opts["USE_SSL"] = u.scheme == "https"
        body = ", ".join(f"{k} {_sql_value(v)}" for k, v in opts.items())
        # a temporary, connection-local secret: lives only in this process's memory
        con.execute(f"CREATE OR REPLACE TEMPORARY SECRET saasbench_lake ({body})")
        # lake objects never change under a key (part files are named by their content hash,
        # markers are read by boto3), so footers and HEADs can be cached: one report reads each
        # file's footer once instead of once per query
        con.execute("SET parquet_metadata_cache = true")
        con.execute("SET enable_http_metadata_cache = true")


def _sql_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return "'" + str(v).replace("'", "''") + "'"


def httpfs_extension_path() -> Path | None:
    """The httpfs binary shipped by the ``duckdb-extension-httpfs`` wheel for this DuckDB, if any."""
    try:
        import duckdb
        import duckdb_extension_httpfs
    except ImportError:
        return None
    p = (
        Path(duckdb_extension_httpfs.__file__).parent
        / "extensions"
        / f"v{duckdb.__version__}"
        / "httpfs.duckdb_extension"
    )
    return p if p.is_file() else None


def load_httpfs(con: Any) -> None:
    """Load httpfs offline from the pinned wheel; without the wheel fall back to DuckDB's own
    ``LOAD httpfs`` (which needs the extension installed or network access)."""
    path = httpfs_extension_path()
    try:
        if path is not None:
            con.execute("LOAD " + _sql_value(str(path)))
        else:
            con.execute("LOAD httpfs")
    except Exception as exc:  # noqa: BLE001 - any DuckDB error, re-raised with the fix
        raise LakeStoreError(
            f"DuckDB cannot load httpfs for S3 ({exc}); install duckdb-extension-httpfs=={_duckdb_version()}"
        ) from None


def _duckdb_version() -> str:
    import duckdb

    return duckdb.__version__


def s3_endpoint_from_env() -> str | None:
    """The S3 endpoint from the environment (:func:`saasbench.settings.s3_endpoint`; an empty
    ``$SAASBENCH_S3_ENDPOINT`` is a :class:`saasbench.settings.SettingError`)."""
    return settings.s3_endpoint() or None


def lake_from_uri(
    uri: str | os.PathLike[str] | Store | None = None, *, endpoint_url: str | None = None, region: str | None = None
) -> Store:
    """A store for ``uri``: a path, ``file:///abs/path``, or ``s3://bucket/prefix``.

    None means ``$SAASBENCH_LAKE`` or ``runs/lake``. The S3 endpoint is ``endpoint_url``, else
    ``$SAASBENCH_S3_ENDPOINT``, ``$AWS_ENDPOINT_URL_S3``, ``$AWS_ENDPOINT_URL``, else AWS.
    A :class:`Store` is returned as is.
    """
    if isinstance(uri, Store):
        return uri
    if uri is None:
        uri = settings.lake_uri()
    text = os.fspath(uri)
    if text.startswith("s3://"):
        u = urlparse(text)
        if u.username or u.password:
            raise ValueError("credentials do not belong in the lake URI; use the AWS environment variables")
        return S3Store(u.netloc, u.path.strip("/"), endpoint_url=endpoint_url or s3_endpoint_from_env(), region=region)
    if text.startswith("file://"):
        u = urlparse(text)
        if u.netloc not in ("", "localhost"):
            raise ValueError(f"file URI with a host is not supported: {text!r}")
        from urllib.parse import unquote

        return LocalStore(unquote(u.path))
    if "://" in text:
        raise ValueError(f"unsupported lake URI {text!r} (a path, file:///..., or s3://bucket/prefix)")
    return LocalStore(text)
