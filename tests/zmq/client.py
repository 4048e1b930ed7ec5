"""A napd-side peer on libzmq (pyzmq) driving a Go engine.Serve worker at
argv[1]: handshake, answer, refusal, stream, heartbeat. Exits non-zero with
a message on the first surprise."""
import sys

import zmq

from wire import (ANSWER, CHUNK, HEARTBEAT, HELLO, INVALID_REQUEST, READINESS,
                  READY, REFUSAL, SUBMIT, decode, encode)

sock = zmq.Context().socket(zmq.DEALER)
sock.setsockopt(zmq.IDENTITY, b"python-napd")
sock.setsockopt(zmq.RCVTIMEO, 5000)
sock.setsockopt(zmq.LINGER, 0)
sock.connect(sys.argv[1])


def expect(want):
    kind, fields = decode(sock.recv())
    if kind != want:
        sys.exit("want message 0x%02x, got 0x%02x %r" % (want, kind, fields))
    return fields


# A hello with a trailing field this version does not define.
sock.send(encode(HELLO, 1, 1, "python-napd", 1000, 0, "extra"))
hello = expect(HELLO)
assert hello[0] <= 1 <= hello[1], hello
ready = expect(READINESS)
assert ready[0] == READY, ready

sock.send(encode(SUBMIT, 1, 0, "application/json", b"hello"))
answer = expect(ANSWER)
assert answer[0] == 1 and answer[2] == b"hello" and answer[1] == "text/plain", answer

sock.send(encode(SUBMIT, 2, 0, "", b"refuse"))
refusal = expect(REFUSAL)
assert refusal[0] == 2 and refusal[1] == INVALID_REQUEST and refusal[2] == "go says no", refusal

sock.send(encode(SUBMIT, 3, 0, "", b"stream"))
data = b""
c = expect(CHUNK)
assert c[1] == "text/event-stream", c
data += c[2]
data += expect(CHUNK)[2]
data += expect(ANSWER)[2]
assert data == b"data: a\n\ndata: b\n\ndata: [DONE]\n\n", data

sock.send(encode(HEARTBEAT, 9))
ready = expect(READINESS)
assert ready[2] == 9, ready
print("ok")
