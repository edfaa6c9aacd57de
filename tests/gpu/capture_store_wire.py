"""Capture what an unmodified torch job sends to its TCPStore, for the coordinator's replay test.

Starts torch's own TCPStore server, a recording TCP proxy in front of it, and runs the given command with
MASTER_ADDR/MASTER_PORT pointing at the proxy and TORCHELASTIC_USE_AGENT_STORE=True (every rank a client, as
under prism-run). Each client connection's client->server bytes are written raw to <out>/conn<N>.bin
(N in accept order); the server->client bytes to <out>/conn<N>.reply.bin.

usage: capture_store_wire.py OUT_DIR WORLD_SIZE -- COMMAND...
"""
import os
import socket
import subprocess
import sys
import threading

from torch.distributed import TCPStore


def pump(src, dst, sink):
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            sink.write(data)
            sink.flush()
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def main():
    out, world = sys.argv[1], int(sys.argv[2])
    cmd = sys.argv[sys.argv.index("--") + 1:]
    os.makedirs(out, exist_ok=True)
    # The server side: torch's own store, hosted here so the job's rank 0 is a plain client.
    server = TCPStore("127.0.0.1", 0, world_size=None, is_master=True, wait_for_workers=False, use_libuv=True)
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    proxy_port = listener.getsockname()[1]
    count = [0]

    def accept_loop():
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", server.port))
            n = count[0]
            count[0] += 1
            up = open(os.path.join(out, f"conn{n}.bin"), "wb")
            down = open(os.path.join(out, f"conn{n}.reply.bin"), "wb")
            threading.Thread(target=pump, args=(client, upstream, up), daemon=True).start()
            threading.Thread(target=pump, args=(upstream, client, down), daemon=True).start()

    threading.Thread(target=accept_loop, daemon=True).start()
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(proxy_port),
               TORCHELASTIC_USE_AGENT_STORE="True")
    rc = subprocess.call(cmd, env=env)
    print(f"capture: {count[0]} connections, job exit {rc}")
    sys.exit(rc)


if __name__ == "__main__":
    main()
