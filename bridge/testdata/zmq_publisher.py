"""A KV-event publisher on real libzmq (pyzmq), for the bridge's interop test.

It behaves on the wire like vLLM's ZmqEventPublisher: a PUB socket sending
[topic, seq (8 bytes big-endian), payload], seq from 0; a ROUTER replay
socket answering [identity, "", start_seq] with [identity, "", seq, payload]
for every buffered batch with seq >= start_seq, then an end marker of seq -1
and an empty payload; a bounded buffer of the newest batches.

The test drives it over stdin, one command per line, and reads one line of
answer per command on stdout:
  pub HEX    publish payload HEX      -> "seq N"
  drop HEX   buffer HEX, skip the PUB -> "seq N"  (a PUB drop)
  quit                                -> exits
It first prints "pub ENDPOINT replay ENDPOINT" (bound to free ports).
"""

import collections
import sys

import zmq

END_SEQ = (-1).to_bytes(8, "big", signed=True)


def main() -> None:
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.bind("tcp://127.0.0.1:*")
    replay = ctx.socket(zmq.ROUTER)
    replay.bind("tcp://127.0.0.1:*")
    buffer = collections.deque(maxlen=int(sys.argv[1]) if len(sys.argv) > 1 else 10000)
    seq = 0
    print("pub", pub.getsockopt_string(zmq.LAST_ENDPOINT),
          "replay", replay.getsockopt_string(zmq.LAST_ENDPOINT), flush=True)

    poller = zmq.Poller()
    poller.register(replay, zmq.POLLIN)
    stdin_fd = sys.stdin.fileno()
    poller.register(stdin_fd, zmq.POLLIN)
    lines = _lines(stdin_fd)
    while True:
        events = dict(poller.poll())
        if replay in events:
            frames = replay.recv_multipart()
            if len(frames) == 3:
                ident, _, start = frames
                start_seq = int.from_bytes(start, "big")
                for s, payload in list(buffer):
                    if s >= start_seq:
                        replay.send_multipart((ident, b"", s.to_bytes(8, "big"), payload))
                replay.send_multipart((ident, b"", END_SEQ, b""))
        if stdin_fd in events:
            for line in next(lines):
                cmd, _, arg = line.partition(" ")
                if cmd == "quit":
                    return
                payload = bytes.fromhex(arg)
                buffer.append((seq, payload))
                if cmd == "pub":
                    pub.send_multipart((b"", seq.to_bytes(8, "big"), payload))
                print("seq", seq, flush=True)
                seq += 1


def _lines(fd):
    """Yield the complete lines available on fd at each call."""
    import os
    pending = b""
    while True:
        chunk = os.read(fd, 65536)
        if not chunk:
            yield ["quit"]
            continue
        pending += chunk
        *done, pending = pending.split(b"\n")
        yield [d.decode() for d in done if d]


if __name__ == "__main__":
    main()
