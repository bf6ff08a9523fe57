"""The Ray backend of the sweep: each work item (one unit, or one batched ensemble) is a Ray task.

A task runs in a scratch folder on whichever node Ray picks; the unit folders' files travel as bytes
(in: what an interrupted run left, so ``--resume`` continues its checkpoint; out: everything the
unit wrote), and the driver writes them into the run folder, ``result.json`` last. So results land
on the driver even when the cluster's nodes share no file system, and a run folder is the same
whichever backend filled it (``--resume`` works across backends).

A task whose worker process or node dies is re-run by Ray up to `retries` times; after that its
units are reported failed (in the claims and the report) and the sweep goes on. Exceptions inside a
unit are not retried: they are the unit's failure, as with the local backend.

Ray is an optional extra: ``pip install "featlab[ray]"``. The cluster's nodes need featurelab
installed (same version); connect with ``address`` (``HOST:PORT``) or ``RAY_ADDRESS``; with neither, a
local Ray instance is started. If Ray is already initialised in this process, that connection is used.

Before a run folder is written, `handshake` asks the cluster's head, within `CONNECT_TIMEOUT` seconds in
all, for its Ray and Python versions, sending Ray's authentication token: a dead address, another service,
a silent server, a missing or refused token and a version that differs from this process's are one line
each, in milliseconds to seconds, where ``ray.init`` would retry for 20 s and then name none of them.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from ..errors import FeaturelabError
from ..io import write_bytes
from .work import BuildError, UnitOutcome, WorkItem, execute

CONNECT_TIMEOUT = 10.0  # seconds for the whole handshake with a Ray cluster's head


def _ray():
    try:
        import ray
    except ImportError:
        raise FeaturelabError('backend="ray" needs the optional Ray extra: pip install "featlab[ray]"') from None
    return ray


HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])  # + an empty SETTINGS frame


def _host_port(address: str) -> tuple[str, int]:
    """(host, port) of ``HOST:PORT`` or ``ray://HOST:PORT`` (IPv6 hosts in brackets); one line otherwise."""
    host, sep, port = address.split("://", 1)[-1].rpartition(":")
    if not sep or not host or not port.isdigit():
        raise FeaturelabError(f"address={address!r} is not allowed: give HOST:PORT of the Ray cluster's head")
    return host.strip("[]"), int(port)


def probe(address: str, timeout: float = CONNECT_TIMEOUT) -> None:
    """A one-line error unless a gRPC server (a Ray head's GCS or client server) answers at `address`
    (``HOST:PORT``, or ``ray://HOST:PORT``) within `timeout` seconds in all: it must accept the connection and
    answer the HTTP/2 client preface with a SETTINGS frame (RFC 9113 §3.4), which another service (a web or SSH
    server, a silent port) does not; "auto" and "local" are not probed."""
    if address in ("auto", "local"):
        return
    deadline = time.monotonic() + timeout
    try:
        conn = socket.create_connection(_host_port(address), timeout=timeout)
    except OSError as exc:
        cause = exc.strerror or type(exc).__name__
        raise FeaturelabError(
            f"could not connect to the Ray cluster at {address} within {timeout:g} s ({cause}); "
            "start it (`ray start --head`) or check the address"
        ) from None
    with conn:
        try:
            conn.settimeout(max(deadline - time.monotonic(), 1e-3))  # the connection's time counts too
            conn.sendall(HTTP2_PREFACE)
            frame = conn.recv(9)
        except OSError:  # silent, or closed on us
            frame = b""
    if len(frame) < 9 or frame[3] != 4:  # a frame header: 3 bytes length, 1 byte type (4: SETTINGS)
        raise FeaturelabError(
            f"the service at {address} is not a Ray cluster's head (it does not answer as a gRPC server "
            f"within {timeout:g} s); check the address and port (`ray status` on the head prints it)"
        )


def auth_token() -> tuple[str | None, str]:
    """Ray's authentication token, looked up as Ray does (docs.ray.io, "Ray token authentication"):
    ``RAY_AUTH_TOKEN`` if set and not empty, else the file ``RAY_AUTH_TOKEN_PATH`` names, else
    ``~/.ray/auth_token`` if it holds one; and where it came from. (None, "") when there is none; an unreadable
    or empty ``RAY_AUTH_TOKEN_PATH`` is one line, as Ray refuses it too."""
    if os.environ.get("RAY_AUTH_TOKEN", "").strip():
        return os.environ["RAY_AUTH_TOKEN"].strip(), "RAY_AUTH_TOKEN"
    named = os.environ.get("RAY_AUTH_TOKEN_PATH")
    path = Path(named).expanduser() if named else Path.home() / ".ray" / "auth_token"
    if not named and not path.is_file():
        return None, ""
    try:
        token = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise FeaturelabError(
            f"RAY_AUTH_TOKEN_PATH={named!r} cannot be read ({type(exc).__name__}); name the file that holds the "
            "cluster's token (`ray get-auth-token` on the head prints it)"
        ) from None
    if not token and named:
        raise FeaturelabError(f"RAY_AUTH_TOKEN_PATH={named!r} names an empty file; write the cluster's token into it")
    return (token or None), (f"RAY_AUTH_TOKEN_PATH={named!r}" if named else f"'{path}'") if token else ""


