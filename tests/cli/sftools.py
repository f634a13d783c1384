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
