import enum
import itertools
import threading
import time

import msgpack
import pytest

from cluster.protocol import messages as m
from cluster.protocol.codec import Codec, ReplayedMessage, ReplayWindow
from cluster.protocol.messages import MalformedMessage, Message

SECRET = b"s" * 32


def test_round_trip_with_correlation_id_and_payload():
    codec = Codec(SECRET)
    msg = m.UpdateTaskExecutionState("job", "exec", "FAILED", "Traceback ...", {"records-in": 3})
    decoded, cid, payload = codec.decode(codec.encode(msg, 7, [b"arrow-bytes"]))
    assert decoded == msg and cid == 7 and [bytes(p) for p in payload] == [b"arrow-bytes"]


def _sample(annotation, name: str):
    """A value of a message field's declared type, unlike any default (so a field the codec
    drops or swaps shows)."""
    import typing
    from typing import Any
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Union:
        return _sample(next(a for a in args if a is not type(None)), name)
    if annotation is Any:
        return {"any": [name, 1]}
    if origin is list:
        return [_sample(args[0] if args else str, name), _sample(args[0] if args else str, name + "'")]
    if origin is dict or annotation is dict:
        return {name: [1, 2.5, None, "x"], "nested": {"k": b"\x00\xff".hex()}}
    if annotation is bool:
        return True
    if annotation is int:
        return 2**40 + len(name)
    if annotation is float:
        return 0.25 + len(name)
    if annotation is str:
        return f"{name}-\u00e9"
    if annotation is bytes:
        return name.encode() + b"\x00\xff"
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return list(annotation)[-1]
    raise AssertionError(f"no sample for a field of type {annotation}")


def test_every_message_type_round_trips_through_its_registry():
    from cluster.protocol.message_base import _field_types
    assert len(Message.registry) >= 25
    codec = Codec(SECRET)
    for cid, (op, cls) in enumerate(Message.registry.items(), start=1):
        assert cls.op == op and op == op.lower() and " " not in op
        msg = cls(**{name: _sample(annotation, name) for name, annotation in _field_types(cls).items()})
        decoded, got_cid, payload = codec.decode(codec.encode(msg, cid, [op.encode()]))
        assert type(decoded) is cls and decoded == msg, (op, msg, decoded)
        assert all(type(getattr(decoded, name)) is type(getattr(msg, name)) for name in _field_types(cls)), op
        assert got_cid == cid and [bytes(p) for p in payload] == [op.encode()], op


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


_sequence = itertools.count(1)


def _signed(wire, guard: bool = True) -> list:
    """Signed with the secret, bypassing encode's checks (but with a fresh replay guard)."""
    codec = Codec(SECRET)
    if guard and isinstance(wire, dict):
        wire = {**wire, "sid": b"t" * 16, "seq": next(_sequence), "ts": int(time.time() * 1000)}
    header = msgpack.packb(wire, use_bin_type=True)
    return [codec._mac([header]), header]


@pytest.mark.parametrize("wire,reason", [
    ({"op": "no-such-op"}, "unknown op"),
    ([1, 2, 3], "not a map"),
    ({"op": "cancel-job"}, "missing fields"),
    ({"op": "cancel-job", "job_id": "a", "extra": 1}, "unexpected"),
    ({"op": "cancel-job", "job_id": 5}, "job_id"),
    ({"op": "register-task-manager", "task_manager_id": "t", "data_address": "a", "number_of_slots": True,
      "pid": 1, "hardware": {}, "registration_id": "r", "spark": ""}, "number_of_slots"),
    ({"op": "heartbeat-from-task-manager", "task_manager_id": "t", "tasks": [1], "spark": ""}, "tasks"),
])
def test_authenticated_but_malformed_messages_are_refused(wire, reason):
    with pytest.raises(MalformedMessage, match=reason):
        Codec(SECRET).decode(_signed(wire))


def test_optional_fields_accept_none():
    msg, _, _ = Codec(SECRET).decode(_signed({"op": "submit-job", "job_graph": {}, "result_address": None}))
    assert msg == m.SubmitJob({}, None)


