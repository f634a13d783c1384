#!/usr/bin/env python3
"""Writes the seed corpora of the dataset, trainer and llmc fuzz targets
(tests/fuzz/meson.build): a few valid inputs and one of each way to be
broken that the reader checks, each under 64 KiB.

    tests/fuzz/make_corpus.py [DIR]   (DIR defaults to tests/fuzz)

Inputs that were found by fuzzing and are kept as regression seeds are
written here too (named fuzz_*), so running this again loses nothing.
trainer's valid_strata.json is written the way `strata train --model
layers=1,dim=8,heads=2,vocab=256,ctx=16 --batch 2 --seq 8 --steps 2
--save ck` wrote ck/latest/trainer.json (its text is below)."""
import json
import os
import struct
import sys

top = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))


def put(sub, name, data):
    d = os.path.join(top, sub)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    assert len(data) < 65536, name
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# ---- llm.c token shards: 256 int32 header, then uint16 tokens ----------
def shard(tokens, magic=20240520, version=1, count=None):
    hdr = [0] * 256
    hdr[0], hdr[1] = magic, version
    hdr[2] = len(tokens) if count is None else count
    return struct.pack("<256i", *hdr) + struct.pack("<%dH" % len(tokens), *tokens)


D = "corpus-dataset"
put(D, "valid_small.bin", shard(list(range(40))))
put(D, "valid_one_token.bin", shard([7]))
put(D, "valid_max_token.bin", shard([65535, 0, 50256, 1] * 8))
put(D, "valid_2k.bin", shard([(i * 7919) % 50257 for i in range(2048)]))
put(D, "empty.bin", b"")
put(D, "short_header.bin", shard([1, 2, 3])[:100])
put(D, "header_only.bin", shard([], count=0))
put(D, "bad_magic.bin", shard([1, 2, 3], magic=20240326))
put(D, "bad_version.bin", shard([1, 2, 3], version=2))
put(D, "count_negative.bin", shard([1, 2, 3], count=-3))
put(D, "count_too_large.bin", shard([1, 2, 3], count=4))
put(D, "count_too_small.bin", shard([1, 2, 3], count=2))
put(D, "count_huge.bin", shard([1, 2, 3], count=0x7FFFFFFF))
put(D, "odd_byte.bin", shard([1, 2, 3]) + b"\x00")
put(D, "text.bin", "not a shard, but its name says it is one\n" * 4)
# llm.c's uint32 shards (magic 20240801, version 7: Llama 3's vocabulary)
def shard32(tokens, version=7, count=None):
    hdr = [0] * 256
    hdr[0], hdr[1] = 20240801, version
    hdr[2] = len(tokens) if count is None else count
    return struct.pack("<256i", *hdr) + struct.pack("<%dI" % len(tokens), *tokens)


put(D, "valid_u32.bin", shard32([128000, 9906, 1917, 0, 65536, 151935] * 4))
put(D, "u32_bad_version.bin", shard32([1, 2, 3], version=1))
put(D, "u32_count_too_large.bin", shard32([1, 2, 3], count=4))
put(D, "u32_half_token.bin", shard32([1, 2, 3]) + b"\x00\x00")
# found by fuzz-dataset: an id past 2^31-1 came out of the loader negative
put(D, "fuzz_u32_past_int32.bin", shard32([128000, 4278342015, 9906]))
# a sampler cursor as trainer.json holds it (st_cursor_pack())
cursor = bytes.fromhex(
    "535443520100000002000000080000000100000000000000390500000000000000000000"
    "000000004d89000000000000020000000000000019a97ae6bd7d1d970babd387c3c5bdd7"
    "8c9fafd1b860cda879c8d92fc4780f8c6dfd6a17350640f1")
put(D, "cursor.bin", cursor)
put(D, "cursor_then_shard.bin", cursor + shard(list(range(40)))[96:])

