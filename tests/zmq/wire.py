"""The engine wire protocol (docs/engine-contract.md) in Python, for the
interop tests: one frame per message, a type byte then a msgpack array."""
import msgpack

HELLO, ERROR, HEARTBEAT = 0x01, 0x02, 0x03
SUBMIT, CANCEL = 0x10, 0x11
READINESS, REPORT = 0x20, 0x21
CHUNK, ANSWER, REFUSAL = 0x30, 0x31, 0x32

NO_ROOM, INVALID_REQUEST, INFERENCE_FAILED, DEADLINE = 1, 2, 3, 4
NOT_READY, READY, FAILED = 0, 1, 2


def encode(kind, *fields):
    return bytes([kind]) + msgpack.packb(list(fields), use_bin_type=True)


def decode(frame):
    return frame[0], msgpack.unpackb(frame[1:], raw=False)
