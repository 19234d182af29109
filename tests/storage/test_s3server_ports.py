"""The local S3 server's ports (infra/s3server.py): no port is another one's gRPC port."""

from __future__ import annotations

import pytest

from infra import s3server


class _Socket:
    """A socket whose ``bind(("127.0.0.1", 0))`` hands out the next port of a fixed list."""

    offers: list[int] = []

    def __enter__(self) -> _Socket:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def bind(self, addr: tuple[str, int]) -> None:
        self.port = _Socket.offers.pop(0) if addr[1] == 0 else addr[1]

    def getsockname(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)


def test_no_picked_port_is_the_grpc_port_of_another(monkeypatch: pytest.MonkeyPatch) -> None:
    # The fresh-clone CI's weed refused its S3 port 51797: its master had 41797, whose gRPC
    # port is 51797 ("reserved for gRPC calculation"), and every test of test_s3_store erred.
    # 31797 is refused too: its gRPC port would be the master's.
    _Socket.offers = [41797, 51797, 31797, 41798, 41799, 41800, 41801]
    monkeypatch.setattr(s3server.socket, "socket", lambda *a, **k: _Socket())
    monkeypatch.setattr(s3server, "_port_pair_free", lambda port, **_: True)
    ports = s3server.free_ports(5)
    assert ports == [41797, 41798, 41799, 41800, 41801]
    grpc = {p + 10000 for p in ports}
    assert not grpc & set(ports)
