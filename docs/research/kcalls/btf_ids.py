#!/usr/bin/env python3
"""Print 'kind id name' for every FUNC (and VAR) type of /sys/kernel/btf/vmlinux."""
import struct, sys
d = open('/sys/kernel/btf/vmlinux', 'rb').read()
magic, ver, flags, hdr_len, type_off, type_len, str_off, str_len = struct.unpack_from('<HBBIIIII', d, 0)
assert magic == 0xeB9F
t0, s0 = hdr_len + type_off, hdr_len + str_off
def name(off):
    e = d.index(b'\0', s0 + off)
    return d[s0 + off:e].decode()
extra = {1: lambda v: 4, 3: lambda v: 12, 4: lambda v: 12 * v, 5: lambda v: 12 * v, 6: lambda v: 8 * v,
         13: lambda v: 8 * v, 14: lambda v: 4, 15: lambda v: 12 * v, 17: lambda v: 4, 19: lambda v: 12 * v}
p, tid, end = t0, 1, t0 + type_len
out = sys.stdout
while p < end:
    name_off, info, sz = struct.unpack_from('<III', d, p)
    kind, vlen = (info >> 24) & 0x1f, info & 0xffff
    if kind == 12:
        out.write(f'F {tid} {name(name_off)}\n')
    elif kind == 14:
        out.write(f'V {tid} {name(name_off)}\n')
    p += 12 + extra.get(kind, lambda v: 0)(vlen)
    tid += 1
