"""A minimal engine worker on libzmq (pyzmq): binds a ROUTER at argv[1] and
answers by body: b"refuse" -> no room, b"stream" -> two SSE chunks then the
final answer, anything else -> echoed as JSON. Its hello carries a field
this protocol version does not define, which napd must skip."""
import sys

import zmq

from wire import (ANSWER, CHUNK, HEARTBEAT, HELLO, NO_ROOM, READINESS, READY,
                  REFUSAL, REPORT, SUBMIT, decode, encode)

sock = zmq.Context().socket(zmq.ROUTER)
sock.bind(sys.argv[1])
while True:
    peer, frame = sock.recv_multipart()
    kind, fields = decode(frame)
    send = lambda payload: sock.send_multipart([peer, payload])
    if kind == HELLO:
        send(encode(HELLO, 1, 1, "python-worker", 0, 0, "a field from the future"))
        send(encode(READINESS, READY, "", 0))
    elif kind == HEARTBEAT:
        send(encode(READINESS, READY, "", fields[0]))
        send(encode(REPORT, 7, None, None))
    elif kind == SUBMIT:
        rid, _deadline, _ctype, body = fields[:4]
        if body == b"refuse":
            send(encode(REFUSAL, rid, NO_ROOM, 'python says "no room"'))
        elif body == b"stream":
            send(encode(CHUNK, rid, "text/event-stream", b"data: a\n\n"))
            send(encode(CHUNK, rid, "", b"data: b\n\n"))
            send(encode(ANSWER, rid, "", b"data: [DONE]\n\n"))
        else:
            send(encode(ANSWER, rid, "application/json", b'{"echo":"' + body + b'"}'))
