"""The handshake before a Ray run: the address must answer the HTTP/2 client preface with a SETTINGS frame, as
a Ray head's gRPC servers do; a silent port or another service is one line within the timeout. The scratch
folders of killed tasks are removed by the next task."""

import os
import socket
import subprocess
import sys
import threading

import pytest

from featurelab.errors import FeaturelabError
from featurelab.runs.ray_backend import SCRATCH, probe, remove_orphans

SETTINGS = bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])  # an empty SETTINGS frame: length 0, type 4, flags 0, stream 0


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
    with pytest.raises(FeaturelabError, match=f"the service at 127.0.0.1:{port} is not a Ray cluster's head"):
        probe(f"127.0.0.1:{port}", timeout=1)


@pytest.mark.skipif(not os.path.exists("/proc"), reason="reads /proc")
def test_scratch_folders_of_killed_tasks_are_removed(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    orphan, live = tmp_path / f"{SCRATCH}{dead.pid}-abc", tmp_path / f"{SCRATCH}{os.getpid()}-def"
    for folder in (orphan, live):
        (folder / "unit").mkdir(parents=True)
    remove_orphans(tmp_path)
    assert not orphan.exists() and live.exists()
