#!/usr/bin/env python3
"""A TCP proxy that behaves like a link: a one-way delay each way and a bandwidth cap, for
measuring the mount as people reach their store (this kernel has no netem).

  scripts/linkproxy.py --listen 127.0.0.1:PORT --upstream 127.0.0.1:PORT --rtt-ms 50 --mbit 100

Model: each direction is a link of RATE bytes/s with a one-way delay of RTT/2, shared by all
connections through the proxy (parallel connections do not multiply the bandwidth). A chunk read at
time t starts out once the link is free (after the chunks before it), takes len/RATE to send,
and arrives RTT/2 later; the other side gets it then, in order. What is in flight is bounded
(twice the bandwidth-delay product, at least 256 KiB), so a fast sender is held back by TCP as
on a real link. Connection setup costs one round trip (the connect waits RTT before the first
byte goes either way), as a TCP handshake over the link would.

Used by scripts/bench link and follow (importable: `start(listen, upstream, rtt_ms, mbit)` runs
it in a thread of the calling process and returns the listening address).
"""

import argparse
import asyncio
import collections
import threading
import time

CHUNK = 64 * 1024


class Wire:
    """One way of the link, shared by every connection through the proxy: the time it frees
    (parallel connections share its bandwidth, as on a real link)."""

    def __init__(self):
        self.free_at = 0.0


class Direction:
    """One way of a connection: a queue of (arrival time, bytes) over its wire."""

    def __init__(self, delay, rate, limit, wire):
        self.delay, self.rate, self.limit, self.wire = delay, rate, limit, wire
        self.queue = collections.deque()
        self.bytes = 0
        self.ready = asyncio.Event()
        self.room = asyncio.Event()
        self.room.set()
        self.closed = False

    def push(self, data):
        now = time.monotonic()
        start = max(now, self.wire.free_at)
        self.wire.free_at = start + len(data) / self.rate
        self.queue.append((self.wire.free_at + self.delay, data))
        self.bytes += len(data)
        if self.bytes >= self.limit:
            self.room.clear()
        self.ready.set()


async def pump_in(reader, d):
    """Reads one side into the link."""
    try:
        while True:
            await d.room.wait()
            data = await reader.read(CHUNK)
            if not data:
                break
            d.push(data)
    except (ConnectionError, OSError):
        pass
    d.closed = True
    d.ready.set()


async def pump_out(writer, d):
    """Delivers what arrives at the other side, at its arrival time."""
    try:
        while True:
            if not d.queue:
                if d.closed:
                    break
                d.ready.clear()
                await d.ready.wait()
                continue
            at, data = d.queue[0]
            wait = at - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            d.queue.popleft()
            d.bytes -= len(data)
            if d.bytes < d.limit:
                d.room.set()
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        pass


async def handle(client_r, client_w, upstream, delay, rate, wires):
    host, port = upstream.rsplit(":", 1)
    try:
        # The handshake's round trip.
        await asyncio.sleep(2 * delay)
        server_r, server_w = await asyncio.open_connection(host, int(port))
    except OSError:
        client_w.close()
        return
    limit = max(256 * 1024, int(2 * rate * 2 * delay))
    up, down = (Direction(delay, rate, limit, w) for w in wires)
    await asyncio.gather(
        pump_in(client_r, up), pump_out(server_w, up),
        pump_in(server_r, down), pump_out(client_w, down),
    )
    for w in (client_w, server_w):
        try:
            w.close()
        except OSError:
            pass


async def serve(listen, upstream, rtt_ms, mbit, started=None):
    delay = rtt_ms / 2000.0
    rate = mbit * 1e6 / 8
    host, port = listen.rsplit(":", 1)
    wires = (Wire(), Wire())
    server = await asyncio.start_server(
        lambda r, w: handle(r, w, upstream, delay, rate, wires), host, int(port))
    if started is not None:
        started(server.sockets[0].getsockname())
    async with server:
        await server.serve_forever()


def start(listen, upstream, rtt_ms, mbit):
    """Runs the proxy in a daemon thread; returns (host, port) it listens on."""
    got = {}
    ready = threading.Event()

    def run():
        def started(addr):
            got["addr"] = addr
            ready.set()
        asyncio.run(serve(listen, upstream, rtt_ms, mbit, started))

    threading.Thread(target=run, daemon=True).start()
    if not ready.wait(10):
        raise RuntimeError("the link proxy did not start")
    return got["addr"][0], got["addr"][1]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--listen", required=True, help="HOST:PORT to listen on (port 0: any)")
    p.add_argument("--upstream", required=True, help="HOST:PORT to forward to")
    p.add_argument("--rtt-ms", type=float, default=50.0, help="round trip time [50]")
    p.add_argument("--mbit", type=float, default=100.0, help="bandwidth each way [100]")
    a = p.parse_args()

    def started(addr):
        print("listening on %s:%d" % (addr[0], addr[1]), flush=True)
    asyncio.run(serve(a.listen, a.upstream, a.rtt_ms, a.mbit, started))


if __name__ == "__main__":
    main()
