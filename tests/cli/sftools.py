"""safetensors files read and written for the CLI tests, from the format's
definition (an 8-byte little-endian header length, a JSON header, the data),
with no strata code: what the tests hold strata's files to."""
import json
import struct

FORMAT = {"F32": "f", "F16": "e", "BF16": "H"}  # BF16 as its 16-bit patterns


def header(path):
    """The JSON header of path, as a dict."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n))


def read(path):
    """{name: (dtype, shape, values)} in the header's order (F32 and F16 as
    floats, BF16 as integers), __metadata__ left out."""
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    out = {}
    for k, v in json.loads(raw[8:8 + n]).items():
        if k == "__metadata__":
            continue
        a, b = v["data_offsets"]
        f = FORMAT[v["dtype"]]
        count = (b - a) // struct.calcsize(f)
        out[k] = (v["dtype"], v["shape"],
                  list(struct.unpack("<%d%s" % (count, f), raw[8 + n + a:8 + n + b])))
    return out


def write(path, tensors):
    """Write {name: (dtype, shape, values)}; values None writes zeros without
    holding them (a sparse file)."""
    hdr, off = {}, 0
    for k, (dtype, shape, vals) in tensors.items():
        count = 1
        for s in shape:
            count *= s
        size = count * struct.calcsize(FORMAT[dtype])
        hdr[k] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + size]}
        off += size
    h = json.dumps(hdr).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for k, (dtype, shape, vals) in tensors.items():
            if vals is not None:
                f.write(struct.pack("<%d%s" % (len(vals), FORMAT[dtype]), *vals))
        f.truncate(8 + len(h) + off)


M64 = (1 << 64) - 1
_P1, _P2, _P3 = 0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9
_P4, _P5 = 0x85EBCA77C2B2AE63, 0x27D4EB2F165667C5


def _rotl(x, r):
    return ((x << r) | (x >> (64 - r))) & M64


def _round(acc, lane):
    return (_rotl((acc + lane * _P2) & M64, 31) * _P1) & M64


def xxh64(data, seed=0):
    """XXH64 of data as its specification defines it (what trainer.json
    lists per file, seed 0), so a test can edit a checkpoint file and list
    its new checksum; written here from the spec, slow but small."""
    n, i = len(data), 0
    if n >= 32:
        v = [(seed + _P1 + _P2) & M64, (seed + _P2) & M64, seed, (seed - _P1) & M64]
        lanes = struct.unpack_from("<%dQ" % (n // 32 * 4), data)
        for k in range(0, len(lanes), 4):
            v = [_round(v[j], lanes[k + j]) for j in range(4)]
        i = n // 32 * 32
        h = (_rotl(v[0], 1) + _rotl(v[1], 7) + _rotl(v[2], 12) + _rotl(v[3], 18)) & M64
        for x in v:
            h = ((h ^ _round(0, x)) * _P1 + _P4) & M64
    else:
        h = (seed + _P5) & M64
    h = (h + n) & M64
    while i + 8 <= n:
        (lane,) = struct.unpack_from("<Q", data, i)
        h = (_rotl(h ^ _round(0, lane), 27) * _P1 + _P4) & M64
        i += 8
    if i + 4 <= n:
        (lane,) = struct.unpack_from("<I", data, i)
        h = (_rotl(h ^ (lane * _P1 & M64), 23) * _P2 + _P3) & M64
        i += 4
    while i < n:
        h = (_rotl(h ^ (data[i] * _P5 & M64), 11) * _P1) & M64
        i += 1
    h = ((h ^ (h >> 33)) * _P2) & M64
    h = ((h ^ (h >> 29)) * _P3) & M64
    return h ^ (h >> 32)


class _Num(str):
    """A JSON number as the file wrote it."""


def _plain(o):
    # json-c's JSON_C_TO_STRING_PLAIN text: no whitespace, keys in order,
    # numbers as read, strings as JSON with non-ASCII kept
    if isinstance(o, dict):
        return "{" + ",".join(json.dumps(k, ensure_ascii=False) + ":" + _plain(v)
                              for k, v in o.items()) + "}"
    if isinstance(o, list):
        return "[" + ",".join(_plain(v) for v in o) + "]"
    if isinstance(o, _Num):
        return str.__str__(o)
    return json.dumps(o, ensure_ascii=False)


def trainer_load(path):
    """trainer.json with its numbers kept as written (for trainer_save)."""
    return json.load(open(path), parse_float=_Num)


def trainer_save(path, tr):
    """Write tr as trainer.json with its own checksum (docs/checkpoints.md):
    XXH64 of the object without "checksum" in json-c's plain text."""
    tr = {k: v for k, v in tr.items() if k != "checksum"}
    tr["checksum"] = "%016x" % xxh64(_plain(tr).encode())
    open(path, "w").write("{\n" + ",\n".join("  " + json.dumps(k) + ": " + _plain(v)
                                             for k, v in tr.items()) + "\n}\n")
