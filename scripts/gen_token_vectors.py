#!/usr/bin/env python3
"""Generate testdata/fixtures/hashing/token_keys.json (the client module
reads it through its link client/testdata/hashing/token_keys.json): vectors
for kvindex's
canonical token block key (docs/hashing.md).

This is a second implementation of the specification, written from
docs/hashing.md and not from the Go code, so the Go tests that read the
file check the Go hasher against it. It needs only the standard library and
the xxhash bindings (Debian: python3-xxhash; `xxhash.xxh3_64_intdigest` is
XXH3-64 with seed 0). Run it from anywhere:

    python3 scripts/gen_token_vectors.py

and commit the file it rewrites. The output is deterministic.
"""

import json
import os
import struct

import xxhash

ROOT_LABEL = b"kvindex token key v1"

STRING, BYTES, INT = 1, 2, 3
KIND_NAMES = {STRING: "string", BYTES: "bytes", INT: "int"}


def xxh3(data: bytes) -> int:
    return xxhash.xxh3_64_intdigest(data)


ROOT = xxh3(ROOT_LABEL)


def s_extra(text: str):
    return (STRING, text.encode("utf-8"))


def b_extra(data: bytes):
    return (BYTES, bytes(data))


def i_extra(value: int):
    # 8 bytes little-endian, two's complement; uint64 values keep their bits.
    return (INT, struct.pack("<Q", value & 0xFFFFFFFFFFFFFFFF))


def block_input(parent: int, tokens, extras) -> bytes:
    out = bytearray(struct.pack("<Q", parent))
    out += struct.pack("<I", len(tokens))
    for t in tokens:
        out += struct.pack("<I", t)
    out += struct.pack("<I", len(extras))
    for kind, data in extras:
        out += bytes([kind]) + struct.pack("<I", len(data)) + data
    return bytes(out)


def block_key(parent: int, tokens, extras) -> int:
    return xxh3(block_input(parent, tokens, extras))


def request_extras(prompt, block_size: int, blk: int):
    """A request's extras for block blk, by vLLM's rule (docs/hashing.md)."""
    start, end = blk * block_size, (blk + 1) * block_size
    out = []
    if prompt.get("lora_name"):
        out.append(s_extra(prompt["lora_name"]))
    for item in prompt.get("multimodal", []):
        off, length = item["offset"], item["length"]
        if length > 0 and off < end and off + length > start:
            out.append(s_extra(item["hash"]))
            out.append(i_extra(off - start))
    if blk == 0 and prompt.get("cache_salt"):
        out.append(s_extra(prompt["cache_salt"]))
    return out


