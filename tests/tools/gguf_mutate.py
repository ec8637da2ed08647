#!/usr/bin/env python3
"""gguf_mutate.py IN OUT OP... — copy a GGUF file, changing exactly the fields named.

moestream's own attack tool (docs/reliability.md, "Model files llama.cpp trusts"): it parses
the header, every metadata key/value and the tensor-info table, applies the operations in
order, and writes the header back followed by the unchanged tensor data (re-padded to the
file's alignment, so relative tensor offsets keep their meaning). Standard library only.

Operations (VALUE keeps the key's existing GGUF type unless TYPE: is given, e.g. f32:nan):
  set KEY=VALUE          change (or add, with TYPE:) a scalar key; VALUE may be nan/inf/-inf
  set-file KEY=PATH      set (or add) the string key KEY to the bytes of file PATH, verbatim
  del KEY                remove a key
  rename-key OLD=NEW     rename a key (NEW may contain \\xNN escapes, e.g. \\x00)
  type SELECTOR=TYPE     set the ggml type of the tensors SELECTOR picks (name, or role:
                         experts, router, norms, token_embd, output, attn) — data unchanged
  rename TENSOR=NEW      rename a tensor (escapes as above)
  token I=TEXT           tokenizer.ggml.tokens[I] = TEXT (escapes as above)
  dup-token I=J          tokenizer.ggml.tokens[I] = tokenizer.ggml.tokens[J]
  token-type I=N         tokenizer.ggml.token_type[I] = N (an int32)
  alignment N            general.alignment = N (u32), data re-padded to N
  nan-data TENSOR        fill an f32 tensor's data with NaN
  fill SELECTOR=BYTE     fill the data of the tensors SELECTOR picks (as for type) with BYTE
                         (0xff: NaN scales and weights in f16/f32 and the quantized types)
Exit 0 on success, 2 on a bad operation or input (one line naming it).
"""
import math
import re
import struct
import sys

T_U8, T_I8, T_U16, T_I16, T_U32, T_I32, T_F32, T_BOOL, T_STR, T_ARR, T_U64, T_I64, T_F64 = range(13)
SCALAR = {T_U8: "<B", T_I8: "<b", T_U16: "<H", T_I16: "<h", T_U32: "<I", T_I32: "<i",
          T_F32: "<f", T_BOOL: "<?", T_U64: "<Q", T_I64: "<q", T_F64: "<d"}
TYPE_NAMES = {"u8": T_U8, "i8": T_I8, "u16": T_U16, "i16": T_I16, "u32": T_U32, "i32": T_I32,
              "f32": T_F32, "bool": T_BOOL, "str": T_STR, "u64": T_U64, "i64": T_I64,
              "f64": T_F64}
# ggml_type ids (stable file-format values) of the types the attacks use.
GGML_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q8_0": 8, "q4_k": 12, "i8": 24, "i16": 25,
              "i32": 26, "i64": 27, "f64": 28, "bf16": 30}


class Bad(Exception):
    pass


class Rd:
    def __init__(self, b):
        self.b, self.p = b, 0

    def take(self, n):
        if self.p + n > len(self.b):
            raise Bad("truncated input at offset %d" % self.p)
        v = self.b[self.p:self.p + n]
        self.p += n
        return v

    def un(self, fmt):
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def s(self):
        return self.take(self.un("<Q"))


def read_val(r, t):
    if t in SCALAR:
        return r.un(SCALAR[t])
    if t == T_STR:
        return r.s()
    if t == T_ARR:
        et, n = r.un("<I"), r.un("<Q")
        return (et, [read_val(r, et) for _ in range(n)])
    raise Bad("invalid value type %d" % t)


def write_val(out, t, v):
    if t in SCALAR:
        out += struct.pack(SCALAR[t], v)
    elif t == T_STR:
        out += struct.pack("<Q", len(v)) + v
    else:
        et, items = v
        out += struct.pack("<IQ", et, len(items))
        for x in items:
            write_val(out, et, x)


