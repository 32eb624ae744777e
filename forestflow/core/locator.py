"""Where an artifact lives: a servable's ``path`` parsed into a locator, without any I/O.

ForestFlow detects the storage protocol from the text of ``path`` (its spec, section 7.1); so do
we, with its forms:

* Git: anything naming a ``.git`` repository: ``git@host:org/project.git#v<N>.<release>`` (the ssh
  form, fetched over HTTP(S) as ForestFlow did) or ``http(s)://host/org/project.git[#v<N>.<release>]``.
  The FQRV can be read from the ssh form (ForestFlow's regex) or from an http(s) URL's last two
  path segments and its ``#v<N>.<release>`` fragment.
* S3: ``<endpoint> bucket=<name> [region=<r>]`` with an ``s3://`` or ``s3::http(s)://`` endpoint
  (path-style when the bucket is in the URL's path), or plain ``s3://bucket/prefix``.
* ``http(s)://`` (one file) and ``file://`` (a file or a directory).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import unquote, urlparse

from forestflow.core.ids import FQRV, Contract
from forestflow.errors import CreateServableRequestInvalidError

SUPPORTED = "file://, http(s)://, Git (git@host:org/project.git or http(s)://.../project.git), s3://, s3::http(s)://"

# ForestFlow's extraction regex (``^git@(.*):(.*)/(.*).git#v([0-9]+).(.*)``), with the dots escaped.
_SSH_FORM = re.compile(r"^git@([^:]+):(.*)/([^/]+)\.git#v([0-9]+)\.(.+)$")
_SSH_REPO = re.compile(r"^git@([^:]+):(.+\.git)(?:#.*)?$")
_HTTP_TAG = re.compile(r"^v([0-9]+)\.(.+)$")


@dataclass(frozen=True, slots=True)
class FileLocator:
    """A local file or directory (``file://``)."""

    path: str


@dataclass(frozen=True, slots=True)
class HttpLocator:
    """One file over HTTP(S)."""

    url: str


@dataclass(frozen=True, slots=True)
class GitLocator:
    """A Git repository fetched over HTTP(S); ``repo_url`` is what ``git`` is given."""

    repo_url: str


@dataclass(frozen=True, slots=True)
class S3Locator:
    """A bucket (and key prefix) on an S3 endpoint; ``endpoint`` is None for AWS's own."""

    endpoint: str | None
    bucket: str
    prefix: str
    region: str | None
    #: True: path-style; False: virtual-hosted; None: botocore's choice (plain s3://bucket/prefix).
    path_style: bool | None
    #: The endpoint's authority and path as written, for ForestFlow's per-endpoint credentials.
    credential_base: str


Locator = FileLocator | HttpLocator | GitLocator | S3Locator


def is_git(path: str) -> bool:
    """Whether ``path`` names a Git repository (ForestFlow: contains ``.git``)."""
    text = path.strip()
    return text.startswith("git@") or (".git" in text and not text.startswith(("s3://", "s3::", "file://")))


def parse_locator(path: str, git_ssh_scheme: str = "https") -> Locator:
    """The locator of a servable ``path``; CreateServableRequestInvalidError names what is wrong."""
    text = path.strip()
    if text.startswith("s3://") or text.startswith("s3::"):
        return _parse_s3(text)
    if is_git(text):
        return GitLocator(_git_repo_url(text, git_ssh_scheme))
    scheme = urlparse(text).scheme.lower()
    if scheme == "file":
        parsed = urlparse(text)
        return FileLocator(unquote(parsed.netloc + parsed.path))
    if scheme in ("http", "https"):
        return HttpLocator(text)
    raise CreateServableRequestInvalidError(f"path {path!r}: unsupported scheme {scheme or '(none)'!r}; supported: {SUPPORTED}")


def _git_repo_url(text: str, ssh_scheme: str) -> str:
    repo = text.split("#", 1)[0]
    ssh = _SSH_REPO.match(text)
    if ssh:  # ForestFlow's rewrite: git@host:org/project.git -> <scheme>://host/org/project.git
        return f"{ssh_scheme}://{ssh.group(1)}/{ssh.group(2)}"
    if urlparse(repo).scheme.lower() not in ("http", "https"):
        raise CreateServableRequestInvalidError(
            f"path {text!r}: Git repositories are fetched over http(s):// (or written git@host:org/project.git)"
        )
    return repo


def fqrv_from_path(path: str) -> FQRV | None:
    """The FQRV a Git path names (``...org/project.git#v<N>.<release>``), or None."""
    text = path.strip()
    ssh = _SSH_FORM.match(text)
    if ssh:
        owner = ssh.group(2).rsplit("/", 1)[-1]
        return FQRV(Contract(owner, ssh.group(3), int(ssh.group(4))), ssh.group(5))
    if not is_git(text) or "#" not in text:
        return None
    repo, fragment = text.split("#", 1)
    tag = _HTTP_TAG.match(fragment)
    segments = [s for s in urlparse(repo).path.split("/") if s]
    if not tag or len(segments) < 2 or not segments[-1].endswith(".git"):
        return None
    return FQRV(Contract(segments[-2], segments[-1][: -len(".git")], int(tag.group(1))), tag.group(2))


def git_tag(fqrv: FQRV) -> str:
    """The tag a release is fetched from: ``v<contract_number>.<release>``."""
    return f"v{fqrv.contract.number}.{fqrv.release}"


def _parse_s3(text: str) -> S3Locator:
    words = text.split()
    url, options = words[0], words[1:]
    opts: dict[str, str] = {}
    for word in options:
        key, sep, value = word.partition("=")
        if not sep or key not in ("bucket", "region") or not value:
            raise CreateServableRequestInvalidError(
                f"path {text!r}: unexpected {word!r}; S3 paths are '<endpoint> bucket=<name> [region=<r>]' or s3://bucket/prefix"
            )
        opts[key] = value
    region = opts.get("region")
    if region == "none":
        region = None
    if url.startswith("s3::"):
        endpoint_url = url[len("s3::") :]
        if urlparse(endpoint_url).scheme not in ("http", "https"):
            raise CreateServableRequestInvalidError(f"path {text!r}: s3:: must be followed by http:// or https://")
    else:
        endpoint_url = "https://" + url[len("s3://") :]
    parsed = urlparse(endpoint_url)
    if "bucket" not in opts:
        if url.startswith("s3::"):
            raise CreateServableRequestInvalidError(f"path {text!r}: an s3:: endpoint needs bucket=<name>")
        # Plain s3://bucket/prefix: AWS's endpoint (or AWS_ENDPOINT_URL), virtual-hosted.
        bucket = parsed.netloc
        if not bucket:
            raise CreateServableRequestInvalidError(f"path {text!r}: no bucket in s3://bucket/prefix")
        return S3Locator(None, bucket, parsed.path.strip("/"), region, None, bucket + parsed.path.rstrip("/"))
    bucket = opts["bucket"]
    segments = [s for s in parsed.path.split("/") if s]
    credential_base = parsed.netloc + parsed.path.rstrip("/")
    if segments and segments[0] == bucket:  # path-style: http://host/bucket/prefix
        endpoint = f"{parsed.scheme}://{parsed.netloc}"
        return S3Locator(endpoint, bucket, "/".join(segments[1:]), region, True, credential_base)
    host = parsed.hostname or ""
    authority = parsed.netloc
    if host.startswith(bucket + "."):  # virtual-hosted: http://bucket.host/prefix
        authority = authority[len(bucket) + 1 :]
    return S3Locator(f"{parsed.scheme}://{authority}", bucket, "/".join(segments), region, False, credential_base)


def mlflow_model_dir(path: str) -> str:
    """An MLflow model's directory from a path naming it or its ``MLmodel`` file."""
    words = path.strip().split(" ", 1)
    first = words[0]
    if first.rstrip("/").endswith("/MLmodel"):
        first = first.rstrip("/")[: -len("/MLmodel")]
    return " ".join([first, *words[1:]])
