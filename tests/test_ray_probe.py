"""The handshake before a Ray run (`featurelab.runs.ray_backend.handshake`), against fake heads on 127.0.0.1: a
TCP server that answers the HTTP/2 client preface or not, and gRPC servers that serve a Ray GCS's key-value
read and a Ray Client server's PING the way Ray's do, checking the ``authorization`` metadata like a head
started with ``RAY_AUTH_MODE=token`` (status UNAUTHENTICATED otherwise). Every refusal is one line naming the
address and the fix, within the handshake's time bound, including against a head that never answers. The
`ray` module is faked where Ray is not installed; the wire encoding is checked against Ray's own protobuf
classes where it is. A task's scratch folder is removed when it returns or raises, and those of killed tasks by
the next task."""

import json
import os
import pathlib
import socket
import subprocess
import sys
import threading
import time
import types

import pytest

from featurelab.cli import main
from featurelab.errors import FeaturelabError
from featurelab.runs.ray_backend import (
    CLUSTER_INFO,
    KV_GET,
    SCRATCH,
    handshake,
    pb_fields,
    pb_message,
    probe,
    remove_orphans,
)

SETTINGS = bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])  # an empty SETTINGS frame: length 0, type 4, flags 0, stream 0
VERSIONS = {"ray_version": "2.60.0", "python_version": "3.11.7", "os": "linux"}
# InternalKVGetRequest{key: "CLUSTER_METADATA", namespace: "cluster"} written out by hand: field 1 (tag 0x0a),
# 16 bytes; field 2 (tag 0x12), 7 bytes
KV_REQUEST = b"\x0a\x10CLUSTER_METADATA\x12\x07cluster"


def serve(reply: bytes | None) -> int:
    """A one-connection server on a free port that reads the client's bytes, then sends `reply` (None: nothing)."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def once():
        conn, _ = server.accept()
        with conn, server:
            try:
                conn.recv(1024)
                if reply is not None:
                    conn.sendall(reply)
                conn.recv(1024)  # until the client closes
            except OSError:  # the client gave up first
                pass

    threading.Thread(target=once, daemon=True).start()
    return port


def test_a_grpc_server_answers_the_handshake():
    probe(f"127.0.0.1:{serve(SETTINGS)}", timeout=5)


@pytest.mark.parametrize("reply", [None, b"SSH-2.0-OpenSSH_9.6\r\n", b"HTTP/1.1 400 Bad Request\r\n\r\n"])
def test_another_service_or_a_silent_port_is_one_line(reply):
    port = serve(reply)
    t0 = time.monotonic()
    with pytest.raises(FeaturelabError, match=f"the service at 127.0.0.1:{port} is not a Ray cluster's head"):
        probe(f"127.0.0.1:{port}", timeout=1)
    assert time.monotonic() - t0 < 1.5  # the silent port: the connection and the wait share the one second


@pytest.mark.parametrize("address", ["127.0.0.1", "127.0.0.1:port", ":6379", "ray://127.0.0.1"])
def test_an_address_that_is_not_host_port_is_one_line(address):
    with pytest.raises(FeaturelabError, match=f"address={address!r} is not allowed: give HOST:PORT"):
        probe(address)


@pytest.fixture
def fake_ray(monkeypatch):
    """A `ray` module of version 2.60.0, not initialised, and no token in the environment or the home folder."""
    module = types.ModuleType("ray")
    module.__dict__.update(__version__="2.60.0", is_initialized=lambda: False)
    monkeypatch.setitem(sys.modules, "ray", module)
    for name in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_ADDRESS", "RAY_DEFAULT_PYTHON_VERSION_MATCH_LEVEL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr("pathlib.Path.home", staticmethod(lambda: pathlib.Path("/nonexistent-home")))
    monkeypatch.setattr("platform.python_version", lambda: "3.11.7")
    return module


@pytest.fixture
def head():
    """`start(token=None, versions=VERSIONS, hang=False, methods=True)`: a gRPC server on 127.0.0.1 serving a
    GCS's InternalKVGet (the cluster metadata `versions`) and a Ray Client server's ClusterInfo; with `token`,
    a call without ``authorization: Bearer <token>`` ends UNAUTHENTICATED; with `hang`, no call is ever
    answered; without `methods`, it serves nothing (UNIMPLEMENTED). Returns its address and the requests."""
    grpc = pytest.importorskip("grpc")
    from concurrent.futures import ThreadPoolExecutor

    servers, release = [], threading.Event()

    def start(token=None, versions=VERSIONS, hang=False, methods=True):
        requests = []

        def answer(request, context, reply):
            if hang:
                release.wait(60)
            if token and dict(context.invocation_metadata()).get("authorization") != f"Bearer {token}":
                context.abort(grpc.StatusCode.UNAUTHENTICATED, "InvalidAuthToken: Authentication token is missing")
            requests.append(request)
            return reply

        value = json.dumps(versions).encode()
        kv_reply = b"\x0a\x00\x12" + bytes([len(value)]) + value  # status {} (OK), value: the JSON (< 128 bytes)
        info_reply = b"\x08\x06\x12\x02{}"  # ClusterInfoResponse{type: PING, json: "{}"}
        handlers = {
            KV_GET: lambda r, c: answer(r, c, kv_reply),
            CLUSTER_INFO: lambda r, c: answer(r, c, info_reply),
        }
        server = grpc.server(ThreadPoolExecutor(max_workers=4))
        for path, fn in handlers.items() if methods else ():
            service, method = path.strip("/").split("/")
            rpc = grpc.unary_unary_rpc_method_handler(fn)  # bytes in, bytes out
            server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, {method: rpc}),))
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        servers.append(server)
        return f"127.0.0.1:{port}", requests

    yield start
    release.set()
    for server in servers:
        server.stop(0)


def refused(address: str, timeout: float = 5.0) -> tuple[str, float]:
    """The handshake's one line for `address` and the seconds it took."""
    t0 = time.monotonic()
    with pytest.raises(FeaturelabError) as exc:
        handshake(address, timeout)
    return str(exc.value), time.monotonic() - t0