# --------------------------------------------------------------------------- replay guard
class Clock:
    def __init__(self, t: float = 1_000_000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_a_frame_is_accepted_once():
    codec = Codec(SECRET)
    frames = codec.encode(m.CancelJob("j"))
    assert codec.decode(frames)[0] == m.CancelJob("j")
    with pytest.raises(ReplayedMessage, match="sequence 1 after 1"):
        codec.decode(frames)


def test_a_replay_is_refused_by_another_codec_of_the_same_window_too():
    receiver = Codec(SECRET)
    frames = Codec(SECRET).encode(m.TriggerSavepoint("j", None, False))
    receiver.decode(frames)
    with pytest.raises(ReplayedMessage):
        receiver.for_socket().decode(frames)


def test_out_of_order_frames_of_one_sender_are_refused_and_later_ones_pass():
    sender, receiver = Codec(SECRET), Codec(SECRET)
    first, second, third = (sender.encode(m.CancelJob(str(i))) for i in range(3))
    receiver.decode(second)
    with pytest.raises(ReplayedMessage, match="sequence 1 after 2"):
        receiver.decode(first)
    assert receiver.decode(third)[0] == m.CancelJob("2")


def test_senders_are_independent_streams():
    sender, receiver = Codec(SECRET), Codec(SECRET)
    other = sender.for_socket()
    assert other.sender_id != sender.sender_id
    a1, b1, a2 = sender.encode(m.CancelJob("a")), other.encode(m.CancelJob("b")), sender.encode(m.CancelJob("a"))
    for frames in (a2, b1):
        receiver.decode(frames)
    with pytest.raises(ReplayedMessage):
        receiver.decode(a1)


def test_frames_older_than_the_window_are_refused_even_from_a_new_sender():
    clock = Clock()
    sender = Codec(SECRET, clock=clock)
    receiver = Codec(SECRET, window=ReplayWindow(60, clock=clock))
    old = sender.encode(m.CancelJob("j"))
    clock.t += 61
    with pytest.raises(ReplayedMessage, match="stale frame: signed 61.0 s ago"):
        receiver.decode(old)
    receiver.decode(sender.encode(m.CancelJob("j")))
    clock.t -= 2 * 61  # a sender clock far ahead of the receiver's
    with pytest.raises(ReplayedMessage, match="future"):
        receiver.decode(Codec(SECRET, clock=lambda: clock.t + 122).encode(m.CancelJob("j")))


def test_a_forgotten_sender_cannot_replay_within_the_window():
    clock = Clock()
    receiver = Codec(SECRET, window=ReplayWindow(60, max_senders=2, clock=clock))
    first = Codec(SECRET, clock=clock)
    captured = first.encode(m.CancelJob("j"))
    receiver.decode(captured)
    for _ in range(2):  # two newer senders push the first out of the bounded table
        clock.t += 1
        receiver.decode(Codec(SECRET, clock=clock).encode(m.ListJobs()))
    assert len(receiver.window) == 2
    with pytest.raises(ReplayedMessage, match="forgotten sender"):
        receiver.decode(captured)
    clock.t += 1
    receiver.decode(first.encode(m.ListJobs()))  # its fresh frames still pass


def test_a_frame_signed_before_the_receiver_existed_is_refused():
    # a leader that replaces a failed one never saw the frames sent to it: its floor refuses them
    clock = Clock()
    sender = Codec(SECRET, clock=clock)
    captured = sender.encode(m.TriggerSavepoint("j", None, False))
    clock.t += 7.5
    new_leader = Codec(SECRET, window=ReplayWindow(60, clock=clock))
    with pytest.raises(ReplayedMessage, match="signed 7.5 s before this receiver started"):
        new_leader.decode(captured)
    assert new_leader.decode(sender.encode(m.ListJobs()))[0] == m.ListJobs()  # its fresh frames pass
    assert new_leader.decode(Codec(SECRET, clock=clock).encode(m.ListJobs()))[0] == m.ListJobs()


@pytest.mark.parametrize("guard", [
    {}, {"sid": b"short", "seq": 1, "ts": 1}, {"sid": b"s" * 16, "seq": "1", "ts": 1},
    {"sid": b"s" * 16, "seq": 1, "ts": 1.5}])
def test_a_signed_frame_without_a_sound_guard_is_refused(guard):
    with pytest.raises(MalformedMessage, match="replay guard"):
        Codec(SECRET).decode(_signed({"op": "list-jobs", **guard}, guard=False))


def test_a_signed_but_malformed_frame_does_not_move_the_window():
    receiver = Codec(SECRET)
    sid, now = b"q" * 16, int(time.time() * 1000)
    with pytest.raises(MalformedMessage, match="unknown op"):
        receiver.decode(_signed({"op": "nope", "sid": sid, "seq": 5, "ts": now}, guard=False))
    receiver.decode(_signed({"op": "list-jobs", "sid": sid, "seq": 1, "ts": now}, guard=False))


def test_one_codec_encoding_on_many_threads_never_repeats_a_sequence():
    sender, receiver = Codec(SECRET), Codec(SECRET)
    frames: list = []

    def work():
        for _ in range(500):
            frames.append(sender.encode(m.ListJobs()))
    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seqs = [msgpack.unpackb(f[1])["seq"] for f in frames]
    assert len(set(seqs)) == 2000
    for f in sorted(frames, key=lambda f: msgpack.unpackb(f[1])["seq"]):
        receiver.decode(f)


def test_a_state_travels_as_its_name_and_arrives_as_the_enum_and_an_unknown_one_is_malformed():
    from cluster.protocol.states import ExecutionState, JobState
    codec = Codec(SECRET)
    status = m.JobStatus("job", "name", JobState.RESTARTING, 2, None, None)
    assert status.to_wire()["state"] == "RESTARTING"
    decoded, _, _ = codec.decode(codec.encode(status, 1))
    assert decoded.state is JobState.RESTARTING
    wire = m.UpdateTaskExecutionState("job", "exec", ExecutionState.RUNNING, None, {}).to_wire()
    with pytest.raises(MalformedMessage, match="'state'"):
        Message.from_wire(dict(wire, state="SLEEPING"))