# ---- trainer.json ----------------------------------------------------------
T = "corpus-trainer"
valid = {
    "format": "strata-checkpoint", "version": 1, "step": 2, "seed": 1337,
    "cursor": cursor.hex(),
    "config": {"model": "layers=1,dim=8,heads=2,vocab=256,ctx=16",
               "data": "/usr/share/common-licenses/GPL-3", "batch": 2,
               "seq": 8, "grad_accum": 1, "steps": 2, "lr": 0.001,
               "schedule": "cosine", "warmup": 10, "wd": 0.1, "beta1": 0.9,
               "beta2": 0.95, "eps": 1e-08, "clip": 1.0, "seed": 1337,
               "precision": "bf16", "shuffle": True},
    "files": [{"name": "model.safetensors", "bytes": 13528, "xxh64": "4ca9222c8e1bfe1c"},
              {"name": "optimizer.safetensors", "bytes": 27328, "xxh64": "9b51758ad480040e"},
              {"name": "config.json", "bytes": 294, "xxh64": "0e0a19e9afa6823a"}],
}


def tj(**changes):
    d = json.loads(json.dumps(valid))
    for k, v in changes.items():
        if v is None:
            del d[k]
        else:
            d[k] = v
    return json.dumps(d, indent=2) + "\n"


def tfiles(*entries):
    return tj(files=list(entries))


put(T, "valid_strata.json", json.dumps(valid, indent=2) + "\n")
put(T, "valid_minimal.json", '{"format":"strata-checkpoint","version":1,"step":0,'
    '"seed":0,"cursor":"","config":{},"files":[]}')
put(T, "valid_max_seed.json", tj(seed=2**64 - 1, step=2**63 - 1))
put(T, "valid_16_files.json", tfiles(*[{"name": "f%d" % i, "bytes": i,
                                        "xxh64": "%016x" % i} for i in range(16)]))
put(T, "empty.json", "")
put(T, "truncated.json", tj()[:300])
put(T, "not_object.json", "[1, 2, 3]\n")
put(T, "trailing_garbage.json", tj() + "}")
put(T, "trailing_object.json", tj() + "{}")
put(T, "bad_utf8.json", tj(config={"data": "x"}).replace('"x"', '"\udcff"', 1)
    .encode("utf-8", "surrogateescape").replace(b"\xed\xb3\xbf", b"\xff"))
put(T, "format_wrong.json", tj(format="strata"))
put(T, "format_missing.json", tj(format=None))
put(T, "format_number.json", tj(format=1))
put(T, "version_zero.json", tj(version=0))
put(T, "version_future.json", tj(version=2))
put(T, "version_huge.json", tj(version=2**40))
put(T, "step_negative.json", tj(step=-1))
put(T, "step_float.json", tj(step=1.5))
put(T, "step_over_int64.json", tj(step=2**63))
put(T, "seed_string.json", tj(seed="1337"))
put(T, "seed_over_uint64.json", tj().replace('"seed": 1337', '"seed": 18446744073709551616', 1))
put(T, "cursor_odd.json", tj(cursor="abc"))
put(T, "cursor_not_hex.json", tj(cursor="zz"))
put(T, "cursor_too_long.json", tj(cursor="00" * 257))
put(T, "cursor_max.json", tj(cursor="ff" * 256))
put(T, "cursor_nul.json", tj().replace('"cursor": "', '"cursor": "\\u0000\\u0000', 1))
# regression seeds: a \u0000 in a string was cut at by C, and read as
# a shorter name, an empty cursor, a matching format (fixed: refused)
put(T, "format_nul.json", tj().replace('"strata-checkpoint"', '"strata-checkpoint\\u0000x"', 1))
put(T, "config_array.json", tj(config=[]))
put(T, "config_missing.json", tj(config=None))
put(T, "config_deep.json", tj(config={"a": [[[[[[[[{"b": [1e308, -0.0, 5e-324]}]]]]]]]]}))
put(T, "files_object.json", tj(files={}))
put(T, "files_missing.json", tj(files=None))
put(T, "files_17.json", tfiles(*[{"name": "f%d" % i, "bytes": i,
                                  "xxh64": "%016x" % i} for i in range(17)]))
put(T, "file_not_object.json", tfiles("model.safetensors"))
put(T, "file_name_slash.json", tfiles({"name": "../x", "bytes": 1, "xxh64": "0" * 16}))
put(T, "file_name_dotdot.json", tfiles({"name": "..", "bytes": 1, "xxh64": "0" * 16}))
put(T, "file_name_trainer.json", tfiles({"name": "trainer.json", "bytes": 1, "xxh64": "0" * 16}))
put(T, "file_name_empty.json", tfiles({"name": "", "bytes": 1, "xxh64": "0" * 16}))
put(T, "file_name_63.json", tfiles({"name": "n" * 63, "bytes": 1, "xxh64": "0" * 16}))
put(T, "file_name_64.json", tfiles({"name": "n" * 64, "bytes": 1, "xxh64": "0" * 16}))
put(T, "file_name_control.json", tfiles({"name": "a\tb", "bytes": 1, "xxh64": "0" * 16}))
put(T, "file_name_nul.json", tfiles({"name": "a\u0000b", "bytes": 1, "xxh64": "0" * 16}))
put(T, "file_name_twice.json", tfiles({"name": "a", "bytes": 1, "xxh64": "0" * 16},
                                      {"name": "a", "bytes": 2, "xxh64": "1" * 16}))
