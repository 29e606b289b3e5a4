"""What one streamed message costs a gRPC Python server (docs/pipeline.md): a Generate stream of 128 small
GenerateChunks per call, STREAMS calls at once from a client in another process, the server's chunks made
on a thread of their own every --gap-ms (a round's wait for the verifier), through grpcio's thread-pool server
(`--mode sync`, as the orchestrator serves) or its asyncio server fed from the threads (`--mode aio`). Prints
the server process's CPU per message, the floor under the orchestrator's CPU per plain-decoded token.

    python3 bench-results/recipes/grpc-stream-cost.py --mode sync --streams 32"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import threading
import time
from concurrent import futures

import grpc

from specpipe.v1 import generation_pb2, generation_pb2_grpc

MESSAGES = 128  # a call's chunks
CALLS = 2       # calls a stream makes, one after another
CLIENT = """
import sys, threading, grpc
from specpipe.v1 import generation_pb2, generation_pb2_grpc
stub = generation_pb2_grpc.GenerationStub(grpc.insecure_channel(sys.argv[1]))
def stream():
    for _ in range({calls}):
        for _ in stub.Generate(generation_pb2.GenerateRequest()):
            pass
threads = [threading.Thread(target=stream) for _ in range(int(sys.argv[2]))]
[t.start() for t in threads]
[t.join() for t in threads]
"""
CHUNK = generation_pb2.GenerateChunk(request_id="req-0123456789abcdef", token_ids=[123], text=" hello")


def chunks(gap_s: float):
    for _ in range(MESSAGES):
        yield CHUNK
        time.sleep(gap_s)


class SyncServicer(generation_pb2_grpc.GenerationServicer):
    def __init__(self, gap_s: float):
        self.gap_s = gap_s

    def Generate(self, request, context):
        yield from chunks(self.gap_s)


class AioServicer(generation_pb2_grpc.GenerationServicer):
    def __init__(self, gap_s: float):
        self.gap_s = gap_s

    async def Generate(self, request, context):
        loop, queue = asyncio.get_running_loop(), asyncio.Queue()

        def produce():  # the generation's own thread, as the HTTP API's ThreadStream runs it
            for chunk in chunks(self.gap_s):
                loop.call_soon_threadsafe(queue.put_nowait, chunk)
            loop.call_soon_threadsafe(queue.put_nowait, None)

        threading.Thread(target=produce, daemon=True).start()
        while (chunk := await queue.get()) is not None:
            yield chunk


def client(address: str, streams: int) -> list[str]:
    return [sys.executable, "-c", CLIENT.format(calls=CALLS), address, str(streams)]


def run_sync(streams: int, gap_s: float) -> float:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=streams + 8))
    generation_pb2_grpc.add_GenerationServicer_to_server(SyncServicer(gap_s), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    start = time.process_time()
    subprocess.run(client(f"127.0.0.1:{port}", streams), check=True)
    spent = time.process_time() - start
    server.stop(0)
    return spent


async def run_aio(streams: int, gap_s: float) -> float:
    server = grpc.aio.server()
    generation_pb2_grpc.add_GenerationServicer_to_server(AioServicer(gap_s), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    start = time.process_time()
    proc = await asyncio.create_subprocess_exec(*client(f"127.0.0.1:{port}", streams))
    if await proc.wait():
        raise SystemExit("the client failed")
    spent = time.process_time() - start
    await server.stop(0)
    return spent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=("sync", "aio"), default="sync")
    parser.add_argument("--streams", type=int, default=32)
    parser.add_argument("--gap-ms", type=float, default=8.0, help="between a stream's chunks (default: %(default)s)")
    args = parser.parse_args()
    gap_s = args.gap_ms / 1e3
    spent = run_sync(args.streams, gap_s) if args.mode == "sync" else asyncio.run(run_aio(args.streams, gap_s))
    messages = MESSAGES * CALLS * args.streams
    print(f"{args.mode}, {args.streams} streams, a chunk every {args.gap_ms:g} ms: "
          f"{spent / messages * 1e6:.0f} us of the server's CPU a message")


if __name__ == "__main__":
    main()
