"""The one seam to kube-apiserver: JSON requests and watch streams over HTTPS.

Built on urllib3 with the credentials from a kubeconfig (parsed by the kubernetes
client library) or from the pod's ServiceAccount mount (in-cluster), so that watch
streams are read line by line without buffering.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlencode

import urllib3
import yaml
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config

from datastore import incluster
from datastore.errors import DatastoreError, Invalid, NotConfigured, Unavailable, error_for

log = logging.getLogger(__name__)

Query = dict[str, str | int | bool]

# Ask a list for metadata only (names, versions, labels): no specs to send or parse.
METADATA_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"

# "storage is (re)initializing" (429) and 5xx on reads are worth a short wait.
RETRY_ATTEMPTS = 8
RETRY_INITIAL_S = 0.1
RETRY_CAP_S = 2.0

# A token file is re-read when it changes, and at least this often (client-go: a minute).
TOKEN_MAX_AGE_S = 60.0


class Transport(Protocol):
    """What the datastore needs from an apiserver connection."""

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Query | None = None,
        body: Any = None,
        content_type: str = "application/json",
        accept: str | None = None,
        timeout: float = 30.0,
    ) -> dict[str, Any]: ...

    def watch(self, path: str, query: Query, timeout: float) -> Iterator[dict[str, Any]]: ...


def _query_string(query: Query | None) -> str:
    if not query:
        return ""
    flat = {k: (str(v).lower() if isinstance(v, bool) else str(v)) for k, v in query.items()}
    return "?" + urlencode(flat)


class TokenFile:
    """A bearer token kept in a file (kubeconfig `tokenFile`, the ServiceAccount mount).

    kubelet rotates projected ServiceAccount tokens (about hourly, by swapping a
    symlink); the kubernetes client reads the file once, at load. Here the file is
    re-read when its inode, mtime or size changes, when the last read is older than
    max_age_s, and when the apiserver refused the token (refresh()).
    """

    def __init__(
        self,
        path: Path,
        max_age_s: float = TOKEN_MAX_AGE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = path
        self.max_age_s = max_age_s
        self._clock = clock
        self._seen: tuple[int, int, int] | None = None
        self._read_at = 0.0
        self._header: str | None = None

    def __call__(self) -> str | None:
        try:
            st = self.path.stat()
        except OSError as exc:
            if self._seen is not None:  # mid-swap or gone: the last token is all there is
                log.warning("token file %s unreadable (%s); using the last token", self.path, exc)
                return self._header
            raise NotConfigured(f"token file {self.path}: {exc.strerror or exc}") from exc
        key = (st.st_ino, st.st_mtime_ns, st.st_size)
        if key != self._seen or self._clock() - self._read_at >= self.max_age_s:
            token = self.path.read_text().strip()
            self._header = f"Bearer {token}" if token else None
            self._seen = key
            self._read_at = self._clock()
        return self._header

    def refresh(self) -> bool:
        """Re-read now (the token was refused); True when the token changed."""
        before = self._header
        self._seen = None
        return self() != before


def _token_file(path: str, context: str | None) -> TokenFile | None:
    """The current (or named) context's user tokenFile, relative to the kubeconfig."""
    config = yaml.safe_load(Path(path).read_text()) or {}
    name = context or config.get("current-context")
    ctx = next((c for c in config.get("contexts") or [] if c.get("name") == name), None)
    user_name = ((ctx or {}).get("context") or {}).get("user")
    user = next((u for u in config.get("users") or [] if u.get("name") == user_name), None)
    credentials = (user or {}).get("user") or {}
    if not credentials.get("tokenFile") or credentials.get("token"):
        return None  # kubectl too prefers an inline token
    return TokenFile(Path(path).parent / credentials["tokenFile"])


