"""Compiled row loops of :mod:`workbench.models.query`: SipHash and the open-addressing index table.

numba compiles these to machine code (cached on disk after the first call), so a
batch is one call whose loop over rows never enters the Python interpreter. The
numpy array-op version they replace needed ~30 full-array passes per SipHash
round (numpy has no fused kernels) and a dozen for the table probe.
"""

from __future__ import annotations

import numpy as np
from numba import njit

_U64 = np.uint64
# SipHash's initialisation constants ("somepseudorandomlygeneratedbytes"), each below 2**63
_C0, _C1, _C2, _C3 = 0x736F6D6570736575, 0x646F72616E646F6D, 0x6C7967656E657261, 0x7465646279746573


@njit(inline="always")
def _rotl(x, b):
    return (x << _U64(b)) | (x >> _U64(64 - b))


@njit(inline="always")
def _sip_round(v0, v1, v2, v3):
    v0 += v1
    v1 = _rotl(v1, 13) ^ v0
    v0 = _rotl(v0, 32)
    v2 += v3
    v3 = _rotl(v3, 16) ^ v2
    v0 += v3
    v3 = _rotl(v3, 21) ^ v0
    v2 += v1
    v1 = _rotl(v1, 17) ^ v2
    v2 = _rotl(v2, 32)
    return v0, v1, v2, v3


@njit(cache=True, nogil=True)
def siphash_blocks(blocks, last, k0, k1, compress, finalize):  # pragma: no cover (compiled)
    """SipHash-c-d of every row: ``blocks`` (B, W) uint64 full message blocks, ``last`` (B,) uint64
    final block (leftover bytes | length << 56), ``k0``/``k1`` the key halves. Returns (B,) uint64."""
    rows, width = blocks.shape
    out = np.empty(rows, dtype=np.uint64)
    for i in range(rows):
        v0, v1, v2, v3 = k0 ^ _U64(_C0), k1 ^ _U64(_C1), k0 ^ _U64(_C2), k1 ^ _U64(_C3)
        for j in range(width + 1):
            m = blocks[i, j] if j < width else last[i]
            v3 ^= m
            for _ in range(compress):
                v0, v1, v2, v3 = _sip_round(v0, v1, v2, v3)
            v0 ^= m
        v2 ^= _U64(0xFF)
        for _ in range(finalize):
            v0, v1, v2, v3 = _sip_round(v0, v1, v2, v3)
        out[i] = v0 ^ v1 ^ v2 ^ v3
    return out


@njit(cache=True, nogil=True)
def lookup_insert(table, bits, by_index, size, hashes, extend, mix):  # pragma: no cover (compiled)
    """Indices of ``hashes`` (N,) int64 in an open-addressing table, rows in order.

    ``table`` (2**bits, 2) int64 holds (hash, index) per slot, index -1 when
    empty; the slot of h is the top ``bits`` bits of h * ``mix`` (Fibonacci
    hashing), then linear probing. With ``extend`` an unseen hash gets index
    ``size`` (which then grows) and is written to ``by_index``; without, it
    gets the size the map had when the call began. The caller guarantees room.

    Returns:
        (N,) int64 indices and the new size.
    """
    mask = (1 << bits) - 1
    shift = _U64(64 - bits)
    start = size
    out = np.empty(hashes.shape[0], dtype=np.int64)
    for i in range(hashes.shape[0]):
        h = hashes[i]
        pos = np.int64((_U64(h) * mix) >> shift)
        while True:
            index = table[pos, 1]
            if index < 0:
                if extend:
                    table[pos, 0] = h
                    table[pos, 1] = size
                    by_index[size] = h
                    out[i] = size
                    size += 1
                else:
                    out[i] = start
                break
            if table[pos, 0] == h:
                out[i] = index
                break
            pos = (pos + 1) & mask
    return out, size
