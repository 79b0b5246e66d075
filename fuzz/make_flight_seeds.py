#!/usr/bin/env python3
# Writes the flight-record seeds of fuzz/corpus/flight_record/ (the layout of FlightHeader,
# FlightGroup and FlightEntry in include/meshtrain/comm/flight_recorder.h, little-endian x86-64).
# Run from the repository root. The other files there are inputs the fuzzer found.
import struct
def rec(rank, world, groups, entries, capacity, serial):
    h = b'MTFLIGHT' + struct.pack('<iiiidQQii', 1, rank, world, 4242, 1.7e9, capacity, serial, len(groups), 0)
    h += b'node-a'.ljust(64, b'\0') + b'\0'*136
    for name, gid, size, r, ent, comp in groups:
        h += name.encode().ljust(24, b'\0') + struct.pack('<iiiiQQQ', gid, size, r, 0, ent, comp, 0)
    h += b'\0' * 64 * (16 - len(groups))
    assert len(h) == 256 + 16*64
    ring = [b'\0'*64] * capacity
    for (s, seq, start, end, nbytes, g, peer, op, state) in entries:
        ring[(s-1) % capacity] = struct.pack('<QQddQiiBB', s, seq, start, end, nbytes, g, peer, op, state) + b'\0'*14
    return h + b''.join(ring)
t=1.7e9
# rank 3 of 4: dp all-reduce done, pp send done, one send and one all-reduce pending
open('fuzz/corpus/flight_record/rank3_pending.rec','wb').write(rec(3,4,
  [('dp',1,2,1,2,1),('pp',2,2,0,0,0)],
  [(1,1,t,t+.1,4096,0,-1,0,2),(2,1,t+.2,t+.3,512,1,1,4,2),(3,2,t+.4,0,512,1,1,4,1),(4,2,t+.5,0,4096,0,-1,0,1)],8,4))
# wrapped ring, capacity 4, every op kind
ents=[(s, s, t+s, t+s+.5 if s%2 else 0, 8*s, s%3, (s%2) if s in (5,6) else -1, s%10, 1+(s%2)) for s in range(5,9)]
open('fuzz/corpus/flight_record/rank0_wrapped.rec','wb').write(rec(0,2,
  [('tp',0,2,0,8,7),('world',0,2,0,3,3),('embedding',0,2,1,0,0)], ents, 4, 8))
open("fuzz/corpus/flight_record/empty_ring.rec","wb").write(rec(0,1,[],[],1,0))
