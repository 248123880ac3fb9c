"""Malformed input from a raw socket closes that one connection with an AMQP error and harms
nothing else: the gateway keeps serving an SDK client opened before and one opened after."""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterator

import amqp_gateway_fixtures
import pytest
from amqp_gateway_fixtures import receive_n
from azure.servicebus import ServiceBusClient as SdkClient
from azure.servicebus import ServiceBusMessage

from raybus.amqp import GatewayHandle
from raybus.amqp._codec import Described, Symbol, UInt, ULong, encode
from raybus.amqp._frames import (
    AMQP_HEADER,
    SASL_HEADER,
    Performative,
    decode_body,
    described_list,
    frame,
    performative,
)

# The shared gateway fixtures (module-scoped gateway, SDK client, module namespace).
namespace = amqp_gateway_fixtures.namespace
gateway = amqp_gateway_fixtures.gateway
sdk = amqp_gateway_fixtures.sdk


class RawClient:
    """Just enough of an AMQP client to put chosen bytes on the wire."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)

    def read_exactly(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            if not chunk:
                raise EOFError(f"closed after {len(data)} of {n} bytes")
            data += chunk
        return data

    def read_frame(self) -> Performative:
        while True:
            size, doff, _kind, _channel = struct.unpack(">IBBH", self.read_exactly(8))
            body = self.read_exactly(size - 8)[doff * 4 - 8 :]
            if body:
                return decode_body(body)[0]

    def closed(self) -> bool:
        """Whether the gateway closed the socket (reads nothing more)."""
        try:
            while self.sock.recv(4096):
                pass
        except (ConnectionResetError, TimeoutError):
            return False
        return True

    def open(self) -> None:
        self.sock.sendall(SASL_HEADER)
        assert self.read_exactly(8) == SASL_HEADER
        assert self.read_frame().name == "sasl_mechanisms"
        init = performative("sasl_init", mechanism=Symbol("ANONYMOUS"))
        self.sock.sendall(frame(init, kind=1))
        assert self.read_frame().fields["code"] == 0
        self.sock.sendall(AMQP_HEADER)
        assert self.read_exactly(8) == AMQP_HEADER
        self.sock.sendall(frame(performative("open", container_id="raw")))
        assert self.read_frame().name == "open"

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def raw(gateway: GatewayHandle) -> Iterator[RawClient]:
    client = RawClient(gateway.port)
    try:
        yield client
    finally:
        client.close()


def _assert_close_with(raw: RawClient, condition: str) -> None:
    closing = raw.read_frame()
    assert closing.name == "close"
    error = closing.fields["error"]
    assert error.value[0] == condition
    assert raw.closed()


def test_a_foreign_protocol_header_gets_the_amqp_header_and_a_closed_socket(
    raw: RawClient,
) -> None:
    raw.sock.sendall(b"GET / HTTP/1.1\r\n\r\n")
    assert raw.read_exactly(8) == AMQP_HEADER
    assert raw.closed()


def test_an_unknown_constructor_closes_the_connection_with_decode_error(raw: RawClient) -> None:
    raw.open()
    raw.sock.sendall(frame(b"\xff\x00\x01"))
    _assert_close_with(raw, "amqp:decode-error")


def test_a_truncated_performative_closes_the_connection_with_decode_error(
    raw: RawClient,
) -> None:
    raw.open()
    body = performative(
        "begin", next_outgoing_id=UInt(0), incoming_window=UInt(10), outgoing_window=UInt(10)
    )
    raw.sock.sendall(frame(body[:-3]))
    _assert_close_with(raw, "amqp:decode-error")


def test_a_frame_over_max_frame_size_closes_the_connection(raw: RawClient) -> None:
    raw.open()
    raw.sock.sendall(struct.pack(">IBBH", 2**31, 2, 0, 0))
    _assert_close_with(raw, "amqp:decode-error")


def test_a_frame_cut_off_by_the_peer_is_dropped_quietly(raw: RawClient) -> None:
    raw.open()
    raw.sock.sendall(struct.pack(">IBBH", 100, 2, 0, 0) + b"\x00\x53")
    raw.sock.shutdown(socket.SHUT_WR)
    assert raw.closed()


def test_a_malformed_message_is_rejected_and_the_link_stays_usable(
    raw: RawClient, pooled_queue: str, sdk: SdkClient
) -> None:
    raw.open()
    raw.sock.sendall(
        frame(
            performative(
                "begin",
                next_outgoing_id=UInt(0),
                incoming_window=UInt(100),
                outgoing_window=UInt(100),
            )
        )
    )
    assert raw.read_frame().name == "begin"
    target = described_list("target", address=pooled_queue)
    raw.sock.sendall(
        frame(
            performative(
                "attach",
                name="raw-sender",
                handle=UInt(0),
                role=False,
                target=target,
                source=described_list("source", address="raw"),
                initial_delivery_count=UInt(0),
            )
        )
    )
    assert raw.read_frame().name == "attach"
    assert raw.read_frame().name == "flow"  # credit for us

    def transfer(delivery_id: int, payload: bytes) -> Performative:
        raw.sock.sendall(
            frame(
                performative(
                    "transfer",
                    handle=UInt(0),
                    delivery_id=UInt(delivery_id),
                    delivery_tag=bytes([delivery_id]),
                    message_format=UInt(0),
                    settled=False,
                )
                + payload
            )
        )
        outcome = raw.read_frame()
        assert outcome.name == "disposition" and outcome.fields["settled"] is True
        return outcome

    bad = transfer(0, b"\x00\x53\x75\xa0\xff")  # a data section whose size runs off the end
    state = bad.fields["state"]
    assert state.descriptor == 0x25  # rejected
    assert state.value[0].value[0] == "amqp:decode-error"
    good = encode(Described(ULong(0x75), b"fine"))
    assert transfer(1, good).fields["state"].descriptor == 0x24  # accepted
    with sdk.get_queue_receiver(pooled_queue, max_wait_time=3) as receiver:
        (msg,) = receiver.receive_messages(max_wait_time=3)
        assert b"".join(msg.body) == b"fine"
        receiver.complete_message(msg)


def test_other_connections_survive_malformed_ones(
    gateway: GatewayHandle, sdk: SdkClient, pooled_queue: str
) -> None:
    with sdk.get_queue_sender(pooled_queue) as sender:
        sender.send_messages(ServiceBusMessage("before"))
        for junk in (b"\x00" * 8, b"AMQP\x00\x01\x00\x00" + b"\xff" * 64, b"AMQP\x03\x01\x00\x00"):
            bad = RawClient(gateway.port)
            bad.sock.sendall(junk)
            bad.sock.shutdown(socket.SHUT_WR)
            assert bad.closed()
            bad.close()
        sender.send_messages(ServiceBusMessage("after"))  # the same connection still works
    fresh = SdkClient.from_connection_string(gateway.connection_string, retry_total=0)
    with fresh, fresh.get_queue_receiver(pooled_queue, max_wait_time=3) as receiver:
        got = receive_n(receiver, 2)
        assert [str(m) for m in got] == ["before", "after"]
        for m in got:
            receiver.complete_message(m)
