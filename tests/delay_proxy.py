"""A TCP proxy that delays what it relays, for the delay fault of tests/e2e/test_network_faults.py.

This kernel has no netem (CONFIG_NET_SCH_NETEM unset), so `tc qdisc ... netem delay 200ms` cannot
delay the data channels. Instead nftables redirects the channels' connections here (a nat rule in
the second host's namespace; the proxy finds where each was going with SO_ORIGINAL_DST), and every
chunk read from one side is written to the other ``delay`` seconds after it arrived, in order:
each direction of each connection is late by that much, as netem would make it. SIGUSR1 turns the
delay on, SIGUSR2 off; connections made before stay redirected, so the fault begins and ends on
live channels.

    ip netns exec NS python -m tests.delay_proxy --port 0 --delay-ms 200   # prints its port
"""
from __future__ import annotations

import argparse
import asyncio
import signal
import socket
import struct
import time

SO_ORIGINAL_DST = 80  # linux/netfilter_ipv4.h
MARK = 0x2A  # the proxy's own connections: the redirect rules let them through


class Delay:
    def __init__(self, seconds: float):
        self.seconds, self.on = seconds, False
        self.delayed = 0  # chunks read (and so relayed late) since the delay was last turned on

    def turn(self, on: bool) -> None:
        if on:
            self.delayed = 0
        else:  # what the test reads to know the fault delayed its channels
            print(f"delay off: {self.delayed} chunks delayed", flush=True)
        self.on = on


def original_destination(sock: socket.socket) -> tuple[str, int]:
    raw = sock.getsockopt(socket.SOL_IP, SO_ORIGINAL_DST, 16)
    port, packed = struct.unpack_from("!2xH4s", raw)
    return socket.inet_ntoa(packed), port


async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: Delay) -> None:
    queue: asyncio.Queue = asyncio.Queue()

    async def read() -> None:
        while chunk := await reader.read(65536):
            delay.delayed += delay.on
            await queue.put((time.monotonic() + (delay.seconds if delay.on else 0.0), chunk))
        await queue.put((0.0, b""))

    async def write() -> None:
        while True:
            due, chunk = await queue.get()
            if not chunk:
                break
            if (wait := due - time.monotonic()) > 0:
                await asyncio.sleep(wait)
            writer.write(chunk)
            await writer.drain()

    try:
        await asyncio.gather(read(), write())
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


async def serve(port: int, delay: Delay) -> None:
    async def accepted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        host, dport = original_destination(writer.get_extra_info("socket"))
        print(f"connection to {host}:{dport}", flush=True)
        upstream = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        upstream.setsockopt(socket.SOL_SOCKET, socket.SO_MARK, MARK)
        upstream.setblocking(False)
        try:
            await asyncio.get_running_loop().sock_connect(upstream, (host, dport))
            up_reader, up_writer = await asyncio.open_connection(sock=upstream)
        except OSError:
            upstream.close()
            writer.close()
            return
        await asyncio.gather(relay(reader, up_writer, delay), relay(up_reader, writer, delay))

    server = await asyncio.start_server(accepted, "0.0.0.0", port)
    port = server.sockets[0].getsockname()[1]
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGUSR1, delay.turn, True)
    loop.add_signal_handler(signal.SIGUSR2, delay.turn, False)
    print(f"listening on {port}", flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--delay-ms", type=float, default=200.0)
    args = parser.parse_args()
    asyncio.run(serve(args.port, Delay(args.delay_ms / 1000)))


if __name__ == "__main__":
    main()