def prompt_keys(prompt, block_size: int):
    tokens = prompt["token_ids"]
    keys, extras_per_block = [], []
    parent = ROOT
    for blk in range(len(tokens) // block_size):
        extras = request_extras(prompt, block_size, blk)
        parent = block_key(parent, tokens[blk * block_size:(blk + 1) * block_size], extras)
        keys.append(parent)
        extras_per_block.append(extras)
    return keys, extras_per_block


def event_extras(value, depth=1):
    """Typed extras of one extra_keys entry, in the tagged JSON form below."""
    if value is None:
        return []
    if "array" not in value:
        raise ValueError("a block's entry must be an array or null")
    return flatten(value["array"], depth)


def flatten(items, depth):
    out = []
    for v in items:
        if v is None:
            raise ValueError("nil inside an entry")
        if "array" in v:
            if depth >= 4:
                raise ValueError("too deep")
            out += flatten(v["array"], depth + 1)
        elif "str" in v:
            out.append(s_extra(v["str"]))
        elif "bin" in v:
            out.append(b_extra(bytes.fromhex(v["bin"])))
        elif "int" in v:
            out.append(i_extra(v["int"]))
        else:
            raise ValueError("unkeyable value %r" % (v,))
    return out


def hex16(k: int) -> str:
    return "%016x" % k


def extras_json(extras):
    return [{"kind": KIND_NAMES[k], "hex": d.hex()} for k, d in extras]


def lcg_tokens(seed: int, n: int, bound: int = 1 << 32):
    x, out = seed, []
    for _ in range(n):
        x = (x * 6364136223846793005 + 1442695040888963407) & 0xFFFFFFFFFFFFFFFF
        out.append((x >> 32) % bound)
    return out


BLOCKS = [
    ("root_no_tokens_no_extras", ROOT, [], []),
    ("root_one_token", ROOT, [0], []),
    ("root_four_tokens", ROOT, [1, 2, 3, 4], []),
    ("max_token_ids", ROOT, [0xFFFFFFFF, 0, 0xFFFFFFFF, 1], []),
    ("zero_parent", 0, [1, 2, 3, 4], []),
    ("max_parent", 0xFFFFFFFFFFFFFFFF, [1, 2, 3, 4], []),
    ("string_extra", ROOT, [1, 2, 3, 4], [s_extra("sql-lora")]),
    ("empty_string_extra", ROOT, [1, 2, 3, 4], [s_extra("")]),
    ("utf8_string_extra", ROOT, [1, 2, 3, 4], [s_extra("租户-ä-🙂")]),
    ("bytes_extra", ROOT, [1, 2, 3, 4], [b_extra(bytes(range(32)))]),
    ("empty_bytes_extra", ROOT, [1, 2, 3, 4], [b_extra(b"")]),
    ("int_extras", ROOT, [1, 2, 3, 4],
     [i_extra(0), i_extra(-1), i_extra(7), i_extra(-(1 << 63)), i_extra((1 << 63) - 1)]),
    ("string_and_bytes_differ", ROOT, [1, 2, 3, 4], [b_extra(b"sql-lora")]),
    ("lora_mm_salt", ROOT, list(range(100, 116)),
     [s_extra("sql-lora"), s_extra("mm-a"), i_extra(-3), s_extra("tenant-7")]),
    ("sixteen_tokens", ROOT, lcg_tokens(1, 16), []),
    ("two_hundred_fifty_six_tokens", ROOT, lcg_tokens(2, 256), [s_extra("x" * 600)]),
]

PROMPTS = [
    {"name": "bs4_plain", "block_size": 4, "token_ids": list(range(1, 13))},
    {"name": "bs4_partial_tail_not_keyed", "block_size": 4, "token_ids": list(range(1, 15))},
    {"name": "bs4_shorter_than_a_block", "block_size": 4, "token_ids": [1, 2, 3]},
    {"name": "bs4_empty", "block_size": 4, "token_ids": []},
    {"name": "bs1_every_token_a_block", "block_size": 1, "token_ids": [9, 8, 7]},
    {"name": "bs16_large_ids", "block_size": 16, "token_ids": lcg_tokens(3, 50)},
    {"name": "bs4_lora_every_block", "block_size": 4, "token_ids": list(range(1, 13)),
     "lora_name": "sql-lora"},
    {"name": "bs4_salt_block0_only", "block_size": 4, "token_ids": list(range(1, 13)),
     "cache_salt": "tenant-7"},
    {"name": "bs4_lora_and_salt", "block_size": 4, "token_ids": list(range(1, 13)),
     "lora_name": "sql-lora", "cache_salt": "tenant-7"},
    {"name": "bs4_mm_spanning_blocks", "block_size": 4, "token_ids": [1, 2] + [151655] * 7 + [3, 4, 5, 6, 7, 8, 9],
     "multimodal": [{"hash": "a3f1c0de", "offset": 2, "length": 7}]},
    {"name": "bs4_two_mm_in_one_block", "block_size": 4, "token_ids": [151655] * 3 + [5] + [151655] * 2 + [6, 7, 8, 9, 10, 11],
     "multimodal": [{"hash": "img-a", "offset": 0, "length": 3}, {"hash": "img-b", "offset": 4, "length": 2}]},
    {"name": "bs4_same_tokens_other_image", "block_size": 4, "token_ids": [1, 2] + [151655] * 7 + [3, 4, 5, 6, 7, 8, 9],
     "multimodal": [{"hash": "b7e2aa01", "offset": 2, "length": 7}]},
    {"name": "bs4_mm_in_partial_tail_only", "block_size": 4, "token_ids": list(range(1, 11)),
     "multimodal": [{"hash": "tail", "offset": 8, "length": 2}]},
    {"name": "bs4_lora_mm_salt_order", "block_size": 4, "token_ids": [151655] * 6 + [1, 2],
     "lora_name": "sql-lora", "cache_salt": "tenant-7",
     "multimodal": [{"hash": "img-a", "offset": 0, "length": 6}]},
]

EVENTS = [
    ("nil_entry", None),
    ("empty_array", {"array": []}),
    ("lora_only", {"array": [{"str": "sql-lora"}]}),
    ("lora_mm_tuple_salt", {"array": [{"str": "sql-lora"},
                                       {"array": [{"str": "mm-a"}, {"int": -3}]},
                                       {"str": "tenant-7"}]}),
    ("mm_identifier_only", {"array": [{"str": "mm-a"}]}),
    ("prompt_embeds_digest", {"array": [{"bin": "00" * 31 + "ff"}]}),
    ("uint64_max_is_minus_one", {"array": [{"int": (1 << 64) - 1}]}),
]


def main():
    blocks = []
    for name, parent, tokens, extras in BLOCKS:
        data = block_input(parent, tokens, extras)
        blocks.append({
            "name": name,
            "parent": hex16(parent),
            "token_ids": tokens,
            "extras": extras_json(extras),
            "input_hex": data.hex(),
            "key": hex16(xxh3(data)),
        })
    prompts = []
    for p in PROMPTS:
        keys, per_block = prompt_keys(p, p["block_size"])
        prompts.append({
            "name": p["name"],
            "block_size": p["block_size"],
            "token_ids": p["token_ids"],
            "lora_name": p.get("lora_name", ""),
            "cache_salt": p.get("cache_salt", ""),
            "multimodal": p.get("multimodal", []),
            "block_extras": [extras_json(e) for e in per_block],
            "keys": [hex16(k) for k in keys],
        })
    events = []
    for name, entry in EVENTS:
        events.append({"name": name, "entry": entry, "extras": extras_json(event_extras(entry))})
    doc = {
        "about": ("kvindex canonical token block keys (docs/hashing.md), generated by "
                  "scripts/gen_token_vectors.py with the xxhash bindings, independently of the Go code. "
                  "Keys and parents are 16 lowercase hex digits of the uint64. "
                  "root: TokenKeyRoot = XXH3-64 of the label's ASCII bytes. "
                  "blocks: one TokenBlockKey each (input_hex is the exact hashed bytes). "
                  "prompts: TokenKeys of a prompt at block_size, with each block's extras by the request rule. "
                  "events: an extra_keys entry in tagged JSON (null, {\"array\": [...]}, {\"str\"}, {\"bin\": hex}, "
                  "{\"int\"}) and the typed extras it maps to."),
        "root": {"label": ROOT_LABEL.decode("ascii"), "key": hex16(ROOT)},
        "blocks": blocks,
        "prompts": prompts,
        "events": events,
    }
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.path.join(here, "..", "testdata", "fixtures", "hashing", "token_keys.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1, ensure_ascii=False)
        f.write("\n")


if __name__ == "__main__":
    main()
