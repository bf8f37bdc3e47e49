"""A TCP proxy on loopback that delays every byte by a fixed time each way.

It stands for the network between hosts of one data centre, so that benchmarks on one
machine see round trips as they would between machines:

    python tools/latency_proxy.py --listen 127.0.0.1:6543 --target 127.0.0.1:5432 --delay-ms 0.5

Each chunk read from one side is written to the other `--delay-ms` after it arrived
(order kept: the delay is the same for every chunk), so a request and its answer take
twice the delay more than without the proxy. Bandwidth is not limited.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys


async def pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
    loop = asyncio.get_running_loop()
    try:
        while chunk := await reader.read(65536):
            loop.call_later(delay, writer.write, chunk)
        await asyncio.sleep(delay)  # what is on its way arrives before the close
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()


async def serve(listen: tuple[str, int], target: tuple[str, int], delay: float) -> None:
    async def handle(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            server_r, server_w = await asyncio.open_connection(*target)
        except OSError:
            client_w.close()
            return
        await asyncio.gather(pump(client_r, server_w, delay), pump(server_r, client_w, delay))

    server = await asyncio.start_server(handle, *listen)
    print(f"listening on {listen[0]}:{listen[1]}", flush=True)
    async with server:
        await server.serve_forever()


def address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host or "127.0.0.1", int(port)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen", type=address, required=True, help="host:port to accept on")
    parser.add_argument("--target", type=address, required=True, help="host:port to reach")
    parser.add_argument("--delay-ms", type=float, default=0.5, help="added each way")
    args = parser.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args.listen, args.target, args.delay_ms / 1000))
    return 0


if __name__ == "__main__":
    sys.exit(main())