def test_the_handshake_reads_the_heads_versions_with_the_token(fake_ray, head, monkeypatch, tmp_path):
    address, requests = head(token="s3cret")
    monkeypatch.setenv("RAY_AUTH_TOKEN", "s3cret")
    assert handshake(address) == VERSIONS
    assert requests == [KV_REQUEST]
    monkeypatch.delenv("RAY_AUTH_TOKEN")
    (tmp_path / "token").write_text("s3cret\n")  # a token file, its newline stripped as Ray does
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(tmp_path / "token"))
    assert handshake(address) == VERSIONS
    monkeypatch.delenv("RAY_AUTH_TOKEN_PATH")
    (tmp_path / ".ray").mkdir()
    (tmp_path / ".ray" / "auth_token").write_text("s3cret")  # Ray's default place
    monkeypatch.setattr("pathlib.Path.home", staticmethod(lambda: tmp_path))
    assert handshake(address) == VERSIONS


def test_a_missing_or_refused_token_is_one_line_at_once(fake_ray, head, monkeypatch, tmp_path):
    address, requests = head(token="s3cret")
    line, seconds = refused(address)
    assert line == (
        f"the Ray cluster at {address} requires token authentication and this process has no token: set "
        "RAY_AUTH_TOKEN (or RAY_AUTH_TOKEN_PATH) to the cluster's token (`ray get-auth-token` on the head prints it)"
    )
    assert seconds < 2 and requests == []
    monkeypatch.setenv("RAY_AUTH_TOKEN", "wrong")
    line, seconds = refused(address)
    assert f"the Ray cluster at {address} refused the token from RAY_AUTH_TOKEN: use the cluster's token" in line
    assert seconds < 2
    monkeypatch.delenv("RAY_AUTH_TOKEN")
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(tmp_path / "absent"))
    assert "RAY_AUTH_TOKEN_PATH=" in refused(address)[0] and "cannot be read (FileNotFoundError)" in refused(address)[0]
    (tmp_path / "empty").write_text("\n")
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(tmp_path / "empty"))
    assert "names an empty file" in refused(address)[0]


@pytest.mark.parametrize(
    "versions, theirs",
    [
        ({"ray_version": "2.59.0", "python_version": "3.11.7"}, "Ray 2.59.0 on Python 3.11.7"),
        ({"ray_version": "2.60.0", "python_version": "3.11.9"}, "Ray 2.60.0 on Python 3.11.9"),
    ],
)
def test_another_ray_or_python_version_on_the_head_is_one_line(fake_ray, head, monkeypatch, versions, theirs):
    address, _ = head(versions=versions)
    line, _ = refused(address)
    assert line.startswith(f"the Ray cluster at {address} runs {theirs}, this process Ray 2.60.0 on Python 3.11.7")
    assert f"install ray=={versions['ray_version']} on Python {versions['python_version']} here" in line
    if versions["python_version"] != "3.11.7":  # Ray's own setting lets the patch level differ
        monkeypatch.setenv("RAY_DEFAULT_PYTHON_VERSION_MATCH_LEVEL", "minor")
        assert handshake(address) == versions


def test_a_head_that_never_answers_is_refused_within_the_time_bound(fake_ray, head):
    address, _ = head(hang=True)
    line, seconds = refused(address, timeout=1.0)
    assert line.startswith(f"the Ray cluster at {address} accepted the connection but did not answer within 1 s")
    assert 0.9 < seconds < 2.0


