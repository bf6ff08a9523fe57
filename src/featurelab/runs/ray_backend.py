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
"""

from __future__ import annotations

import os
import socket
import tempfile
from pathlib import Path

from ..errors import FeaturelabError
from ..io import write_bytes
from .work import BuildError, UnitOutcome, WorkItem, execute

CONNECT_TIMEOUT = 10.0  # seconds to wait for a Ray cluster's head to accept a connection


def _ray():
    try:
        import ray
    except ImportError:
        raise FeaturelabError('backend="ray" needs the optional Ray extra: pip install "featlab[ray]"') from None
    return ray


HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])  # + an empty SETTINGS frame


def probe(address: str, timeout: float = CONNECT_TIMEOUT) -> None:
    """A one-line error unless a gRPC server (a Ray head's GCS or client server) answers at `address`
    (``HOST:PORT``, or ``ray://HOST:PORT``) within `timeout` seconds: it must accept the connection and answer
    the HTTP/2 client preface with a SETTINGS frame (RFC 9113 §3.4), which another service (a web or SSH
    server, a silent port) does not; "auto" and "local" are not probed."""
    if address in ("auto", "local"):
        return
    hostport = address.split("://", 1)[-1]
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit():
        raise FeaturelabError(f"address={address!r} is not allowed: give HOST:PORT of the Ray cluster's head")
    try:
        conn = socket.create_connection((host.strip("[]"), int(port)), timeout=timeout)
    except OSError as exc:
        cause = exc.strerror or type(exc).__name__
        raise FeaturelabError(
            f"could not connect to the Ray cluster at {address} within {timeout:g} s ({cause}); "
            "start it (`ray start --head`) or check the address"
        ) from None
    with conn:
        try:
            conn.sendall(HTTP2_PREFACE)
            frame = conn.recv(9)
        except OSError:  # silent, or closed on us
            frame = b""
    if len(frame) < 9 or frame[3] != 4:  # a frame header: 3 bytes length, 1 byte type (4: SETTINGS)
        raise FeaturelabError(
            f"the service at {address} is not a Ray cluster's head (it does not answer as a gRPC server); "
            "check the address and port (`ray status` on the head prints it)"
        )


def reachable(address: str | None = None) -> None:
    """A one-line error unless Ray is installed and the cluster at `address` (or ``RAY_ADDRESS``; none:
    a local instance) accepts connections: checked before a run folder is written."""
    _ray()
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address is not None and not _ray().is_initialized():
        probe(address)


def connect(address: str | None = None):
    """The `ray` module, initialised: an existing connection, else `address`, ``RAY_ADDRESS``, or a new
    local instance. A cluster address is probed first, so a dead address fails in seconds, not minutes."""
    ray = _ray()
    if not ray.is_initialized():
        address = address or os.environ.get("RAY_ADDRESS") or None
        if address is not None:
            probe(address)
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