def unescape(s):
    return re.sub(rb"\\x([0-9a-fA-F]{2})", lambda m: bytes([int(m.group(1), 16)]),
                  s.encode("utf-8"))


def parse(b):
    r = Rd(b)
    if r.take(4) != b"GGUF":
        raise Bad("not a GGUF file")
    ver, nt, nkv = r.un("<I"), r.un("<Q"), r.un("<Q")
    kvs = []
    for _ in range(nkv):
        k = r.s()
        t = r.un("<I")
        kvs.append([k, t, read_val(r, t)])
    tensors = []
    for _ in range(nt):
        name = r.s()
        nd = r.un("<I")
        ne = [r.un("<q") for _ in range(nd)]
        tensors.append([name, ne, r.un("<i"), r.un("<Q")])
    align = 32
    for k, t, v in kvs:
        if k == b"general.alignment" and t == T_U32:
            align = v
    data_start = (r.p + align - 1) // align * align
    return ver, kvs, tensors, b[data_start:]


def find_kv(kvs, key):
    for kv in kvs:
        if kv[0] == key:
            return kv
    return None


def scalar(t, text):
    if t in (T_F32, T_F64):
        return float(text)
    if t == T_BOOL:
        return text in ("1", "true")
    if t == T_STR:
        return unescape(text)
    return int(text, 0)


def arch(kvs):
    kv = find_kv(kvs, b"general.architecture")
    return kv[2].decode() if kv else ""


def select(tensors, sel, kvs):
    roles = {
        "experts": lambda n: re.search(r"_exps\.weight$", n),
        "router": lambda n: n.endswith("ffn_gate_inp.weight"),
        "norms": lambda n: n.endswith("_norm.weight"),
        "token_embd": lambda n: n == "token_embd.weight",
        "output": lambda n: n == "output.weight",
        "attn": lambda n: re.search(r"attn_(q|k|v|output)\.weight$", n),
    }
    if sel.startswith("role:"):
        f = roles.get(sel[5:])
        if not f:
            raise Bad("unknown role '%s' (%s)" % (sel[5:], ", ".join(roles)))
        picked = [t for t in tensors if f(t[0].decode("utf-8", "replace"))]
    else:
        picked = [t for t in tensors if t[0] == sel.encode()]
    if not picked:
        raise Bad("no tensor matches '%s'" % sel)
    return picked