def _grpc():
    try:
        import grpc
    except ImportError:
        raise FeaturelabError(
            'the Ray handshake needs grpcio (part of "ray[default]"): pip install "featlab[ray]"'
        ) from None
    return grpc


KV_GET = "/ray.rpc.InternalKVGcsService/InternalKVGet"  # a GCS's key-value read (Ray's gcs_service.proto)
CLUSTER_INFO = "/ray.rpc.RayletDriver/ClusterInfo"  # a Ray Client server's (Ray's ray_client.proto)
CLUSTER_METADATA = (b"CLUSTER_METADATA", b"cluster")  # key and namespace of the head's versions (Ray's usage_lib)
PING = 6  # ClusterInfoType.PING: the Ray Client server answers it before any connection of a driver
TOKEN_FIX = "`ray get-auth-token` on the head prints it"


def _varint(n: int) -> bytes:
    """`n` >= 0 as a protobuf varint: 7 bits a byte, low bits first, the high bit set on all but the last."""
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    return bytes(out + bytes([n]))


def pb_message(fields: Sequence[tuple[int, int | bytes]]) -> bytes:
    """A protobuf message of (number, value) fields: an int as a varint (wire type 0), bytes length-delimited
    (wire type 2)."""
    out = b""
    for number, value in fields:
        if isinstance(value, int):
            out += _varint(number << 3) + _varint(value)
        else:
            out += _varint(number << 3 | 2) + _varint(len(value)) + value
    return out


def pb_fields(data: bytes) -> dict[int, int | bytes]:
    """The fields of a protobuf message by number (the last of a repeated one): varints as int, length-delimited
    and fixed-width values as bytes. Bad wire data raises ValueError."""
    out: dict[int, int | bytes] = {}
    i = 0
    while i < len(data):
        key, i = _read_varint(data, i)
        wire = key & 7
        if wire == 0:
            value, i = _read_varint(data, i)
        elif wire in (1, 2, 5):
            size, i = (8, i) if wire == 1 else (4, i) if wire == 5 else _read_varint(data, i)
            value, i = data[i : i + size], i + size
            if len(value) < size:
                raise ValueError("a field runs past the end of the message")
        else:
            raise ValueError(f"wire type {wire} is not read here")
        out[key >> 3] = value
    return out


def _read_varint(data: bytes, i: int) -> tuple[int, int]:
    """The varint at `data[i:]` and the index after it."""
    n = shift = 0
    while True:
        if i >= len(data):
            raise ValueError("a varint runs past the end of the message")
        n |= (data[i] & 0x7F) << shift
        shift, i = shift + 7, i + 1
        if not data[i - 1] & 0x80:
            return n, i


def ask_head(address: str, deadline: float, timeout: float) -> dict:
    """The head's cluster metadata (``ray_version``, ``python_version``, ...) read from its GCS at `address`
    with one gRPC call that ends by `deadline` (``time.monotonic()``), carrying Ray's token (`auth_token`); {}
    from a Ray Client server (``ray://``), asked its PING only. A refusal is one line (`refusal`)."""
    grpc = _grpc()
    token, source = auth_token()
    metadata = (("authorization", f"Bearer {token}"),) if token else ()
    client = address.startswith("ray://")
    method, request = (CLUSTER_INFO, [(1, PING)]) if client else (KV_GET, list(enumerate(CLUSTER_METADATA, 1)))
    left = deadline - time.monotonic()
    if left <= 0:
        raise FeaturelabError(refusal(address, "DEADLINE_EXCEEDED", "", source, timeout))
    with grpc.insecure_channel(address.split("://", 1)[-1]) as channel:
        try:
            reply = channel.unary_unary(method)(pb_message(request), timeout=left, metadata=metadata)
        except grpc.RpcError as exc:
            code, details = exc.code().name, exc.details()  # type: ignore[attr-defined]  # a grpc.Call
            raise FeaturelabError(refusal(address, code, " ".join(str(details).split()), source, timeout)) from None
    return {} if client else _metadata(address, reply)


