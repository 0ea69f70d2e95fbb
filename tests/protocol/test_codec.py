import msgpack
import pytest

from cluster.protocol import messages as m
from cluster.protocol.codec import Codec
from cluster.protocol.messages import MalformedMessage, Message

SECRET = b"s" * 32


def test_round_trip_with_correlation_id_and_payload():
    codec = Codec(SECRET)
    msg = m.UpdateTaskExecutionState("job", "exec", "FAILED", "Traceback ...", {"records-in": 3})
    decoded, cid, payload = codec.decode(codec.encode(msg, 7, [b"arrow-bytes"]))
    assert decoded == msg and cid == 7 and [bytes(p) for p in payload] == [b"arrow-bytes"]


def test_every_message_type_round_trips_through_its_registry():
    assert len(Message.registry) >= 25
    for op, cls in Message.registry.items():
        assert cls.op == op and op == op.lower() and " " not in op


def test_wrong_secret_is_refused():
    frames = Codec(b"x" * 32).encode(m.ListJobs())
    with pytest.raises(MalformedMessage, match="signature"):
        Codec(SECRET).decode(frames)


def test_tampered_payload_is_refused():
    codec = Codec(SECRET)
    frames = codec.encode(m.BufferResponse("c", 1), payload=[b"abc"])
    frames[-1] = b"abd"
    with pytest.raises(MalformedMessage):
        codec.decode(frames)


def test_frames_cannot_be_recut():
    codec = Codec(SECRET)
    mac, header, payload = codec.encode(m.BufferResponse("c", 1), payload=[b"abc"])
    with pytest.raises(MalformedMessage):
        codec.decode([mac, header + payload[:1], payload[1:]])


@pytest.mark.parametrize("frames", [[], [b"x"], [b"garbage", b"more garbage"], [b"\x00" * 32, b"\x81"]])
def test_garbage_is_refused(frames):
    with pytest.raises(MalformedMessage):
        Codec(SECRET).decode(frames)


def _signed(wire) -> list:
    codec = Codec(SECRET)
    header = msgpack.packb(wire, use_bin_type=True)
    return [codec._mac([header]), header]


@pytest.mark.parametrize("wire,reason", [
    ({"op": "no-such-op"}, "unknown op"),
    ([1, 2, 3], "not a map"),
    ({"op": "cancel-job"}, "missing fields"),
    ({"op": "cancel-job", "job_id": "a", "extra": 1}, "unexpected"),
    ({"op": "cancel-job", "job_id": 5}, "job_id"),
    ({"op": "register-task-manager", "task_manager_id": "t", "data_address": "a", "number_of_slots": True,
      "pid": 1, "hardware": {}}, "number_of_slots"),
    ({"op": "heartbeat-from-task-manager", "task_manager_id": "t", "tasks": [1]}, "tasks"),
])
def test_authenticated_but_malformed_messages_are_refused(wire, reason):
    with pytest.raises(MalformedMessage, match=reason):
        Codec(SECRET).decode(_signed(wire))


def test_optional_fields_accept_none():
    msg, _, _ = Codec(SECRET).decode(_signed({"op": "submit-job", "job_graph": {}, "result_address": None}))
    assert msg == m.SubmitJob({}, None)
