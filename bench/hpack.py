"""HPACK benchmark: decoding the request header blocks of a gRPC client's connection.

    .venv/bin/python bench/hpack.py [--requests N] [--repeat R]

The blocks are encoded with python-hyper's `hpack` Encoder (the test extra), indexing on, Huffman
on then off, from the header list the RocketMQ SDK's grpcio client sends for SendMessage: after
the first block most fields are indexed from the dynamic table and the literals are a new request
id (UUID) on every call, the date-time once a second and the grpc-timeout when it changes.

Prints microseconds per block for tidemq's Decoder and, as a reference, hpack's Decoder (same
blocks, fresh decoder per pass, best of R passes). Target: well under 10 us per block.
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from pathlib import Path

sys.path[0] = str(Path(__file__).resolve().parent.parent)  # the repository, not bench/ (which shadows hpack)

from hpack import Decoder as ReferenceDecoder  # noqa: E402
from hpack import Encoder  # noqa: E402

from tidemq.protocol.http2.hpack import Decoder  # noqa: E402


def request_blocks(requests: int, huffman: bool) -> list[bytes]:
    encoder = Encoder()
    client_id = f"host-1@{12345}#{uuid.uuid4().int % 10**12}"
    blocks = []
    for call in range(requests):
        headers = [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", "/apache.rocketmq.v2.MessagingService/SendMessage"),
            (":authority", "127.0.0.1:8081"),
            ("te", "trailers"),
            ("content-type", "application/grpc"),
            ("user-agent", "grpc-python/1.85.0 grpc-c/52.0.0 (linux; chttp2)"),
            ("grpc-accept-encoding", "identity,deflate,gzip"),
            ("grpc-timeout", f"{2999 - call % 3}m"),
            ("x-mq-client-id", client_id),
            ("x-mq-language", "PYTHON"),
            ("x-mq-protocol", "v2"),
            ("x-mq-client-version", "5.0.6"),
            ("x-mq-date-time", f"20261122T1010{call // 1000 % 60:02d}Z"),
            ("x-mq-request-id", str(uuid.uuid4())),
        ]
        blocks.append(encoder.encode(headers, huffman=huffman))
    return blocks


def per_block_us(decode_factory, blocks: list[bytes], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        decode = decode_factory()
        started = time.perf_counter()
        for block in blocks:
            decode(block)
        best = min(best, time.perf_counter() - started)
    return best / len(blocks) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    for huffman in (True, False):
        blocks = request_blocks(args.requests, huffman)
        steady = blocks[1:]
        print(f"Huffman {'on' if huffman else 'off'}: {len(blocks)} blocks, first {len(blocks[0])} octets, then"
              f" {sum(map(len, steady)) / len(steady):.1f} octets on average, {len(Decoder().decode(blocks[0]))}"
              f" fields each")
        Decoder().decode(blocks[0])  # builds the Huffman machine outside the timing
        ours = per_block_us(lambda: Decoder().decode, blocks, args.repeat)
        reference = per_block_us(lambda: ReferenceDecoder().decode, blocks, max(1, args.repeat // 2))
        print(f"  tidemq Decoder: {ours:6.2f} us/block")
        print(f"  hpack Decoder:  {reference:6.2f} us/block  ({reference / ours:.1f}x tidemq's)")


if __name__ == "__main__":
    main()