def _metadata(address: str, reply: bytes) -> dict:
    """The JSON value of an InternalKVGetReply (status: field 1, its code field 1; value: field 2); {} when the
    key is absent. A reply that is not one is one line."""
    try:
        fields = pb_fields(reply)
        status = fields.get(1, b"")
        value = fields.get(2, b"")
        code = pb_fields(status).get(1, 0) if isinstance(status, bytes) else status
        found = json.loads(value) if code == 0 and isinstance(value, bytes) and value else {}
    except (ValueError, UnicodeDecodeError):
        raise FeaturelabError(
            f"the gRPC server at {address} answers Ray's handshake with something else; check the address and "
            "port (`ray status` on the head prints it)"
        ) from None
    return found if isinstance(found, dict) else {}


def refusal(address: str, code: str, details: str, source: str, timeout: float) -> str:
    """The one line for a gRPC status `code` (its name, e.g. "UNAUTHENTICATED") that the head at `address`
    answered, with the token's `source` ("" for none) and the handshake's `timeout`."""
    if code == "UNAUTHENTICATED" and not source:
        return (
            f"the Ray cluster at {address} requires token authentication and this process has no token: set "
            f"RAY_AUTH_TOKEN (or RAY_AUTH_TOKEN_PATH) to the cluster's token ({TOKEN_FIX})"
        )
    if code == "UNAUTHENTICATED":
        return f"the Ray cluster at {address} refused the token from {source}: use the cluster's token ({TOKEN_FIX})"
    if code == "DEADLINE_EXCEEDED":
        return (
            f"the Ray cluster at {address} accepted the connection but did not answer within {timeout:g} s; check "
            "that its head is running and not overloaded (`ray status` on the head)"
        )
    if code == "UNIMPLEMENTED" and address.startswith("ray://"):
        return (
            f"the gRPC server at {address} is not a Ray Client server (it answers no Ray Client PING); give the "
            "head's GCS address without ray:// (`ray status` on the head prints it), or the Ray Client server's port"
        )
    if code == "UNIMPLEMENTED":
        return (
            f"the gRPC server at {address} is not a Ray cluster's head (it serves no Ray handshake); give the "
            "head's GCS address (`ray status` on the head prints it), or ray://HOST:PORT for a Ray Client server"
        )
    return f"the Ray cluster at {address} refused the handshake ({code}: {details}); check the address and the head"


def check_versions(address: str, head: dict, ray_version: str, python_version: str) -> None:
    """One line unless the cluster's Ray version (`head`, from `ask_head`) is `ray_version` and its Python
    version is `python_version`, to the patch (to the minor where ``RAY_DEFAULT_PYTHON_VERSION_MATCH_LEVEL`` is
    "minor"): what ``ray.init`` requires, and would refuse only after connecting."""
    theirs, their_python = head.get("ray_version"), head.get("python_version")
    if not theirs or not their_python:
        raise FeaturelabError(
            f"the Ray cluster at {address} does not state its Ray and Python versions; check that the address is "
            "a Ray head's (`ray status` on the head prints it)"
        )
    level = 2 if os.environ.get("RAY_DEFAULT_PYTHON_VERSION_MATCH_LEVEL") == "minor" else 3
    if theirs == ray_version and their_python.split(".")[:level] == python_version.split(".")[:level]:
        return
    raise FeaturelabError(
        f"the Ray cluster at {address} runs Ray {theirs} on Python {their_python}, this process Ray {ray_version} on "
        f"Python {python_version}: Ray needs the same on both ends; install ray=={theirs} on Python {their_python} "
        f"here, or start the cluster with Ray {ray_version} on Python {python_version}"
    )


def handshake(address: str, timeout: float = CONNECT_TIMEOUT) -> dict:
    """The cluster metadata of the Ray head at `address` (``HOST:PORT`` of its GCS, or ``ray://HOST:PORT`` of
    a Ray Client server), proven within `timeout` seconds in all: it answers as a gRPC server (`probe`), accepts
    Ray's token (`auth_token`) and, for a GCS, runs this process's Ray and Python versions (`check_versions`;
    a Ray Client server checks them itself when Ray connects). Each failure is one line naming the address and
    the fix. "auto" and "local" are not asked ({})."""
    if address in ("auto", "local"):
        return {}
    ray = _ray()
    deadline = time.monotonic() + timeout
    probe(address, timeout)
    head = ask_head(address, deadline, timeout)
    if not address.startswith("ray://"):
        check_versions(address, head, ray.__version__, platform.python_version())
    return head