class HttpTransport:
    """HTTPS to one apiserver, authenticated as the kubeconfig says.

    Client certificates go into the TLS context; a bearer token (inline, from an
    exec plugin or auth provider, or from a tokenFile) is looked up per request so
    that a refreshed token is used as soon as it exists. A token file is re-read
    when the apiserver answers 401, and the request sent once more if it changed.
    """

    def __init__(
        self,
        configuration: k8s_client.Configuration,
        token: Callable[[], str | None] | None = None,
    ) -> None:
        self.host = configuration.host.rstrip("/")
        self._headers: dict[str, str] = {"Accept": "application/json"}
        self._token = token or functools.partial(_configured_token, configuration)
        self._token_file = token if isinstance(token, TokenFile) else None
        self._pool = urllib3.PoolManager(
            num_pools=4,
            maxsize=8,
            cert_reqs="CERT_REQUIRED" if configuration.verify_ssl else "CERT_NONE",
            ca_certs=configuration.ssl_ca_cert,
            cert_file=configuration.cert_file,
            key_file=configuration.key_file,
        )

    @classmethod
    def from_kubeconfig(cls, path: str, context: str | None = None) -> HttpTransport:
        if not Path(path).is_file():
            raise NotConfigured(f"kubeconfig {path} not found: pass --kubeconfig or set KUBECONFIG")
        configuration = k8s_client.Configuration()
        k8s_config.load_kube_config(
            config_file=path, context=context, client_configuration=configuration
        )
        return cls(configuration, _token_file(path, context))

    @classmethod
    def in_cluster(
        cls, directory: Path | None = None, environ: Mapping[str, str] | None = None
    ) -> HttpTransport:
        """The pod's own ServiceAccount, as client-go's rest.InClusterConfig reads it.

        Server https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT, verified
        against the mount's ca.crt; the mount's token, re-read as kubelet rotates it.
        """
        sa_dir = incluster.service_account_dir(directory)
        env = os.environ if environ is None else environ
        problems = incluster.in_cluster_problems(sa_dir, env)
        if problems:
            raise NotConfigured("not in a cluster: " + ", ".join(problems))
        configuration = k8s_client.Configuration()
        configuration.host = incluster.server_url(env[incluster.HOST_ENV], env[incluster.PORT_ENV])
        configuration.ssl_ca_cert = str(sa_dir / "ca.crt")
        configuration.verify_ssl = True
        return cls(configuration, TokenFile(sa_dir / "token"))

    def _token_changed(self, exc: DatastoreError) -> bool:
        """After a 401: True when the token file now holds another token, worth a retry."""
        if exc.status != 401 or self._token_file is None:
            return False
        changed = self._token_file.refresh()
        log.info("apiserver refused the token; %s", "re-read a new one" if changed else "unchanged")
        return changed

    def _auth_headers(self) -> dict[str, str]:
        headers = dict(self._headers)
        token = self._token()
        if token:
            headers["Authorization"] = token
        return headers

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Query | None = None,
        body: Any = None,
        content_type: str = "application/json",
        accept: str | None = None,
        timeout: float = 30.0,
    ) -> dict[str, Any]:
        """One request; retried while the apiserver asks to (429) or, for reads, is busy,
        and once more when a refused token (401) has been replaced in its file."""
        try:
            return self._request_retrying(method, path, query, body, content_type, accept, timeout)
        except DatastoreError as exc:
            if not self._token_changed(exc):
                raise
        return self._request_retrying(method, path, query, body, content_type, accept, timeout)

    def _request_retrying(
        self,
        method: str,
        path: str,
        query: Query | None,
        body: Any,
        content_type: str,
        accept: str | None,
        timeout: float,
    ) -> dict[str, Any]:
        delay = RETRY_INITIAL_S
        for _ in range(RETRY_ATTEMPTS - 1):
            try:
                return self._request_once(method, path, query, body, content_type, accept, timeout)
            except Unavailable as exc:
                if not (exc.status == 429 or (method == "GET" and exc.status >= 500)):
                    raise
                log.debug("%s %s: %s; retrying in %.2fs", method, path, exc, delay)
                time.sleep(delay)
                delay = min(delay * 2, RETRY_CAP_S)
        return self._request_once(method, path, query, body, content_type, accept, timeout)

    def _request_once(
        self,
        method: str,
        path: str,
        query: Query | None,
        body: Any,
        content_type: str,
        accept: str | None,
        timeout: float,
    ) -> dict[str, Any]:
        headers = self._auth_headers()
        if accept:
            headers["Accept"] = accept
        data = None
        if body is not None:
            headers["Content-Type"] = content_type
            data = encode_body(body, method, path)
        url = self.host + path + _query_string(query)
        try:
            resp = self._pool.request(
                method, url, body=data, headers=headers, timeout=timeout, retries=False
            )
        except urllib3.exceptions.HTTPError as exc:
            raise Unavailable(f"apiserver {self.host} unreachable: {exc}") from exc
        payload = _decode(resp.data)
        if resp.status >= 300:
            raise _status_error(resp.status, payload, method, path)
        return payload

    def watch(self, path: str, query: Query, timeout: float) -> Iterator[dict[str, Any]]:
        """Yield watch events ({type, object}) until the server closes the stream."""
        resp = self._open_watch(path, query, timeout)
        if resp.status == 401 and self._token_file is not None and self._token_file.refresh():
            resp.drain_conn()  # read the refusal, so the connection can be reused
            resp = self._open_watch(path, query, timeout)  # a rotated token: once more
        try:
            if resp.status >= 300:
                raise _status_error(resp.status, _decode(resp.read()), "WATCH", path)
            yield from _json_lines(resp)
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise Unavailable(f"watch on {path} broke: {exc}") from exc
        finally:
            resp.release_conn()

    def _open_watch(self, path: str, query: Query, timeout: float) -> urllib3.BaseHTTPResponse:
        url = self.host + path + _query_string({**query, "watch": True})
        try:
            return self._pool.request(
                "GET",
                url,
                headers=self._auth_headers(),
                preload_content=False,
                timeout=urllib3.Timeout(connect=10.0, read=timeout),
                retries=False,
            )
        except urllib3.exceptions.HTTPError as exc:
            raise Unavailable(f"apiserver {self.host} unreachable: {exc}") from exc