def test_a_grpc_server_that_is_no_ray_head_and_a_head_without_versions(fake_ray, head):
    address, _ = head(methods=False)
    assert refused(address)[0].startswith(f"the gRPC server at {address} is not a Ray cluster's head")
    assert refused(f"ray://{address}")[0].startswith(f"the gRPC server at ray://{address} is not a Ray Client server")
    address, _ = head(versions={})
    assert refused(address)[0].startswith(f"the Ray cluster at {address} does not state its Ray and Python versions")


def test_a_ray_client_server_is_asked_its_ping(fake_ray, head, monkeypatch):
    address, requests = head(token="s3cret")
    assert "requires token authentication" in refused(f"ray://{address}")[0]
    monkeypatch.setenv("RAY_AUTH_TOKEN", "s3cret")
    assert handshake(f"ray://{address}") == {} and requests == [b"\x08\x06"]  # ClusterInfoRequest{type: PING}


def test_a_refused_handshake_writes_no_run_folder(fake_ray, head, tmp_path, capsys):
    address, _ = head(token="s3cret")
    argv = ["run", "leaky-bottleneck", "--preset", "tiny", "--backend", "ray", "--address", address]
    assert main(argv + ["--out", str(tmp_path / "run"), "--quiet"]) == 2
    assert "requires token authentication" in capsys.readouterr().err and not (tmp_path / "run").exists()


def test_the_wire_encoding_by_hand():
    """200 = 0b1_1001000: the varint 0xc8 0x01 (low 7 bits first, the high bit marking a byte to follow)."""
    message = b"\x12\xc8\x01" + b"x" * 200 + b"\x08\x96\x01"  # field 2: 200 bytes; field 1: the varint 150
    assert pb_message([(2, b"x" * 200), (1, 150)]) == message
    assert pb_fields(message) == {2: b"x" * 200, 1: 150}
    with pytest.raises(ValueError, match="past the end"):
        pb_fields(message[:-1])


def test_the_wire_encoding_matches_rays_protobuf_classes():
    pb = pytest.importorskip("ray.core.generated.gcs_service_pb2")
    client = pytest.importorskip("ray.core.generated.ray_client_pb2")
    request = pb.InternalKVGetRequest(key=b"CLUSTER_METADATA", namespace=b"cluster")
    assert pb_message([(1, b"CLUSTER_METADATA"), (2, b"cluster")]) == request.SerializeToString() == KV_REQUEST
    ping = client.ClusterInfoRequest(type=client.ClusterInfoType.PING)
    assert pb_message([(1, 6)]) == ping.SerializeToString()
    value = json.dumps(VERSIONS).encode() * 3  # longer than 127 bytes: a two-byte length
    reply = pb.InternalKVGetReply(value=value)
    reply.status.code, reply.status.message = 17, "not found"
    assert pb_fields(reply.SerializeToString()) == {1: reply.status.SerializeToString(), 2: value}


@pytest.mark.skipif(not os.path.exists("/proc"), reason="reads /proc")
def test_scratch_folders_of_killed_tasks_are_removed(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    orphan, live = tmp_path / f"{SCRATCH}{dead.pid}-abc", tmp_path / f"{SCRATCH}{os.getpid()}-def"
    for folder in (orphan, live):
        (folder / "unit").mkdir(parents=True)
    remove_orphans(tmp_path)
    assert not orphan.exists() and live.exists()


@pytest.mark.parametrize("fails", [False, True])
def test_a_tasks_scratch_folder_is_removed_when_it_returns_or_raises(tmp_path, monkeypatch, fails):
    """`run_remote` unpacks the unit folders into its scratch folder, runs the item there and packs what it
    wrote; the folder is gone afterwards, also when the item raises."""
    from featurelab.runs import ray_backend

    seen = []

    def execute(item):
        folder = item.folders[0]
        seen.append(folder.parent)
        assert (folder / "checkpoint.bin").read_bytes() == b"resume me"  # what the driver sent in
        (folder / "result.json").write_text("{}")
        if fails:
            raise RuntimeError("the unit's own failure")
        return ["outcome"]

    item = types.SimpleNamespace(units=[{"id": "u"}], with_folders=lambda f: types.SimpleNamespace(folders=f))
    monkeypatch.setattr(ray_backend, "execute", execute)
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    if fails:
        with pytest.raises(RuntimeError):
            ray_backend.run_remote(item, [{"checkpoint.bin": b"resume me"}])  # type: ignore[arg-type]
    else:
        outcomes, files = ray_backend.run_remote(item, [{"checkpoint.bin": b"resume me"}])  # type: ignore[arg-type]
        assert outcomes == ["outcome"] and files == [{"checkpoint.bin": b"resume me", "result.json": b"{}"}]
    assert seen[0].name.startswith(f"{SCRATCH}{os.getpid()}-") and seen[0].parent == tmp_path
    assert list(tmp_path.iterdir()) == []