def apply(op, arg, st):
    ver, kvs, tensors, data = st
    if op in ("set", "set-file", "rename-key", "type", "rename", "token", "dup-token",
              "token-type", "fill") and "=" not in arg:
        raise Bad("%s needs X=Y, got '%s'" % (op, arg))
    if op == "set":
        k, val = arg.split("=", 1)
        m = re.match(r"^(u8|i8|u16|i16|u32|i32|f32|bool|str|u64|i64|f64):(.*)$", val, re.S)  # a value may hold newlines
        kv = find_kv(kvs, k.encode())
        if m:
            t, val = TYPE_NAMES[m.group(1)], m.group(2)
        elif kv:
            t = kv[1]
        else:
            raise Bad("key '%s' not in the file (give TYPE:VALUE to add it)" % k)
        if t == T_ARR:
            raise Bad("key '%s' is an array" % k)
        v = scalar(t, val)
        if kv:
            kv[1], kv[2] = t, v
        else:
            kvs.append([k.encode(), t, v])
    elif op == "set-file":
        k, path = arg.split("=", 1)
        try:
            with open(path, "rb") as f:
                v = f.read()
        except OSError as e:
            raise Bad("set-file %s: cannot read %s: %s" % (k, path, e.strerror))
        kv = find_kv(kvs, k.encode())
        if kv and kv[1] != T_STR:
            raise Bad("key '%s' is not a string" % k)
        if kv:
            kv[2] = v
        else:
            kvs.append([k.encode(), T_STR, v])
    elif op == "del":
        kv = find_kv(kvs, arg.encode())
        if not kv:
            raise Bad("key '%s' not in the file" % arg)
        kvs.remove(kv)
    elif op == "rename-key":
        old, new = arg.split("=", 1)
        kv = find_kv(kvs, old.encode())
        if not kv:
            raise Bad("key '%s' not in the file" % old)
        kv[0] = unescape(new)
    elif op == "type":
        sel, tn = arg.split("=", 1)
        if tn not in GGML_TYPES:
            raise Bad("unknown ggml type '%s'" % tn)
        for t in select(tensors, sel, kvs):
            t[2] = GGML_TYPES[tn]
    elif op == "rename":
        old, new = arg.split("=", 1)
        select(tensors, old, kvs)[0][0] = unescape(new)
    elif op in ("token", "dup-token", "token-type"):
        i, val = arg.split("=", 1)
        key = b"tokenizer.ggml.token_type" if op == "token-type" else b"tokenizer.ggml.tokens"
        kv = find_kv(kvs, key)
        if not kv:
            raise Bad("no %s" % key.decode())
        items = kv[2][1]
        i = int(i)
        if not 0 <= i < len(items):
            raise Bad("token index %d outside [0, %d)" % (i, len(items)))
        if op == "token-type":
            items[i] = int(val, 0)
        else:
            items[i] = items[int(val)] if op == "dup-token" else unescape(val)
    elif op == "alignment":
        kv = find_kv(kvs, b"general.alignment")
        if kv:
            kv[1], kv[2] = T_U32, int(arg, 0)
        else:
            kvs.append([b"general.alignment", T_U32, int(arg, 0)])
    elif op == "nan-data":
        t = select(tensors, arg, kvs)[0]
        if t[2] != 0:
            raise Bad("tensor '%s' is not f32" % arg)
        n = 1
        for d in t[1]:
            n *= d
        nan = struct.pack("<f", math.nan)
        data = data[:t[3]] + nan * n + data[t[3] + 4 * n:]
    elif op == "fill":
        sel, byte = arg.split("=", 1)
        offs = sorted(t[3] for t in tensors) + [len(data)]
        for t in select(tensors, sel, kvs):
            end = next(o for o in offs if o > t[3])  # up to the next tensor (padding included)
            data = data[:t[3]] + bytes([int(byte, 0)]) * (end - t[3]) + data[end:]
    else:
        raise Bad("unknown operation '%s'" % op)
    return ver, kvs, tensors, data


def build(st):
    ver, kvs, tensors, data = st
    out = bytearray(b"GGUF" + struct.pack("<IQQ", ver, len(tensors), len(kvs)))
    for k, t, v in kvs:
        out += struct.pack("<Q", len(k)) + k + struct.pack("<I", t)
        write_val(out, t, v)
    for name, ne, typ, off in tensors:
        out += struct.pack("<Q", len(name)) + name + struct.pack("<I", len(ne))
        out += b"".join(struct.pack("<q", d) for d in ne) + struct.pack("<iQ", typ, off)
    kv = find_kv(kvs, b"general.alignment")
    align = kv[2] if kv and kv[1] == T_U32 and kv[2] > 0 else 32
    while len(out) % align:
        out += b"\0"
    return bytes(out) + data


def main(argv):
    if len(argv) < 3:
        sys.stderr.write(__doc__)
        return 2
    try:
        with open(argv[1], "rb") as f:
            st = parse(f.read())
        ops = argv[3:]
        if len(ops) % 2:
            raise Bad("operation '%s' has no argument" % ops[-1])
        for i in range(0, len(ops), 2):
            st = apply(ops[i], ops[i + 1], st)
        with open(argv[2], "wb") as f:
            f.write(build(st))
    except (Bad, OSError, ValueError) as e:
        sys.stderr.write("gguf_mutate: %s\n" % e)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
