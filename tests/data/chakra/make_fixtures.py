#!/usr/bin/env python3
"""Builds the binary Chakra ET fixtures in this folder from their text form, independently of Prism's writer.

Each <case>/<prefix>.<rank>.et.txt holds protobuf text-format messages separated by lines "---": the first is
the GlobalMetadata, the rest are Nodes. Every message is encoded by `protoc --encode` with our
src/replay/chakra/et_def.proto and written with a varint32 length prefix (Chakra's framing), giving
<case>/<prefix>.<rank>.et. Run from anywhere:  python3 tests/data/chakra/make_fixtures.py
Needs only protoc (protobuf-compiler) and the Python standard library.
"""
import pathlib
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent
SRC = HERE.parents[2] / "src"
PROTO = "replay/chakra/et_def.proto"


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def encode(message: str, text: str) -> bytes:
    r = subprocess.run(["protoc", f"--proto_path={SRC}", f"--encode=prism.chakra.et.{message}", PROTO],
                       input=text.encode(), capture_output=True, cwd=SRC)
    if r.returncode != 0:
        sys.exit(f"protoc failed on:\n{text}\n{r.stderr.decode()}")
    return r.stdout


def main() -> None:
    for txt in sorted(HERE.glob("*/*.et.txt")):
        blocks = [b for b in txt.read_text().split("\n---\n")]
        out = bytearray()
        for i, block in enumerate(blocks):
            body = encode("GlobalMetadata" if i == 0 else "Node", block)
            out += varint(len(body)) + body
        dst = txt.with_suffix("")  # x.0.et.txt -> x.0.et
        dst.write_bytes(bytes(out))
        print(f"{dst.relative_to(HERE)}: {len(blocks) - 1} nodes, {len(out)} bytes")


if __name__ == "__main__":
    main()
