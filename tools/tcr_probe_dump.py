"""The device's cooperative-matrix element layout as TCR's probe reads it (hc_mix.comp -D PROBE): for every lane,
which entry (row, column) of a 16 × 16 A, 16 × 8 B and 16 × 8 C each of its elements is.

    . .vkdev/enter.sh; export PYTHONPATH=$PWD:$PYTHONPATH; python3 tools/tcr_probe_dump.py
"""
import numpy as np
from dsv4_vk.vk.device import Device
from dsv4_vk.hc import tcr as mk
o = mk.tcr_probe(Device())
np.set_printoptions(linewidth=200)
for name, a, w in (("A r*16+c", o[:256].reshape(32, 8), 16), ("B k*8+n", o[256:384].reshape(32, 4), 8), ("C r*8+n", o[384:512].reshape(32, 4), 8)):
    print(name)
    for l in range(32):
        print(l, [divmod(int(v), w) for v in a[l]])
print(o[512])