put(T, "file_bytes_negative.json", tfiles({"name": "a", "bytes": -1, "xxh64": "0" * 16}))
put(T, "file_bytes_string.json", tfiles({"name": "a", "bytes": "1", "xxh64": "0" * 16}))
put(T, "file_xxh64_short.json", tfiles({"name": "a", "bytes": 1, "xxh64": "0" * 15}))
put(T, "file_xxh64_not_hex.json", tfiles({"name": "a", "bytes": 1, "xxh64": "g" * 16}))
put(T, "file_xxh64_number.json", tfiles({"name": "a", "bytes": 1, "xxh64": 0}))
put(T, "file_missing_name.json", tfiles({"bytes": 1, "xxh64": "0" * 16}))
put(T, "file_listed_present.json", tfiles({"name": "trainer2.json", "bytes": 0, "xxh64": "0" * 16},
                                          {"name": "again.json", "bytes": 1, "xxh64": "0" * 16}))


# ---- llm.c model files ---------------------------------------------------
def kinds_elems(V, Vp, T_, L, C):
    """Elements of each kind for all layers, in llm.c's order."""
    per = [C, C, 3 * C * C, 3 * C, C * C, C, C, C, 4 * C * C, 4 * C, 4 * C * C, C]
    return [Vp * C, T_ * C] + [p * L for p in per] + [C, C]


def model(T_=4, V=3, L=1, NH=1, C=2, Vp=None, version=3, value=0.5,
          hdr_changes=None, extra=b"", cut=0):
    Vp = V if Vp is None else Vp
    hdr = [0] * 256
    hdr[:8] = [20240326, version, T_, V, L, NH, C, Vp]
    for i, v in (hdr_changes or {}).items():
        hdr[i] = v
    n = sum(kinds_elems(V, Vp, T_, L, C))
    if version == 5:
        one = struct.pack("<f", value)[2:]
        body = one * n
    else:
        body = struct.pack("<f", value) * n
    data = struct.pack("<256i", *hdr) + body + extra
    return data[:len(data) - cut] if cut else data


M = "corpus-llmc"
put(M, "valid_f32_tiny.bin", model(T_=1, V=1, L=1, NH=1, C=1))
put(M, "valid_f32.bin", model(T_=4, V=3, L=2, NH=2, C=4, Vp=8))
put(M, "valid_bf16.bin", model(T_=4, V=5, L=1, NH=2, C=4, Vp=8, version=5))
put(M, "valid_vocab_128.bin", model(T_=2, V=100, L=1, NH=1, C=2, Vp=128))
put(M, "nan.bin", model(value=float("nan")))
put(M, "inf_bf16.bin", model(version=5, value=float("inf")))
put(M, "magic_only.bin", struct.pack("<i", 20240326))
put(M, "short_header.bin", model()[:600])
put(M, "header_only.bin", model()[:1024])
put(M, "version_4.bin", model(version=4))
put(M, "field_zero.bin", model(hdr_changes={4: 0}))
put(M, "field_negative.bin", model(hdr_changes={6: -2}))
put(M, "padded_below_vocab.bin", model(V=8, Vp=4))
put(M, "heads_not_dividing.bin", model(NH=3, C=4))
put(M, "one_byte_short.bin", model(cut=1))
put(M, "one_byte_over.bin", model(extra=b"\x00"))
put(M, "huge_dims.bin", model(hdr_changes={2: 2**31 - 1, 3: 2**31 - 1, 7: 2**31 - 1}))
put(M, "dim_too_large.bin", model(hdr_changes={6: 65537, 5: 1}))
put(M, "layers_too_large.bin", model(hdr_changes={4: 4097}))
put(M, "safetensors_instead.bin", struct.pack("<Q", 2) + b"{}")