def reachable(address: str | None = None) -> None:
    """A one-line error unless Ray is installed and the cluster at `address` (or ``RAY_ADDRESS``; none:
    a local instance) passes the `handshake`: checked before a run folder is written."""
    _ray()
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address is not None and not _ray().is_initialized():
        handshake(address)


def connect(address: str | None = None):
    """The `ray` module, initialised: an existing connection, else `address`, ``RAY_ADDRESS``, or a new
    local instance. A cluster address passes the `handshake` first, so a dead address, a missing token or
    another Ray version fails in seconds, not after ``ray.init``'s 20 s of retries."""
    ray = _ray()
    if not ray.is_initialized():
        address = address or os.environ.get("RAY_ADDRESS") or None
        if address is not None:
            handshake(address)
        try:
            ray.init(
                address=address,
                log_to_driver=False,
                include_dashboard=False,
                configure_logging=False,
            )
        except Exception as exc:
            text = " ".join(str(exc).split())
            auth = (
                " (authentication failed: check RAY_AUTH_TOKEN / the cluster's token)" if "auth" in text.lower() else ""
            )
            raise FeaturelabError(
                f"could not connect to a Ray cluster at address={address!r}{auth}: {type(exc).__name__}: {text[:300]}"
            ) from None
    return ray


def pack(folder: Path) -> dict[str, bytes]:
    """Every file under `folder` as {relative path: bytes} (empty when the folder does not exist)."""
    folder = Path(folder)
    if not folder.exists():
        return {}
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def unpack(files: dict[str, bytes], folder: Path) -> None:
    """Write `files` into `folder` atomically, ``result.json`` last (it marks the unit finished)."""
    for rel in sorted(files, key=lambda r: r == "result.json"):
        write_bytes(Path(folder) / rel, files[rel])


SCRATCH = "featurelab-ray-"  # a task's scratch folder: SCRATCH + its process id + "-" + a random tail


def remove_orphans(parent: Path) -> None:
    """Remove the scratch folders in `parent` of tasks whose process is gone (a killed worker leaves them)."""
    import shutil

    for folder in parent.glob(f"{SCRATCH}*-*"):
        pid = folder.name[len(SCRATCH) :].partition("-")[0]
        if pid.isdigit() and not os.path.exists(f"/proc/{pid}") and os.path.exists("/proc"):
            shutil.rmtree(folder, ignore_errors=True)


def run_remote(item: WorkItem, files_in: list[dict[str, bytes]]):
    """The task body: run the item in a scratch folder (the orphans of killed tasks removed first); return
    its outcomes and the files written."""
    remove_orphans(Path(tempfile.gettempdir()))
    with tempfile.TemporaryDirectory(prefix=f"{SCRATCH}{os.getpid()}-") as tmp:
        folders = [Path(tmp) / u["id"] for u in item.units]
        for folder, files in zip(folders, files_in):
            unpack(files, folder)
        outcomes = execute(item.with_folders(folders))
        return outcomes, [pack(f) for f in folders]


def run_items(items: list[WorkItem], run_dir: Path, record, *, address: str | None, retries: int, threads: int) -> None:
    """Submit each work item as a Ray task with `retries` retries; write each finished item's files
    under `run_dir` and pass its outcomes to `record`. An item whose task still fails is recorded as
    failed for each of its units."""
    ray = connect(address)
    device = items[0].device if items else "cpu"
    task = ray.remote(run_remote).options(
        max_retries=retries, num_cpus=threads, num_gpus=1 if str(device).startswith("cuda") else 0
    )
    refs = {}
    for item in items:
        ref = task.remote(item, [pack(Path(f)) for f in item.folders])
        refs[ref] = (item.units, item.folders)
    waiting = list(refs)
    while waiting:
        done, waiting = ray.wait(waiting, num_returns=1)
        units, folders = refs[done[0]]
        try:
            outcomes, files = ray.get(done[0])
        except BuildError as exc:  # a unit's build raised (Ray's error subclasses it): no retry mends it
            raise BuildError(str(getattr(exc, "cause", exc))) from None
        except Exception as exc:  # the task failed (its worker or node died, or the cluster went away)
            msg = (str(exc).strip().splitlines() or [""])[0]
            why = f"ray task failed: {type(exc).__name__}: {msg} (Ray retries a task whose worker dies {retries} times)"
            record([UnitOutcome(u["id"], None, why, 0.0) for u in units])
        else:
            for folder, fs in zip(folders, files):
                unpack(fs, Path(folder))
            record(outcomes)