def _configured_token(configuration: k8s_client.Configuration) -> str | None:
    """The client library's bearer token ("Bearer ..."); its hook refreshes expiring ones.

    The client library keeps it under api_key["BearerToken"] (older releases used
    "authorization"); reading only the old key sent no token at all.
    """
    if not configuration.api_key:
        return None
    token: str | None = configuration.get_api_key_with_prefix("BearerToken", alias="authorization")
    return token


def _json_lines(resp: urllib3.BaseHTTPResponse) -> Iterator[dict[str, Any]]:
    buf = b""
    for chunk in resp.stream(64 * 1024, decode_content=True):
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            if line.strip():
                yield json.loads(line)
    if buf.strip():
        yield json.loads(buf)


def encode_body(body: Any, method: str, path: str) -> bytes:
    """The request body as JSON, or :class:`Invalid` naming the field that has no JSON
    form (NaN or an infinity, as YAML's ``.nan`` and ``.inf`` give): Python's encoder
    would write ``NaN``/``Infinity``, which no JSON reader (the apiserver) accepts."""
    try:
        return json.dumps(body, allow_nan=False).encode()
    except ValueError:
        where = _non_finite(body, "") or "a value"
        raise Invalid(
            f"{method} {path}: {where} is NaN or infinite, which JSON cannot carry", 0, "Invalid"
        ) from None


def _non_finite(value: Any, path: str) -> str | None:
    """The dotted path of the first NaN or infinite number in ``value``."""
    if isinstance(value, float) and not math.isfinite(value):
        return path or "the body"
    items: Iterable[tuple[Any, Any]]
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, list):
        items = enumerate(value)
    else:
        return None
    for key, inner in items:
        inner_path = f"{path}[{key}]" if isinstance(key, int) else f"{path}.{key}".lstrip(".")
        found = _non_finite(inner, inner_path)
        if found:
            return found
    return None


def _decode(data: bytes) -> dict[str, Any]:
    if not data:
        return {}
    try:
        value = json.loads(data)
    except ValueError:
        return {"message": data.decode(errors="replace")[:500]}
    return value if isinstance(value, dict) else {"items": value}


def _status_error(status: int, payload: dict[str, Any], method: str, path: str) -> DatastoreError:
    reason = str(payload.get("reason", ""))
    message = str(payload.get("message") or f"{method} {path} answered HTTP {status}")
    return error_for(status, reason, message)
